// Command modelcached is the per-node model cache daemon.
//
// main.go holds its flags, the logger, and the start of the daemon and
// (--cluster) of its sync with Kubernetes; cluster.go reads the flags of
// that sync (--cluster, clusterConfig) and of fan-out between nodes
// (--peer-*, peerConfig); config.go reads the --config file, the command
// line written as YAML.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/modelcache/modelcache/csi"
	"github.com/modelcache/modelcache/daemon"
	"github.com/modelcache/modelcache/daemon/capacity"
	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/internal/cliutil"
	"github.com/modelcache/modelcache/k8ssync"
)

// version is stamped at build time: -ldflags "-X main.version=…".
var version = "dev"

func main() {
	if n := spareProcs(os.Getenv("GOMAXPROCS"), runtime.GOMAXPROCS(0)); n > 0 {
		runtime.GOMAXPROCS(n)
	}
	app := newApp()
	if len(os.Args) == 2 && os.Args[1] == "--print-man" { // for packaging
		m, err := manPage(app)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Print(m)
		return
	}
	if problems := checkArgs(app, os.Args[1:]); len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(os.Stderr, "modelcached:", p)
		}
		fmt.Fprintln(os.Stderr, "Run 'modelcached --help' for usage.")
		os.Exit(2)
	}
	if err := app.Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "modelcached:", err)
		os.Exit(1)
	}
}

// spareProcs is the GOMAXPROCS the daemon runs with: two more than the
// runtime's default (the CPUs, or the cgroup's CPU limit), unless the
// GOMAXPROCS environment variable names one (0: leave it).
//
// A pull's writer spends most of its time blocked in O_DIRECT pwrite and
// fsync, about 1 ms per MiB. While every P is busy, the runtime's sysmon
// takes a P blocked in a system call away after 20 µs and hands it to
// another thread, and the writer must wake one to get a P back: two
// thread switches per MiB written, with sysmon polling every 20 µs all
// the while. With two spare Ps a blocked writer keeps its own and sysmon
// backs off: less CPU per GB, and fewer context switches
// (docs/benchmarks.md has the measurement). The cost: when
// more goroutines than CPUs are runnable at once, the kernel, not the Go
// scheduler, shares the CPUs among up to two more threads.
func spareProcs(env string, def int) int {
	if env != "" {
		return 0
	}
	return def + 2
}

// helpTemplate is the daemon's --help: it takes flags only, so there is
// no command to list, no "help" command and no "global" options.
const helpTemplate = `NAME:
   {{template "helpNameTemplate" .}}

USAGE:
   {{wrap .UsageText 3}}

VERSION:
   {{.Version}}

OPTIONS:{{template "visibleFlagTemplate" .}}
`

// manPage is the daemon's manual page (roff), for packaging: urfave/cli's,
// with the options under OPTIONS rather than GLOBAL OPTIONS.
func manPage(app *cli.App) (string, error) {
	m, err := app.ToMan()
	return strings.Replace(m, ".SH GLOBAL OPTIONS", ".SH OPTIONS", 1), err
}

// newApp is modelcached's command line: its flags are also the keys of
// the config file (config.go). docs/flags.md's table of them is written from
// them (TestFlagsDoc compares):
//
//go:generate go test -run ^TestFlagsDoc$ -update-docs .
func newApp() *cli.App {
	def, peerDef := daemon.DefaultConfig(), daemon.DefaultPeerConfig()
	return &cli.App{
		Name:                  "modelcached",
		Usage:                 "node-local cache of model weights and GPU kernel caches",
		UsageText:             "modelcached [options]",
		Version:               version,
		HideHelpCommand:       true,
		CustomAppHelpTemplate: helpTemplate,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Usage: "YAML config file: any flag below, by its name (quota: 500Gi, min-age: 2m, file-roots: [/srv/models]); the command line overrides it"},
			&cli.GenericFlag{Name: "quota", Value: &sizeFlag{}, Usage: "byte quota of the store: bytes or a size such as 500Gi or 2T (default none)"},
			&cli.IntFlag{Name: "high-watermark", Value: def.Capacity.HighPercent, Usage: "filesystem use percent that starts eviction (0 disables watermarks)"},
			&cli.IntFlag{Name: "low-watermark", Value: def.Capacity.LowPercent, Usage: "filesystem use percent where eviction stops"},
			&cli.DurationFlag{Name: "min-age", Value: def.Capacity.MinAge, Usage: "versions younger than this are never evicted"},
			&cli.IntFlag{Name: "keep-revisions", Value: def.Capacity.KeepRevisions, Usage: "old revisions of a model kept once unused"},
			&cli.DurationFlag{Name: "capacity-interval", Value: def.CapacityInterval, Usage: "how often the in-use scan and an eviction pass run"},
			&cli.StringFlag{Name: "root", Value: def.Root, Usage: "store root directory", EnvVars: []string{"MODELCACHED_ROOT"}},
			&cli.StringFlag{Name: "socket", Value: def.Socket, Usage: "unix socket of the API", EnvVars: []string{"MODELCACHED_SOCKET"}},
			&cli.StringFlag{Name: "socket-mode", Value: "0666", Usage: "permission bits of the socket: 0666 lets every local user read (mutations are checked per peer), 0660 restricts reads to the group too"},
			&cli.StringFlag{Name: "socket-group", Value: def.SocketGroup, Usage: "group whose members may change the cache (and that owns the socket); empty: only root and the daemon's user"},
			&cli.IntFlag{Name: "max-connections-per-uid", Value: def.MaxConnectionsPerUID, Usage: "API socket connections one local user (peer uid) may hold open; more are closed at once (0: no limit; root and the daemon's user are never limited)"},
			&cli.DurationFlag{Name: "socket-read-timeout", Value: def.SocketReadTimeout, Usage: "time a peer has to send one request's headers and body on the API socket"},
			&cli.DurationFlag{Name: "socket-idle-timeout", Value: def.SocketIdleTimeout, Usage: "an API socket connection with no request for this long is closed"},
			&cli.DurationFlag{Name: "socket-write-timeout", Value: def.SocketWriteTimeout, Usage: "a response write (a progress line of a stream) the peer does not read within this ends the connection"},
			&cli.BoolFlag{Name: "systemd-socket", Usage: "require the API socket from systemd socket activation (without the flag a passed socket is used when present)"},
			&cli.StringFlag{Name: "metrics-addr", Value: def.MetricsAddr, Usage: "TCP address of /metrics and /healthz; empty disables"},
			&cli.StringFlag{Name: "models-dir", Value: def.ModelsDir, Usage: "directory of YAML desires, reloaded on change"},
			&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text or json"},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error"},
			&cli.IntFlag{Name: "max-concurrent-pulls", Value: def.MaxConcurrentPulls, Usage: "artifacts pulled at once"},
			&cli.IntFlag{Name: "files-per-pull", Value: def.FilesPerPull, Usage: "files of one artifact fetched at once"},
			&cli.BoolFlag{Name: "direct-io", Value: def.DirectIO, Usage: "write blobs with O_DIRECT where the filesystem allows (--direct-io=false: buffered)"},
			&cli.GenericFlag{Name: "write-buffer-size", Value: &sizeFlag{n: def.WriteBufferSize, set: true}, DefaultText: "2Mi", Usage: "each of a file's two pipeline buffers, and so each write to disk: a multiple of 4Ki from 64Ki to 64Mi; larger costs less CPU per byte, smaller holds less memory per file and loses less to a crash"},
			&cli.GenericFlag{Name: "bandwidth-limit", Value: &sizeFlag{}, DefaultText: "0 (unlimited)", Usage: "bytes per second over all pulls: bytes or a size such as 500M or 1Gi; 0 = unlimited"},
			&cli.DurationFlag{Name: "retry-initial", Value: def.RetryInitial, Usage: "first delay after a failed pull"},
			&cli.DurationFlag{Name: "retry-max", Value: def.RetryMax, Usage: "longest delay between pull attempts"},
			&cli.BoolFlag{Name: "xet", Value: def.Xet, Usage: "rebuild hf:// files from the Hub's Xet store where the Hub offers it, fetching only the chunks this node does not hold already (a new revision of a model it has); --xet=false: read every file whole through the resolve URL. A models.d desire or a ModelCache turns it off for its model with xet: false"},
			&cli.IntFlag{Name: "range-connections", Value: def.RangeConnections, Usage: "the most connections per large file from a hub, NGC or S3: a file starts on one and gets parallel Range requests only when that one is the limit (1: one stream)"},
			&cli.StringSliceFlag{Name: "insecure-registry", Usage: "an OCI registry (host:port) to reach over plain HTTP (repeatable; for local registries)"},
			&cli.StringSliceFlag{Name: "registry-mirror", Usage: "registry=mirror: pull from the mirror first, the registry when it fails (repeatable; digests are verified either way)"},
			&cli.StringFlag{Name: "gpu-inventory", Usage: "JSON file describing a simulated node's GPUs (tests; nodes where NVML is unavailable); shown as simulated everywhere", EnvVars: []string{"MODELCACHED_GPU_INVENTORY"}},
			&cli.StringSliceFlag{Name: "file-roots", Usage: "the only directories file:// sources may come from, whoever asks (repeatable or comma-separated); a ModelCache's file:// source is refused until this is set; without it a socket pull reads any path its requester may read and a models.d file any path --file-identity may read; kubelet's directories and the daemon's own (--root, the socket's, --models-dir, --config) are never read"},
			&cli.StringFlag{Name: "file-identity", DefaultText: "65534:65534 (nobody) when run as root, else the daemon's own", Usage: "UID:GID (numeric) that file:// sources of ModelCaches and models.d files are read as, by the kernel's permission checks; 0:0 reads as root (socket pulls always read as their requester)"},
			&cli.StringFlag{Name: "kernel-cache-signature-policy", Value: def.KernelCacheSignaturePolicy, Usage: "required or off: kernel caches must be signed; socket pulls may tighten this, never turn it off"},
			&cli.StringFlag{Name: "cluster", Value: "auto", Usage: "sync with Kubernetes: auto (when a node name and a kubeconfig or in-cluster config exist), on, off"},
			&cli.StringFlag{Name: "kubeconfig", Usage: "kubeconfig file; default in-cluster config", EnvVars: []string{"KUBECONFIG"}},
			&cli.StringFlag{Name: "node-name", Usage: "this node's name (from the downward API: spec.nodeName)", EnvVars: []string{"NODE_NAME"}},
			&cli.StringFlag{Name: "pod-name", Usage: "the daemon's own pod when it runs in one (from the downward API: metadata.name); never counted as a holder", EnvVars: []string{"POD_NAME"}},
			&cli.StringFlag{Name: "lease-namespace", Value: "modelcache-system", Usage: "namespace of the Lease that elects the status aggregator", EnvVars: []string{"POD_NAMESPACE"}},
			&cli.BoolFlag{Name: "local-pvs", Usage: "make a read-only local PersistentVolume for each Ready model of a ModelCache"},
			&cli.StringFlag{Name: "pv-storage-class", Value: "modelcache-local", Usage: "storage class of those PVs"},
			&cli.Float64Flag{Name: "pv-qps", Value: 1, Usage: "PV creations and deletions per second (token bucket)"},
			&cli.IntFlag{Name: "pv-burst", Value: 5, Usage: "burst of that bucket"},
			&cli.DurationFlag{Name: "status-interval", Value: k8ssync.DefaultStatusInterval, Usage: "least time between two writes of this node's ModelCacheNode status (its phases; the capacity figures alone at most every 5m)"},
			&cli.DurationFlag{Name: "idle-timeout", Value: def.IdleTimeout, Usage: "a download that delivers nothing this long is resumed on a new request"},
			&cli.GenericFlag{Name: "progress-floor", Value: &sizeFlag{n: 1 << 20, set: true}, DefaultText: "1Mi", Usage: "a download that delivers less than this in a --progress-window of reading fails the attempt as too slow (retried, its pull slot given up meanwhile); 0 = off"},
			&cli.DurationFlag{Name: "progress-window", Value: def.ProgressWindow, Usage: "the window of --progress-floor"},
			&cli.StringFlag{Name: "peer-addr", Usage: "serve this node's verified blobs to the other daemons of the cluster on this TCP address, e.g. :7435, and fetch blobs from them before the origin (default off; the DaemonSet bundle turns it on)"},
			&cli.StringFlag{Name: "peer-advertise", DefaultText: "http://$POD_IP:<port of --peer-addr>, or --peer-addr when it names a host", Usage: "base URL the other daemons reach this one at, e.g. http://10.0.0.7:7435"},
			&cli.StringFlag{Name: "peer-token-file", Value: peerDef.TokenFile, Usage: "the token this daemon sends to its peers: the projected service-account token of audience modelcache-peer (a serviceAccountToken volume), read again when rotated"},
			&cli.StringFlag{Name: "peer-service-account", DefaultText: "$POD_NAMESPACE/$SERVICE_ACCOUNT_NAME", Usage: "namespace/name of the daemons' service account: the only one whose peer tokens a TokenReview accepts"},
			&cli.StringFlag{Name: "peer-static-token-file", Usage: "outside Kubernetes: a token file every daemon of the fleet shares (mode 0600); the daemon sends it and accepts only it (replaces --peer-token-file and the TokenReview)"},
			&cli.StringSliceFlag{Name: "peers", Usage: "outside Kubernetes: the other daemons' peer ports, host:port (repeatable or comma-separated); needs --peer-static-token-file"},
			&cli.IntFlag{Name: "peer-max-uploads", Value: peerDef.MaxUploads, Usage: "blob transfers this daemon serves to peers at once; more are answered 503 with Retry-After"},
			&cli.GenericFlag{Name: "peer-upload-rate", Value: &sizeFlag{}, DefaultText: "0 (no bound)", Usage: "bytes per second sent to peers over all uploads: bytes or a size such as 500M; 0 = no bound"},
			&cli.IntFlag{Name: "origin-concurrency", Value: peerDef.OriginConcurrency, Usage: "how many nodes fetch one artifact from the origin at once, 1 to 1024, and any one blob of it, also for a second --peer-wait after the first (in a cluster); the others wait for a peer to hold its files. The elected daemon records at most 8 of them with a resolution (status.resolved[].originNodes); without such a record each node takes this many"},
			&cli.DurationFlag{Name: "peer-wait", Value: peerDef.Wait, Usage: "how long a pull that is not among --origin-concurrency waits for a peer to hold a file before it may fetch it from the origin itself: in a cluster only in a place of the --origin-concurrency that the origin nodes leave (one that holds it, is gone or failed it)"},
			&cli.BoolFlag{Name: "warm", Value: def.Warm, Usage: "read a model into the page cache ahead of the pod about to load it (on a CSI publish, modelctl wait returning Ready, modelctl lease, modelctl warm); --warm=false: never"},
			&cli.Float64Flag{Name: "warm-share", Value: def.WarmShare, Usage: "the share of MemAvailable (read at each warm's start) all running warms together may read into the page cache: more than 0, at most 1"},
			&cli.GenericFlag{Name: "warm-limit", Value: &sizeFlag{}, Usage: "a cap on what all running warms together may read into the page cache, whatever --warm-share allows: bytes or a size such as 16Gi (default none)"},
			&cli.StringFlag{Name: "csi-socket", Usage: "serve the CSI node plugin csi.modelcache.io on this unix socket, e.g. /var/lib/kubelet/plugins/csi.modelcache.io/csi.sock (default off)"},
			&cli.StringFlag{Name: "csi-pods-dir", Value: csi.DefaultPodsDir, Usage: "kubelet's pods directory: every CSI target path must lie under it"},
			&cli.StringFlag{Name: "csi-registration-dir", Value: "/var/lib/kubelet/plugins_registry", Usage: "kubelet's plugin registration directory, where the daemon registers the CSI driver itself (empty: leave it to a node-driver-registrar)"},
			&cli.GenericFlag{Name: "csi-kept-bytes", Value: &sizeFlag{}, Usage: "the most bytes all writable kernel cache layers kept for capture after their pods went may take in the store root, together; past it the oldest goes, and a layer larger by itself is not kept (default 4Gi)"},
			&cli.IntFlag{Name: "csi-kept-layers", Value: daemon.DefaultKeptLayers, Usage: "the most writable kernel cache layers kept for capture; past it the oldest goes"},
			&cli.DurationFlag{Name: "csi-kept-age", Value: daemon.DefaultKeptAge, Usage: "how long a writable kernel cache layer is kept for capture after its pod went"},
		},
		Action: run,
		// Bad flags are found by checkArgs first; what urfave/cli still
		// finds is one line too, not the whole help.
		OnUsageError: func(_ *cli.Context, err error, _ bool) error {
			return cli.Exit(fmt.Sprintf("modelcached: %v\nRun 'modelcached --help' for usage.", err), 2)
		},
	}
}

// checkArgs returns every usage error of args: each bad flag (unknown,
// without its value, a value its type refuses) and any argument (the
// daemon takes flags only).
func checkArgs(app *cli.App, args []string) []string {
	pos, problems := cliutil.CheckFlags(app.Flags, args, true)
	if len(pos) > 0 {
		problems = append(problems, fmt.Sprintf("unexpected argument %q: modelcached takes flags only", pos[0]))
	}
	return problems
}

// sizeFlag is a byte size flag: bytes or a number with a unit (500Gi,
// 2T), as the config file takes them.
type sizeFlag struct {
	n   int64
	set bool
}

func (f *sizeFlag) Set(s string) error {
	n, err := capacity.ParseBytes(s)
	if err != nil {
		return err
	}
	f.n, f.set = n, true
	return nil
}

// Check implements cliutil.Checker.
func (f *sizeFlag) Check(s string) error {
	if _, err := capacity.ParseBytes(s); err != nil {
		return errors.New("want bytes or a size with a unit such as 500M, 2Gi or 1T")
	}
	return nil
}

func (f *sizeFlag) String() string {
	if f == nil || !f.set {
		return ""
	}
	return strconv.FormatInt(f.n, 10)
}

func size(c *cli.Context, name string) int64 { return c.Generic(name).(*sizeFlag).n }

// usageExit reports every problem on a line of its own, then where to
// look, and exits 2.
func usageExit(problems []string) error {
	var b strings.Builder
	for _, p := range problems {
		b.WriteString("modelcached: " + p + "\n")
	}
	b.WriteString("Run 'modelcached --help' for usage.")
	return cli.Exit(b.String(), 2)
}

func run(c *cli.Context) error {
	if f := c.String("config"); f != "" {
		if err := applyConfigFile(c, c.App.Flags, f); err != nil {
			return cli.Exit("modelcached: "+err.Error(), 2)
		}
	}
	// Every value refused is reported, one line each, before any starts
	// the daemon (usageExit).
	var problems []string
	logger, err := newLogger(c.String("log-format"), c.String("log-level"))
	if err != nil {
		problems = append(problems, strings.Split(err.Error(), "\n")...)
	}
	mode, err := strconv.ParseUint(strings.TrimPrefix(c.String("socket-mode"), "0o"), 8, 32)
	if err != nil {
		problems = append(problems, fmt.Sprintf("--socket-mode %q: want octal bits such as 0666 or 0660", c.String("socket-mode")))
		mode = 0o666 // reported: not again by Validate
	}
	cfg := daemon.DefaultConfig()
	cfg.Capacity.QuotaBytes = size(c, "quota")
	cfg.Capacity.HighPercent = c.Int("high-watermark")
	cfg.Capacity.LowPercent = c.Int("low-watermark")
	cfg.Capacity.MinAge = c.Duration("min-age")
	cfg.Capacity.KeepRevisions = c.Int("keep-revisions")
	setPullsAndWarming(c, &cfg)
	cfg.KernelCacheSignaturePolicy = c.String("kernel-cache-signature-policy")
	cfg.FileRoots = nil
	for _, r := range c.StringSlice("file-roots") {
		for _, x := range strings.Split(r, ",") {
			if x = strings.TrimSpace(x); x != "" {
				cfg.FileRoots = append(cfg.FileRoots, x)
			}
		}
	}
	cfg.FileIdentity = c.String("file-identity")
	if f := c.String("config"); f != "" {
		if cfg.ConfigFile, err = filepath.Abs(f); err != nil {
			return cli.Exit(fmt.Sprintf("modelcached: --config: %v", err), 2)
		}
	}
	cfg.MaxConnectionsPerUID = c.Int("max-connections-per-uid")
	cfg.CapacityInterval = c.Duration("capacity-interval")
	// Absolute paths: status, list and inspect show them to clients that
	// run elsewhere, and a relative one would follow the daemon's cwd.
	for _, p := range []struct {
		flag string
		dst  *string
	}{{"root", &cfg.Root}, {"socket", &cfg.Socket}, {"models-dir", &cfg.ModelsDir}} {
		v := c.String(p.flag)
		if v != "" {
			if v, err = filepath.Abs(v); err != nil {
				return cli.Exit(fmt.Sprintf("modelcached: --%s: %v", p.flag, err), 2)
			}
		}
		*p.dst = v
	}
	cfg.SocketMode = os.FileMode(mode)
	cfg.SocketGroup = c.String("socket-group")
	cfg.SystemdSocket = c.Bool("systemd-socket")
	cfg.SocketReadTimeout = c.Duration("socket-read-timeout")
	cfg.SocketIdleTimeout = c.Duration("socket-idle-timeout")
	cfg.SocketWriteTimeout = c.Duration("socket-write-timeout")
	cfg.MetricsAddr = c.String("metrics-addr")
	cfg.InsecureRegistries = c.StringSlice("insecure-registry")
	cfg.RegistryMirrors = c.StringSlice("registry-mirror")
	cfg.GPUInventory = c.String("gpu-inventory")
	if cfg.Cluster, err = clusterConfig(c); err != nil {
		return err
	}
	if cfg.Peer, err = peerConfig(c); err != nil {
		problems = append(problems, err.Error())
	}
	if p := c.String("csi-socket"); p != "" {
		cfg.CSI = &csi.Config{Socket: p, PodsDir: c.String("csi-pods-dir"), RegistrationDir: c.String("csi-registration-dir"), NodeID: c.String("node-name")}
		cfg.KeptLayers = daemon.KeptLimits{MaxBytes: size(c, "csi-kept-bytes"), MaxLayers: c.Int("csi-kept-layers"), MaxAge: c.Duration("csi-kept-age")}
	}
	cfg.Logger = logger
	cfg.Version = version
	cfg.Hook = faultHook(logger)
	if err := cfg.Validate(); err != nil {
		problems = append(problems, strings.Split(err.Error(), "\n")...)
	}
	if len(problems) > 0 {
		return usageExit(problems)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	d, err := daemon.New(ctx, cfg)
	if err != nil {
		return err
	}
	if err := d.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// setPullsAndWarming reads the flags of pulls (concurrency, bandwidth,
// buffers, retries, timeouts) and of warming into cfg.
func setPullsAndWarming(c *cli.Context, cfg *daemon.Config) {
	cfg.MaxConcurrentPulls = c.Int("max-concurrent-pulls")
	cfg.BandwidthLimit = size(c, "bandwidth-limit")
	cfg.WriteBufferSize = size(c, "write-buffer-size")
	cfg.ProgressFloor = size(c, "progress-floor")
	cfg.ProgressWindow = c.Duration("progress-window")
	cfg.Warm = c.Bool("warm")
	cfg.WarmShare = c.Float64("warm-share")
	cfg.WarmLimit = size(c, "warm-limit")
	cfg.FilesPerPull = c.Int("files-per-pull")
	cfg.DirectIO = c.Bool("direct-io")
	cfg.RetryInitial = c.Duration("retry-initial")
	cfg.RetryMax = c.Duration("retry-max")
	cfg.IdleTimeout = c.Duration("idle-timeout")
	cfg.RangeConnections = c.Int("range-connections")
	cfg.Xet = c.Bool("xet")
}

func newLogger(format, level string) (*slog.Logger, error) {
	var lv slog.Level
	var lerr error
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		lerr = fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	if format != "text" && format != "json" {
		return nil, errors.Join(lerr, fmt.Errorf("--log-format %q: want text or json", format))
	}
	if lerr != nil {
		return nil, lerr
	}
	opts := &slog.HandlerOptions{Level: lv}
	// Credentials in source URIs never reach the log (the daemon wraps its
	// logger too; this covers what main logs before and around it).
	switch format {
	case "text":
		return slog.New(fetchers.RedactHandler(slog.NewTextHandler(os.Stderr, opts))), nil
	case "json":
		return slog.New(fetchers.RedactHandler(slog.NewJSONHandler(os.Stderr, opts))), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// faultHook reads MODELCACHED_FAULTPOINT=<point>[:<n>] and SIGKILLs the
// daemon at the n-th time (default 1st) the store reaches that point. It
// exists for the crash tests; unset, it costs nothing.
func faultHook(log *slog.Logger) func(string) {
	spec := os.Getenv("MODELCACHED_FAULTPOINT")
	if spec == "" {
		return nil
	}
	point, ns, _ := strings.Cut(spec, ":")
	n, _ := strconv.Atoi(ns)
	if n < 1 {
		n = 1
	}
	var hits atomic.Int64
	log.Warn("fault injection armed: the daemon kills itself at this point", "point", point, "hit", n)
	return func(p string) {
		if p == point && hits.Add(1) == int64(n) {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
}
