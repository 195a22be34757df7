// Command modelcached is the per-node model cache daemon.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/modelcache/modelcache/daemon"
	"github.com/modelcache/modelcache/daemon/capacity"
)

// version is stamped at build time: -ldflags "-X main.version=…".
var version = "dev"

func main() {
	def := daemon.DefaultConfig()
	app := &cli.App{
		Name:    "modelcached",
		Usage:   "node-local cache of model weights and GPU kernel caches",
		Version: version,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "config", Usage: "YAML config file (capacity policy and more); flags override it"},
			&cli.StringFlag{Name: "quota", Usage: "byte quota of the store, e.g. 500Gi (default none)"},
			&cli.IntFlag{Name: "high-watermark", Value: def.Capacity.HighPercent, Usage: "filesystem use percent that starts eviction (0 disables watermarks)"},
			&cli.IntFlag{Name: "low-watermark", Value: def.Capacity.LowPercent, Usage: "filesystem use percent where eviction stops"},
			&cli.DurationFlag{Name: "min-age", Value: def.Capacity.MinAge, Usage: "versions younger than this are never evicted"},
			&cli.IntFlag{Name: "keep-revisions", Value: def.Capacity.KeepRevisions, Usage: "old revisions of a model kept once unused"},
			&cli.DurationFlag{Name: "capacity-interval", Value: def.CapacityInterval, Usage: "how often the in-use scan and an eviction pass run"},
			&cli.StringFlag{Name: "root", Value: def.Root, Usage: "store root directory", EnvVars: []string{"MODELCACHED_ROOT"}},
			&cli.StringFlag{Name: "socket", Value: def.Socket, Usage: "unix socket of the API", EnvVars: []string{"MODELCACHED_SOCKET"}},
			&cli.StringFlag{Name: "socket-mode", Value: "0666", Usage: "permission bits of the socket: 0666 lets every local user read (mutations are checked per peer), 0660 restricts reads to the group too"},
			&cli.StringFlag{Name: "socket-group", Value: def.SocketGroup, Usage: "group whose members may change the cache (and that owns the socket); empty: only root and the daemon's user"},
			&cli.BoolFlag{Name: "systemd-socket", Usage: "require the API socket from systemd socket activation (without the flag a passed socket is used when present)"},
			&cli.StringFlag{Name: "metrics-addr", Value: def.MetricsAddr, Usage: "TCP address of /metrics and /healthz; empty disables"},
			&cli.StringFlag{Name: "models-dir", Value: def.ModelsDir, Usage: "directory of YAML desires, reloaded on change"},
			&cli.StringFlag{Name: "log-format", Value: "text", Usage: "text or json"},
			&cli.StringFlag{Name: "log-level", Value: "info", Usage: "debug, info, warn or error"},
			&cli.IntFlag{Name: "max-concurrent-pulls", Value: def.MaxConcurrentPulls, Usage: "artifacts pulled at once"},
			&cli.IntFlag{Name: "files-per-pull", Value: def.FilesPerPull, Usage: "files of one artifact fetched at once"},
			&cli.BoolFlag{Name: "direct-io", Value: def.DirectIO, Usage: "write blobs with O_DIRECT where the filesystem allows (--direct-io=false: buffered)"},
			&cli.Int64Flag{Name: "bandwidth-limit", Usage: "bytes per second over all pulls; 0 = unlimited"},
			&cli.DurationFlag{Name: "retry-initial", Value: def.RetryInitial, Usage: "first delay after a failed pull"},
			&cli.DurationFlag{Name: "retry-max", Value: def.RetryMax, Usage: "longest delay between pull attempts"},
			&cli.IntFlag{Name: "range-connections", Value: def.RangeConnections, Usage: "parallel Range requests per large file from a hub or S3 (1: one stream)"},
			&cli.StringSliceFlag{Name: "insecure-registry", Usage: "an OCI registry (host:port) to reach over plain HTTP (repeatable; for local registries)"},
			&cli.StringSliceFlag{Name: "registry-mirror", Usage: "registry=mirror: pull from the mirror first, the registry when it fails (repeatable; digests are verified either way)"},
			&cli.StringFlag{Name: "gpu-inventory", Usage: "JSON file describing a simulated node's GPUs (tests; nodes where NVML is unavailable); shown as simulated everywhere", EnvVars: []string{"MODELCACHED_GPU_INVENTORY"}},
			&cli.DurationFlag{Name: "idle-timeout", Value: def.IdleTimeout, Usage: "a download that delivers nothing this long is resumed on a new request"},
		},
		Action: run,
	}
	if err := app.Run(os.Args); err != nil {
		fmt.Fprintln(os.Stderr, "modelcached:", err)
		os.Exit(1)
	}
}

func run(c *cli.Context) error {
	if c.NArg() > 0 {
		return cli.Exit(fmt.Sprintf("modelcached: unexpected argument %q (flags only; see --help)", c.Args().First()), 2)
	}
	logger, err := newLogger(c.String("log-format"), c.String("log-level"))
	if err != nil {
		return cli.Exit("modelcached: "+err.Error(), 2)
	}
	mode, err := strconv.ParseUint(c.String("socket-mode"), 8, 32)
	if err != nil {
		return cli.Exit(fmt.Sprintf("modelcached: --socket-mode %q: want octal bits such as 0666 or 0660", c.String("socket-mode")), 2)
	}
	cfg := daemon.DefaultConfig()
	if f := c.String("config"); f != "" {
		if err := daemon.LoadConfigFile(f, &cfg); err != nil {
			return cli.Exit("modelcached: "+err.Error(), 2)
		}
	}
	// Flags override the file only where given.
	if c.IsSet("quota") {
		n, err := capacity.ParseBytes(c.String("quota"))
		if err != nil {
			return cli.Exit("modelcached: --quota: "+err.Error(), 2)
		}
		cfg.Capacity.QuotaBytes = n
	}
	// Without a config file every flag (default or given) counts; with one,
	// only flags given on the command line override it.
	flag := func(n string) bool { return c.IsSet(n) || c.String("config") == "" }
	if flag("high-watermark") {
		cfg.Capacity.HighPercent = c.Int("high-watermark")
	}
	if flag("low-watermark") {
		cfg.Capacity.LowPercent = c.Int("low-watermark")
	}
	if flag("min-age") {
		cfg.Capacity.MinAge = c.Duration("min-age")
	}
	if flag("keep-revisions") {
		cfg.Capacity.KeepRevisions = c.Int("keep-revisions")
	}
	if flag("max-concurrent-pulls") {
		cfg.MaxConcurrentPulls = c.Int("max-concurrent-pulls")
	}
	if flag("bandwidth-limit") {
		cfg.BandwidthLimit = c.Int64("bandwidth-limit")
	}
	cfg.CapacityInterval = c.Duration("capacity-interval")
	cfg.Root = c.String("root")
	cfg.Socket = c.String("socket")
	cfg.SocketMode = os.FileMode(mode)
	cfg.SocketGroup = c.String("socket-group")
	cfg.SystemdSocket = c.Bool("systemd-socket")
	cfg.MetricsAddr = c.String("metrics-addr")
	cfg.ModelsDir = c.String("models-dir")
	cfg.FilesPerPull = c.Int("files-per-pull")
	cfg.DirectIO = c.Bool("direct-io")
	cfg.RetryInitial = c.Duration("retry-initial")
	cfg.RetryMax = c.Duration("retry-max")
	cfg.IdleTimeout = c.Duration("idle-timeout")
	cfg.RangeConnections = c.Int("range-connections")
	cfg.InsecureRegistries = c.StringSlice("insecure-registry")
	cfg.RegistryMirrors = c.StringSlice("registry-mirror")
	cfg.GPUInventory = c.String("gpu-inventory")
	cfg.Logger = logger
	cfg.Version = version
	cfg.Hook = faultHook(logger)
	if err := cfg.Validate(); err != nil {
		return cli.Exit("modelcached: invalid configuration:\n  "+strings.ReplaceAll(err.Error(), "\n", "\n  "), 2)
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

func newLogger(format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
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
