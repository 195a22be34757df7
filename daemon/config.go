package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/csi"
	"github.com/modelcache/modelcache/daemon/capacity"
	"github.com/modelcache/modelcache/daemon/fanout"
	"github.com/modelcache/modelcache/daemon/sources"
	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/k8ssync"
	"github.com/modelcache/modelcache/warm"
)

// Config is everything modelcached is told at start. Zero fields take the
// defaults of DefaultConfig; Validate says what is wrong and how to fix it.
type Config struct {
	Root               string        // store root
	Socket             string        // unix socket of the API
	SocketMode         fs.FileMode   // permission bits of the socket
	SocketGroup        string        // group that may mutate (and own the socket); "" = none
	SystemdSocket      bool          // require the listener from systemd socket activation
	MetricsAddr        string        // TCP address of /metrics and /healthz; "" = off
	ModelsDir          string        // YAML desires, watched; a missing dir means none
	MaxConcurrentPulls int           // artifacts pulled at once
	FilesPerPull       int           // files of one artifact fetched at once
	DirectIO           bool          // write blobs with O_DIRECT where possible
	WriteBufferSize    int64         // each of a blob writer's two buffers (cachestore.WithWriteBuffer)
	RetryInitial       time.Duration // first delay after a failed pull
	RetryMax           time.Duration // cap of the delay between pull attempts
	IdleTimeout        time.Duration // a stream that delivers nothing this long is retried
	BandwidthLimit     int64         // bytes/s over all pulls; 0 = unlimited
	RangeConnections   int           // the most connections per large hub, NGC or S3 file (fetchers.AdaptiveReader)
	Xet                bool          // hf:// files rebuilt from the Hub's Xet store where offered (xetchunks.go); a desire's xet: false overrides
	InsecureRegistries []string      // OCI registries (host:port) reached over plain HTTP
	RegistryMirrors    []string      // "registry=mirror": pulls from registry try mirror first
	Capacity           capacity.Policy
	CapacityInterval   time.Duration // how often the in-use scan and an eviction pass run
	GPUInventory       string        // a JSON file describing a simulated node; "" = NVML
	// FileRoots, when set, are the only directories file:// sources may
	// come from, whoever asks (root, models.d and the cluster included).
	// Empty: a socket pull reads any path its requester may read (its own
	// uid and groups, whatever the daemon may), a models.d file any path
	// FileIdentity may read, and a ModelCache's file:// source is refused.
	// Whatever they say, kubelet's directories and the daemon's own state
	// are never read (fileDenied).
	FileRoots []string
	// FileIdentity is who file:// sources of models.d files and ModelCache
	// objects are read as: "UID:GID", numeric. "" = nobody (65534:65534)
	// when the daemon is root, the daemon's own uid and gid otherwise;
	// "0:0" reads as root. A socket pull reads as its requester.
	FileIdentity string
	// ConfigFile is the daemon's config file, if any; file:// never
	// reads it.
	ConfigFile string
	// KernelCacheSignaturePolicy is the node's policy for kernel cache
	// signatures, required (the default) or off: the default of every
	// desire and the floor of socket requests, which may tighten it but
	// never turn it off.
	KernelCacheSignaturePolicy string

	// What one peer of the API socket may hold: open connections per peer
	// uid (SO_PEERCRED; 0: no limit; root and the daemon's own uid are never
	// limited), the time to send a request's headers and body, the time a
	// connection may sit between requests, and the time one response write
	// (a stream's line) may wait for the peer to read it.
	MaxConnectionsPerUID int
	SocketReadTimeout    time.Duration
	SocketIdleTimeout    time.Duration
	SocketWriteTimeout   time.Duration

	// ProgressFloor is the least a stream must deliver in each
	// ProgressWindow of time spent reading it; less fails the attempt as
	// too slow (it is retried, with the pull's slot given up meanwhile).
	// 0 turns the floor off.
	ProgressFloor  int64
	ProgressWindow time.Duration
	// Warm reads what a pod is about to load into the page cache ahead of
	// it (warming.go): on CSI publish, wait, lease and modelctl warm.
	// WarmShare is the share of MemAvailable all running warms may fill,
	// WarmLimit a cap in bytes over them (0: none beyond the share).
	Warm      bool
	WarmShare float64
	WarmLimit int64
	// Cluster, when set, syncs with Kubernetes (ModelCache objects become
	// desires, this node's status is written); nil: standalone.
	Cluster *k8ssync.Config
	// CSI, when set, serves the CSI node plugin (csi.go); nil: off.
	CSI *csi.Config
	// KeptLayers bound the writable kernel cache layers kept past their
	// volumes for capture (kept.go); zero fields take the defaults.
	KeptLayers KeptLimits
	// Peer, when set, serves this node's committed blobs to the other
	// daemons of the cluster and fetches blobs from them before the
	// origin (package fanout: fanout.Config); nil: off.
	Peer    *PeerConfig
	Logger  *slog.Logger // nil = silent
	Version string       // reported by status and metrics
	// Hook is called at the store's named commit points, and at the
	// daemon's own ("layer.check-from-blob"); for crash and path tests.
	Hook func(point string)
	// InternalAddress reports which addresses a redirect may not lead to
	// (fetchers.Guard); nil = fetchers.IsInternal. For tests, which stand
	// a loopback alias in for a remote server.
	InternalAddress func(netip.Addr) bool
}

// DefaultConfig is what a systemd unit gets.
func DefaultConfig() Config {
	return Config{
		Root:               "/var/lib/modelcache",
		Socket:             api.DefaultSocket,
		SocketMode:         0o666,
		SocketGroup:        "modelcache",
		MetricsAddr:        ":9477",
		ModelsDir:          "/etc/modelcached/models.d",
		MaxConcurrentPulls: 2,
		FilesPerPull:       4,
		DirectIO:           true,
		WriteBufferSize:    cachestore.DefaultWriteBuffer,
		RetryInitial:       5 * time.Second,
		RetryMax:           10 * time.Minute,
		IdleTimeout:        60 * time.Second,
		ProgressFloor:      1 << 20, // 1 MiB a minute, about 17 KiB/s
		ProgressWindow:     time.Minute,
		RangeConnections:   4,
		Xet:                true,
		Capacity:           capacity.DefaultPolicy(),
		CapacityInterval:   10 * time.Second,
		Version:            "dev",
		Warm:               true,
		WarmShare:          warm.DefaultShare,

		KernelCacheSignaturePolicy: api.PolicyRequired,
		MaxConnectionsPerUID:       64,
		SocketReadTimeout:          10 * time.Second,
		SocketIdleTimeout:          60 * time.Second,
		SocketWriteTimeout:         30 * time.Second,
	}
}

// Validate checks the config; it looks nothing up (New resolves the socket
// group).
func (c *Config) Validate() error {
	var errs []error
	if c.Root == "" {
		errs = append(errs, errors.New("--root is empty; give the store directory, e.g. /var/lib/modelcache"))
	}
	if c.Socket == "" {
		errs = append(errs, errors.New("--socket is empty; give a path such as /run/modelcached/modelcached.sock"))
	} else if len(c.Socket) > 107 {
		errs = append(errs, fmt.Errorf("--socket %q is %d bytes; unix socket paths must be shorter than 108", c.Socket, len(c.Socket)))
	}
	if c.SocketMode&^0o777 != 0 || c.SocketMode&0o600 != 0o600 {
		errs = append(errs, fmt.Errorf("--socket-mode %#o: want permission bits that include 0600, e.g. 0666 or 0660 (octal, as chmod reads them: in a config file write socket-mode: \"0660\", not a decimal number)", c.SocketMode))
	}
	if c.MaxConnectionsPerUID < 0 {
		errs = append(errs, fmt.Errorf("--max-connections-per-uid %d: want >= 0 (0: no limit)", c.MaxConnectionsPerUID))
	}
	for _, t := range []struct {
		flag string
		d    time.Duration
	}{{"--socket-read-timeout", c.SocketReadTimeout}, {"--socket-idle-timeout", c.SocketIdleTimeout}, {"--socket-write-timeout", c.SocketWriteTimeout}} {
		if t.d <= 0 {
			errs = append(errs, fmt.Errorf("%s %s: want > 0, e.g. 30s", t.flag, t.d))
		}
	}
	if c.MaxConcurrentPulls < 1 || c.MaxConcurrentPulls > 64 {
		errs = append(errs, fmt.Errorf("--max-concurrent-pulls %d: want 1..64", c.MaxConcurrentPulls))
	}
	if c.FilesPerPull < 1 || c.FilesPerPull > 64 {
		errs = append(errs, fmt.Errorf("files per pull %d: want 1..64", c.FilesPerPull))
	}
	if c.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			errs = append(errs, fmt.Errorf("--metrics-addr %q: %v; write host:port or :port", c.MetricsAddr, err))
		}
	}
	if c.RetryInitial <= 0 || c.RetryMax < c.RetryInitial {
		errs = append(errs, fmt.Errorf("retry delays %s..%s: want 0 < initial <= max", c.RetryInitial, c.RetryMax))
	}
	if err := c.Capacity.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("capacity policy: %w", err))
	}
	if c.CapacityInterval <= 0 {
		errs = append(errs, fmt.Errorf("--capacity-interval %s: want > 0", c.CapacityInterval))
	}
	for _, m := range c.RegistryMirrors {
		if r, mir, ok := strings.Cut(m, "="); !ok || r == "" || mir == "" {
			errs = append(errs, fmt.Errorf("--registry-mirror %q: want registry=mirror, e.g. docker.io=mirror.local:5000", m))
		}
	}
	switch c.KernelCacheSignaturePolicy {
	case "", api.PolicyRequired, api.PolicyOff:
	default:
		errs = append(errs, fmt.Errorf("--kernel-cache-signature-policy %q: use required or off", c.KernelCacheSignaturePolicy))
	}
	for _, r := range c.FileRoots {
		if !filepath.IsAbs(r) || filepath.Clean(r) != r {
			errs = append(errs, fmt.Errorf("--file-roots %q: want a clean absolute directory, e.g. /srv/models", r))
		}
	}
	if c.FileIdentity != "" {
		if _, err := parseIdentity(c.FileIdentity); err != nil {
			errs = append(errs, err)
		}
	}
	if c.ProgressFloor < 0 || (c.ProgressFloor > 0 && c.ProgressWindow <= 0) {
		errs = append(errs, fmt.Errorf("--progress-floor %d per --progress-window %s: want a floor >= 0 (0 = off) and a window > 0, e.g. 1Mi per 1m", c.ProgressFloor, c.ProgressWindow))
	}
	if c.CSI != nil {
		if err := c.CSI.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := cachestore.ValidWriteBuffer(c.WriteBufferSize); err != nil {
		errs = append(errs, fmt.Errorf("--write-buffer-size: %w", err))
	}
	if c.Peer != nil {
		if err := c.Peer.Validate(c.Cluster != nil); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Warm && !(c.WarmShare > 0 && c.WarmShare <= 1) {
		errs = append(errs, fmt.Errorf("--warm-share %v: want a share of MemAvailable in (0, 1], e.g. %v; turn warming off with --warm=false", c.WarmShare, warm.DefaultShare))
	}
	if c.WarmLimit < 0 {
		errs = append(errs, fmt.Errorf("--warm-limit %d: want bytes >= 0, or a size such as 8Gi (0: no cap beyond --warm-share)", c.WarmLimit))
	}
	if c.BandwidthLimit < 0 {
		errs = append(errs, fmt.Errorf("--bandwidth-limit %d: want >= 0", c.BandwidthLimit))
	}
	return errors.Join(errs...)
}

// parseIdentity reads --file-identity: UID:GID, numeric.
func parseIdentity(s string) (*fetchers.Identity, error) {
	u, g, ok := strings.Cut(s, ":")
	uid, err1 := strconv.ParseUint(u, 10, 32)
	gid, err2 := strconv.ParseUint(g, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return nil, fmt.Errorf("--file-identity %q: want UID:GID, numeric, e.g. 65534:65534 (nobody) or the uid and gid that own your models", s)
	}
	return &fetchers.Identity{UID: uint32(uid), GID: uint32(gid)}, nil
}

// sourcesConfig is what package sources needs of c; the socket API's
// codes of errors are toAPIError's; the Xet decision is hfXetOptions's,
// with st's chunks.
func (c *Config) sourcesConfig(st *cachestore.Store) sources.Config {
	return sources.Config{FileRoots: c.FileRoots, FileDenied: c.fileDenied(), FileAs: c.fileIdentity(),
		InsecureRegistries: c.InsecureRegistries, RegistryMirrors: c.RegistryMirrors, InternalAddress: c.InternalAddress,
		IdleTimeout: c.IdleTimeout, RangeConnections: c.RangeConnections, Version: c.Version,
		Code: func(err error) string { return toAPIError(err).Code }, Xet: hfXetOptions(c.Xet, st)}
}

// fileIdentity is who models.d and ModelCache file:// sources read as
// (FileIdentity and its default).
func (c *Config) fileIdentity() *fetchers.Identity {
	if id, err := parseIdentity(c.FileIdentity); err == nil {
		return id
	}
	if os.Geteuid() == 0 {
		return &fetchers.Identity{UID: nobody, GID: nobody}
	}
	return &fetchers.Identity{UID: uint32(os.Geteuid()), GID: uint32(os.Getegid())}
}

// DefaultKubeletDir is kubelet's root directory: every pod's projected
// tokens, Secrets and volumes live under it.
const DefaultKubeletDir = "/var/lib/kubelet"

// fileDenied are the paths file:// never reads, whatever --file-roots
// says: kubelet's directories (the default one, and the ones the CSI
// plugin is configured with) and the daemon's own state (the store root,
// the socket, the packaged socket's directory /run/modelcached, models.d,
// the config file). A socket elsewhere denies itself, not its directory:
// the daemon keeps nothing else there, and a dev run or a test often puts
// its socket beside the models it pulls.
func (c *Config) fileDenied() []string {
	out := []string{DefaultKubeletDir, c.Root, c.Socket, filepath.Dir(api.DefaultSocket), c.ModelsDir, c.ConfigFile}
	if c.CSI != nil {
		pods := c.CSI.PodsDir
		if pods == "" {
			pods = csi.DefaultPodsDir
		}
		out = append(out, pods, filepath.Dir(c.CSI.Socket), c.CSI.RegistrationDir)
		if filepath.Base(pods) == "pods" { // kubelet's --root-dir
			out = append(out, filepath.Dir(pods))
		}
	}
	var paths []string
	for _, p := range out {
		if p != "" && filepath.IsAbs(p) {
			paths = append(paths, filepath.Clean(p))
		}
	}
	return paths
}

// groupID looks the socket group up; -1 when unset or absent (logged).
func groupID(name string) (int, error) {
	if name == "" {
		return -1, nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		if n, nerr := strconv.Atoi(name); nerr == nil {
			return n, nil
		}
		return -1, err
	}
	return strconv.Atoi(g.Gid)
}

// PeerConfig is fan-out's settings (package fanout: fanout.Config).
type PeerConfig = fanout.Config

// DefaultPeerConfig is a peer port's settings but the address.
func DefaultPeerConfig() PeerConfig { return fanout.DefaultConfig() }
