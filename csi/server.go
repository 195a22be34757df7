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
	"sort"
	"strings"
	"sync"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
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
	// Kernels are the kernel cache versions the volume shows under
	// kernels/<name>/ (kernelCaches: auto); the Backend fills them.
	Kernels []KernelCache `json:"kernels,omitempty"`
	// Private: the artifact is private to some namespaces, and the volume
	// mounts a tree of its own (the version's tree is root's only); the
	// Backend fills it.
	Private      bool   `json:"private,omitempty"`
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
			continue
		}
		if err := d.backend.Release(ctx, v.ID); err != nil {
			d.log.Error("csi: releasing the hold of a volume no longer mounted", "volume", v.ID, "err", err)
			continue
		}
		d.log.Info("csi: released the hold of a volume no longer mounted", "volume", v.ID, "target", v.Target, "artifact", v.Model, "revision", v.Revision)
	}
	if len(vols) > 0 {
		d.log.Info("csi: recorded volumes", "mounted", kept, "released", len(vols)-kept)
	}
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

// volumeFrom validates a publish request into a Volume.
func (d *Driver) volumeFrom(req *csipb.NodePublishVolumeRequest) (Volume, error) {
	v := Volume{ID: req.GetVolumeId(), Target: req.GetTargetPath()}
	if v.ID == "" {
		return v, status.Error(codes.InvalidArgument, "volume_id is empty")
	}
	if v.Target == "" {
		return v, status.Error(codes.InvalidArgument, "target_path is empty")
	}
	capa := req.GetVolumeCapability()
	if capa == nil {
		return v, status.Error(codes.InvalidArgument, "volume_capability is missing")
	}
	if capa.GetBlock() != nil {
		return v, status.Error(codes.InvalidArgument, "volume_capability: block access is not supported; "+DriverName+" mounts a read-only directory")
	}
	if req.GetStagingTargetPath() != "" {
		return v, status.Error(codes.InvalidArgument, "staging_target_path: "+DriverName+" does not stage volumes")
	}
	if err := d.validTarget(v.Target); err != nil {
		return v, err
	}
	attrs := req.GetVolumeContext()
	fields := map[string]*string{AttrModelCache: &v.Model, AttrRevision: &v.Revision, AttrKernelCaches: &v.KernelCaches,
		attrPodName: &v.PodName, attrPodNamespace: &v.PodNamespace, attrPodUID: &v.PodUID}
	var unknown []string
	for k, val := range attrs {
		if f, ok := fields[k]; ok {
			*f = val
			continue
		}
		switch k {
		case attrEphemeral:
			if val != "true" {
				return v, status.Errorf(codes.InvalidArgument, "%s=%q: %s serves inline ephemeral volumes only (volumeLifecycleModes: [Ephemeral]); declare the volume in the pod's spec.volumes[].csi", attrEphemeral, val, DriverName)
			}
		default:
			if !strings.HasPrefix(k, attrKubelet) {
				unknown = append(unknown, k)
			}
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return v, status.Errorf(codes.InvalidArgument, "volumeAttributes: unknown %s; %s takes %s, %s and %s", strings.Join(unknown, ", "), DriverName, AttrModelCache, AttrRevision, AttrKernelCaches)
	}
	if v.Model == "" {
		return v, status.Errorf(codes.InvalidArgument, "volumeAttributes.%s is missing: name the ModelCache (or local artifact) to mount", AttrModelCache)
	}
	if len(v.Model) > 253 || strings.ContainsAny(v.Model, "/\\:@\x00") || v.Model == "." || v.Model == ".." {
		return v, status.Errorf(codes.InvalidArgument, "volumeAttributes.%s %q: not an artifact name", AttrModelCache, v.Model)
	}
	if v.Revision != "" && (len(v.Revision) > 256 || strings.ContainsAny(v.Revision, "/\\\x00") || v.Revision == "." || v.Revision == ".." || v.Revision == "current") {
		return v, status.Errorf(codes.InvalidArgument, "volumeAttributes.%s %q: not a revision (give a commit, digest or version the node holds, or leave it out for the current one)", AttrRevision, v.Revision)
	}
	switch v.KernelCaches {
	case "", "none":
		v.KernelCaches = "none"
	case "auto":
	default:
		return v, status.Errorf(codes.InvalidArgument, "volumeAttributes.%s %q: use auto or none", AttrKernelCaches, v.KernelCaches)
	}
	return v, nil
}

// validTarget: absolute, clean (no ".."), strictly under the pods
// directory, by its name; openTarget then resolves it.
func (d *Driver) validTarget(target string) error {
	if !filepath.IsAbs(target) || filepath.Clean(target) != target || strings.Contains(target, "/../") {
		return status.Errorf(codes.InvalidArgument, "target_path %q: want a clean absolute path under %s", target, d.cfg.PodsDir)
	}
	if !under(d.cfg.PodsDir, target) {
		return status.Errorf(codes.InvalidArgument, "target_path %q: not under kubelet's pods directory %s", target, d.cfg.PodsDir)
	}
	return nil
}

// openTarget resolves a valid target's parent once, beneath the pods
// directory and through no symlink (target); every later step uses the
// descriptor. NotFound when the parent is missing (kubelet makes it).
func (d *Driver) openTarget(path string) (*target, error) {
	t, err := openTarget(d.cfg.PodsDir, path)
	if err != nil {
		return nil, d.targetError(path, err)
	}
	return t, nil
}

// targetError maps the kernel's answer about a target to the code
// kubelet sees.
func (d *Driver) targetError(path string, err error) error {
	var pe *podsDirError
	switch {
	case errors.As(err, &pe):
		return status.Errorf(codes.FailedPrecondition, "pods directory %s: %v", d.cfg.PodsDir, pe.err)
	case errors.Is(err, unix.ENOENT):
		return status.Errorf(codes.NotFound, "target_path %q: its parent does not exist", path)
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EXDEV):
		return status.Errorf(codes.InvalidArgument, "target_path %q: resolves outside kubelet's pods directory %s, or through a symlink (%v)", path, d.cfg.PodsDir, err)
	}
	return status.Errorf(codes.Internal, "target_path %q: %v", path, err)
}

// targetMounted says whether something is mounted at path, resolved as
// publish resolves it; false when it or its parent is gone.
func (d *Driver) targetMounted(path string) (bool, error) {
	t, err := openTarget(d.cfg.PodsDir, path)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer t.Close()
	return t.mounted()
}

func under(dir, p string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../")
}

// NodePublishVolume bind-mounts the held revision read-only at the target.
func (d *Driver) NodePublishVolume(ctx context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	v, err := d.volumeFrom(req)
	if err != nil {
		return nil, err
	}
	defer d.targets.lock(v.Target)()
	t, err := d.openTarget(v.Target)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	mounted, err := t.mounted()
	if err != nil {
		return nil, d.targetError(v.Target, err)
	}
	if mounted {
		// Published before (kubelet retries): the same volume is a success;
		// anything else mounted there is not ours to stack on.
		return nil, d.publishedBefore(v)
	}
	if err := d.heldElsewhere(ctx, v); err != nil {
		return nil, err
	}
	rev, tree, err := d.backend.Hold(ctx, v)
	if err != nil {
		if _, ok := status.FromError(err); !ok {
			err = status.Error(codes.Internal, err.Error())
		}
		return nil, err
	}
	if err := d.mount(t, tree); err != nil {
		if rerr := d.backend.Release(ctx, v.ID); rerr != nil {
			d.log.Error("csi: releasing a hold after a failed mount", "volume", v.ID, "err", rerr)
		}
		if errors.Is(err, errMounted) {
			return nil, status.Errorf(codes.AlreadyExists, "target_path %q: %v", v.Target, err)
		}
		return nil, status.Errorf(codes.Internal, "mounting %s@%s at %s: %v", v.Model, rev, v.Target, err)
	}
	d.log.Info("csi: published", "volume", v.ID, "artifact", v.Model, "revision", rev, "pod", v.PodNamespace+"/"+v.PodName, "target", v.Target)
	return &csipb.NodePublishVolumeResponse{}, nil
}

// publishedBefore answers a publish whose target is mounted already:
// nil (success) when the mount is this volume's, AlreadyExists otherwise.
func (d *Driver) publishedBefore(v Volume) error {
	held, err := d.backend.Holds()
	if err != nil {
		return status.Errorf(codes.Internal, "reading holds: %v", err)
	}
	for _, h := range held {
		if h.ID == v.ID && h.Target == v.Target {
			if h.Model != v.Model || (v.Revision != "" && v.Revision != h.Revision) {
				return status.Errorf(codes.AlreadyExists, "volume %s is already published at %s with %s@%s", v.ID, v.Target, h.Model, h.Revision)
			}
			return nil
		}
	}
	return status.Errorf(codes.AlreadyExists, "target_path %q: something else is mounted there", v.Target)
}

// heldElsewhere refuses a volume ID held for another target that is
// still mounted (FailedPrecondition): an inline volume has one target,
// and a second mount under its one hold would be left unheld when the
// first target is unpublished. A hold whose target is no longer mounted
// is released, and the publish holds afresh for its own target.
func (d *Driver) heldElsewhere(ctx context.Context, v Volume) error {
	held, err := d.backend.Holds()
	if err != nil {
		return status.Errorf(codes.Internal, "reading holds: %v", err)
	}
	for _, h := range held {
		if h.ID != v.ID || h.Target == v.Target {
			continue
		}
		if mounted, err := d.targetMounted(h.Target); err != nil || mounted {
			return status.Errorf(codes.FailedPrecondition, "volume %s is published at %s; one volume mounts at one target (unpublish it there first)", v.ID, h.Target)
		}
		if err := d.backend.Release(ctx, h.ID); err != nil {
			return status.Errorf(codes.Internal, "releasing the hold of volume %s, no longer mounted at %s: %v", h.ID, h.Target, err)
		}
	}
	return nil
}

// mount creates the target directory (its parent exists: kubelet made
// it) and bind-mounts tree there read-only; on failure nothing is left.
func (d *Driver) mount(t *target, tree string) error {
	created, err := t.mkdir()
	if err != nil {
		return err
	}
	d.mountMu.Lock()
	err = t.bindReadOnly(d.log, tree)
	d.mountMu.Unlock()
	if err != nil && created {
		t.rmdir()
	}
	return err
}

// NodeUnpublishVolume unmounts the target, removes it and releases the
// hold; a target already gone is a success.
func (d *Driver) NodeUnpublishVolume(ctx context.Context, req *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is empty")
	}
	if target == "" {
		return nil, status.Error(codes.InvalidArgument, "target_path is empty")
	}
	if err := d.validTarget(target); err != nil {
		return nil, err
	}
	defer d.targets.lock(target)()
	t, err := d.openTarget(target)
	switch {
	case status.Code(err) == codes.NotFound: // its parent is gone: nothing is mounted there
	case err != nil:
		return nil, err
	default:
		defer t.Close()
		// Each round unmounts the mount on top (a stack left by an older
		// driver comes off whole).
		for i := 0; ; i++ {
			more, err := t.unmountTop()
			if err != nil {
				return nil, d.targetError(target, err)
			}
			if !more {
				break
			}
			if i == 100 {
				return nil, status.Errorf(codes.Internal, "target_path %q: still mounted after %d unmounts", target, i+1)
			}
		}
		if err := t.rmdir(); err != nil {
			return nil, status.Errorf(codes.Internal, "removing %s: %v", target, err)
		}
	}
	if err := d.backend.Release(ctx, id); err != nil {
		return nil, status.Errorf(codes.Internal, "releasing the hold of volume %s: %v", id, err)
	}
	// A hold rediscovered from the mount table may carry another ID than
	// kubelet's (its vol_data.json was gone): the target names it too.
	held, err := d.backend.Holds()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "reading holds: %v", err)
	}
	for _, h := range held {
		if h.Target == target && h.ID != id {
			if err := d.backend.Release(ctx, h.ID); err != nil {
				return nil, status.Errorf(codes.Internal, "releasing the hold of volume %s at %s: %v", h.ID, target, err)
			}
		}
	}
	d.log.Info("csi: unpublished", "volume", id, "target", target)
	return &csipb.NodeUnpublishVolumeResponse{}, nil
}
