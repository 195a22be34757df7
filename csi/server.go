package csi

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	regpb "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// DriverName is the CSI driver's name, as the CSIDriver object and pods
// name it.
const DriverName = "csi.modelcache.io"

// Volume attributes a pod may set, and those kubelet adds (podInfoOnMount).
const (
	AttrModelCache   = "modelCache"
	AttrRevision     = "revision"
	AttrKernelCaches = "kernelCaches"
	AttrWarm         = "warm"

	attrPodName      = "csi.storage.k8s.io/pod.name"
	attrPodNamespace = "csi.storage.k8s.io/pod.namespace"
	attrPodUID       = "csi.storage.k8s.io/pod.uid"
	attrEphemeral    = "csi.storage.k8s.io/ephemeral"
	attrKubelet      = "csi.storage.k8s.io/" // every key kubelet adds starts so
)

// Volume is one published volume: what the pod asked for and where it is
// mounted. Revision is empty in a request for the current one; the
// Backend fills the one it holds.
type Volume struct {
	ID           string `json:"volumeId"`
	Target       string `json:"target"`
	Model        string `json:"modelCache"`
	Revision     string `json:"revision,omitempty"`
	KernelCaches string `json:"kernelCaches,omitempty"`
	// Warm is "true" (the default) or "false": whether the node reads
	// the revision into the page cache ahead of the pod.
	Warm string `json:"warm,omitempty"`
	// Kernels are the kernel cache versions the volume shows under
	// kernels/<name>/ (kernelCaches: auto); the Backend fills them.
	Kernels []KernelCache `json:"kernels,omitempty"`
	// Private: the artifact is private to some namespaces, and the volume
	// mounts a tree of its own (the version's tree is root's only); the
	// Backend fills it.
	Private bool `json:"private,omitempty"`
	// Writable is the size of the volume's writable kernel cache layer
	// (volumeAttributes.kernelCacheWritable; 0: the volume is read-only).
	Writable     int64  `json:"kernelCacheWritable,omitempty"`
	PodNamespace string `json:"podNamespace,omitempty"`
	PodName      string `json:"podName,omitempty"`
	PodUID       string `json:"podUID,omitempty"`
}

// KernelCache is one kernel cache version a volume shows.
type KernelCache struct {
	Name     string `json:"name"`
	Revision string `json:"revision"`
}

// Backend is what the driver needs of the daemon. Its methods are called
// concurrently.
type Backend interface {
	// Hold resolves v to one exact Ready revision, records that v holds
	// it (durably, until Release), and returns the revision and the
	// directory of its tree. A second call for the same v.ID returns what
	// the first held. Errors are gRPC status errors (Unavailable while
	// the model downloads, FailedPrecondition when it failed, NotFound,
	// PermissionDenied for a pod whose namespace may not mount it,
	// InvalidArgument naming the attribute).
	Hold(ctx context.Context, v Volume) (rev, tree string, err error)
	// Release drops the hold of volume id; an unknown id is no error.
	Release(ctx context.Context, id string) error
	// Holds lists the recorded volumes, revisions filled.
	Holds() ([]Volume, error)
}

// LayerKeeper is what a Backend implements to keep a volume's writable
// layer past the volume (for a capture after the pod is gone).
type LayerKeeper interface {
	// KeepLayer is called at the unpublish of volume id, once nothing
	// mounts its overlay and before its layer is removed, with the
	// layer's upper directory: what the pod wrote, written by a tenant
	// (links, devices, sparse or huge files, hard links; overlayfs's
	// whiteouts). It copies what it keeps, following no link; the layer is
	// removed once it returns. An error is logged and the unpublish goes on.
	KeepLayer(ctx context.Context, id, upper string) error
}

// Config places the driver. Socket is required; the rest default.
type Config struct {
	// Socket is the CSI endpoint (a unix socket path), as kubelet will
	// dial it: /var/lib/kubelet/plugins/csi.modelcache.io/csi.sock.
	Socket string
	// RegistrationDir is kubelet's plugin watcher directory
	// (/var/lib/kubelet/plugins_registry); "" = do not register (tests,
	// or a node-driver-registrar that does it).
	RegistrationDir string
	// PodsDir is kubelet's pods directory: every target path must lie
	// under it. Default /var/lib/kubelet/pods.
	PodsDir string
	// NodeID is what NodeGetInfo reports: the node's name. Default the
	// hostname.
	NodeID string
	// WritableDir holds the writable layers of volumes that ask for a
	// writable kernel cache (writable.go). Default: writable/ beside
	// the socket.
	WritableDir string
	// Version is reported by GetPluginInfo.
	Version string
	Logger  *slog.Logger // nil = silent
}

// DefaultPodsDir is kubelet's pods directory.
const DefaultPodsDir = "/var/lib/kubelet/pods"

// Validate checks the config.
func (c *Config) Validate() error {
	var errs []error
	if c.Socket == "" || !filepath.IsAbs(c.Socket) {
		errs = append(errs, fmt.Errorf("--csi-socket %q: want an absolute path, e.g. /var/lib/kubelet/plugins/%s/csi.sock", c.Socket, DriverName))
	} else if len(c.Socket) > 107 {
		errs = append(errs, fmt.Errorf("--csi-socket %q is %d bytes; unix socket paths must be shorter than 108", c.Socket, len(c.Socket)))
	}
	if c.PodsDir != "" && (!filepath.IsAbs(c.PodsDir) || filepath.Clean(c.PodsDir) != c.PodsDir) {
		errs = append(errs, fmt.Errorf("--csi-pods-dir %q: want a clean absolute directory, e.g. %s", c.PodsDir, DefaultPodsDir))
	}
	if c.RegistrationDir != "" && !filepath.IsAbs(c.RegistrationDir) {
		errs = append(errs, fmt.Errorf("--csi-registration-dir %q: want an absolute directory, e.g. /var/lib/kubelet/plugins_registry", c.RegistrationDir))
	}
	return errors.Join(errs...)
}

// Driver serves the CSI Identity and Node services. Create it with New.
type Driver struct {
	cfg     Config
	log     *slog.Logger
	backend Backend

	// targets serialises the calls for one target path (kubelet's
	// retries, a publish and its unpublish); calls for other targets run
	// alongside, however long one's Backend.Hold takes (a composed tree
	// of a large kernel cache).
	targets keyedMutex
	// mountMu is held across each check-then-mount (target.bindReadOnly),
	// a few syscalls: two targets that name one directory (through a
	// rename between their calls) get one mount, not two stacked.
	mountMu sync.Mutex

	csipb.UnimplementedIdentityServer
	csipb.UnimplementedNodeServer
}

// New returns a driver over b; cfg is validated and defaulted.
func New(cfg Config, b Backend) (*Driver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.PodsDir == "" {
		cfg.PodsDir = DefaultPodsDir
	}
	if cfg.WritableDir == "" {
		cfg.WritableDir = filepath.Join(filepath.Dir(cfg.Socket), "writable")
	}
	if cfg.NodeID == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("csi node id: %w; set NODE_NAME", err)
		}
		cfg.NodeID = h
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Driver{cfg: cfg, log: log, backend: b}, nil
}

// Register adds the driver's services to s (tests add a fake controller
// beside them).
func (d *Driver) Register(s *grpc.Server) {
	csipb.RegisterIdentityServer(s, d)
	csipb.RegisterNodeServer(s, d)
}

// Serve reconciles recorded holds with the mounts, then serves the CSI
// socket (and the registration socket, when configured) until ctx ends.
// A stale socket file is replaced; anything else at the path is an error.
func (d *Driver) Serve(ctx context.Context) error {
	d.Reconcile(ctx)
	ln, err := listenUnix(d.cfg.Socket)
	if err != nil {
		return fmt.Errorf("--csi-socket: %w", err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(d.logCalls))
	d.Register(srv)
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	var reg *grpc.Server
	if d.cfg.RegistrationDir != "" {
		path := filepath.Join(d.cfg.RegistrationDir, DriverName+"-reg.sock")
		rln, err := listenUnix(path)
		if err != nil {
			srv.Stop()
			return fmt.Errorf("--csi-registration-dir: %w", err)
		}
		reg = grpc.NewServer()
		regpb.RegisterRegistrationServer(reg, &registration{endpoint: d.cfg.Socket, log: d.log})
		go func() { errc <- reg.Serve(rln) }()
		defer os.Remove(path) // kubelet's watcher deregisters the plugin when its socket goes
	}
	d.log.Info("csi driver serving", "socket", d.cfg.Socket, "registration_dir", d.cfg.RegistrationDir, "pods_dir", d.cfg.PodsDir, "node", d.cfg.NodeID)
	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	srv.GracefulStop()
	if reg != nil {
		reg.Stop()
	}
	os.Remove(d.cfg.Socket)
	return serveErr
}

// logCalls logs failed calls and makes their messages safe for kubelet,
// which passes them to its event recorder as format strings: a '%' in a
// message ("41%," or a URL's "%2F") shows in kubectl describe as
// "%!,(MISSING)". Each '%' becomes "pct".
func (d *Driver) logCalls(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	resp, err := h(ctx, req)
	if err != nil {
		st := status.Convert(err)
		d.log.Info("csi call failed", "method", info.FullMethod, "code", st.Code().String(), "err", st.Message())
		if strings.Contains(st.Message(), "%") {
			err = status.Error(st.Code(), strings.ReplaceAll(st.Message(), "%", "pct"))
		}
	}
	return resp, err
}

// listenUnix listens at path, replacing a socket nobody answers on.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&fs.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket; move it aside", path)
		}
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("%s: another process serves it (is another modelcached running?)", path)
		}
		os.Remove(path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	// Only kubelet (root) may call the driver: a local user who could
	// would mount models over pods' volumes and hold revisions at will.
	// The mode is set whatever the daemon's umask was.
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// Reconcile drops the hold of every recorded volume whose target is no
// longer a mount point. It is what Serve runs first; exported for tests.
func (d *Driver) Reconcile(ctx context.Context) {
	vols, err := d.backend.Holds()
	if err != nil {
		d.log.Error("csi: reading recorded volumes", "err", err)
		return
	}
	kept := 0
	keepLayer := map[string]bool{}
	for _, v := range vols {
		mounted, err := d.targetMounted(v.Target)
		if err != nil {
			// Not resolvable beneath the pods directory (a symlink on
			// the way): whether it is mounted cannot be told; kept.
			d.log.Warn("csi: cannot tell whether a recorded volume is still mounted; its hold is kept", "volume", v.ID, "target", v.Target, "err", err)
			kept++
			continue
		}
		if mounted {
			kept++
			keepLayer[filepath.Base(d.layerDir(v.ID))] = true
			continue
		}
		d.keepLayer(ctx, v.ID) // its pod went while the daemon was down: its layer may still be there
		if err := d.backend.Release(ctx, v.ID); err != nil {
			d.log.Error("csi: releasing the hold of a volume no longer mounted", "volume", v.ID, "err", err)
			continue
		}
		d.log.Info("csi: released the hold of a volume no longer mounted", "volume", v.ID, "target", v.Target, "artifact", v.Model, "revision", v.Revision)
	}
	if len(vols) > 0 {
		d.log.Info("csi: recorded volumes", "mounted", kept, "released", len(vols)-kept)
	}
	d.removeStaleLayers(keepLayer)
}

// GetPluginInfo names the driver.
func (d *Driver) GetPluginInfo(context.Context, *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	v := d.cfg.Version
	if v == "" {
		v = "dev"
	}
	return &csipb.GetPluginInfoResponse{Name: DriverName, VendorVersion: v}, nil
}

// GetPluginCapabilities: a node plugin only, no controller service.
func (d *Driver) GetPluginCapabilities(context.Context, *csipb.GetPluginCapabilitiesRequest) (*csipb.GetPluginCapabilitiesResponse, error) {
	return &csipb.GetPluginCapabilitiesResponse{}, nil
}

// Probe: ready whenever it answers.
func (d *Driver) Probe(context.Context, *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	return &csipb.ProbeResponse{}, nil
}

// NodeGetCapabilities: none beyond publish/unpublish (no staging, no stats).
func (d *Driver) NodeGetCapabilities(context.Context, *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	return &csipb.NodeGetCapabilitiesResponse{}, nil
}

// NodeGetInfo reports the node's name.
func (d *Driver) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	return &csipb.NodeGetInfoResponse{NodeId: d.cfg.NodeID}, nil
}

// registration answers kubelet's plugin watcher.
type registration struct {
	regpb.UnimplementedRegistrationServer
	endpoint string
	log      *slog.Logger
}

func (r *registration) GetInfo(context.Context, *regpb.InfoRequest) (*regpb.PluginInfo, error) {
	return &regpb.PluginInfo{Type: regpb.CSIPlugin, Name: DriverName, Endpoint: r.endpoint, SupportedVersions: []string{"1.0.0"}}, nil
}

func (r *registration) NotifyRegistrationStatus(_ context.Context, st *regpb.RegistrationStatus) (*regpb.RegistrationStatusResponse, error) {
	if st.GetPluginRegistered() {
		r.log.Info("csi: kubelet registered the driver", "driver", DriverName)
	} else {
		r.log.Error("csi: kubelet refused the driver's registration", "driver", DriverName, "err", st.GetError())
	}
	return &regpb.RegistrationStatusResponse{}, nil
}
