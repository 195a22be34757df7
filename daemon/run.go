package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/coreos/go-systemd/v22/daemon"
	"golang.org/x/time/rate"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/capacity"
	"github.com/modelcache/modelcache/daemon/fanout"
	"github.com/modelcache/modelcache/daemon/kernels"
	"github.com/modelcache/modelcache/daemon/sources"
	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/k8ssync"
)

// New opens the store (running startup repair) and prepares the daemon.
func New(ctx context.Context, cfg Config) (*Daemon, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = slog.New(fetchers.RedactHandler(log.Handler())) // no credential of a URI reaches the log
	if cfg.SystemdSocket && os.Getenv("LISTEN_FDS") == "" {
		return nil, errors.New("--systemd-socket: no socket from systemd (LISTEN_FDS unset); start modelcached.socket, or drop the flag to listen on --socket")
	}
	var d *Daemon // the store asks it which partial downloads are abandoned (never before New returns)
	st, err := openStore(ctx, cfg, log, func(in cachestore.IngestInfo) bool { return d.abandoned(in) })
	if err != nil {
		return nil, err
	}
	gid, err := groupID(cfg.SocketGroup)
	if err != nil {
		log.Warn("socket group not found; only root and the daemon's user may change the cache", "group", cfg.SocketGroup, "err", err)
		gid = -1
	}
	d = &Daemon{
		cfg: cfg, log: log, store: st, records: st.Records(), started: time.Now(), gid: gid,
		backoff: fetchers.DefaultBackoff,
		desires: newDesireSet(st.Records()),
		shared: shared{arts: pullStates{}, flights: map[string]*flight{}, evicted: map[string]api.EvictionNote{},
			changed: make(chan struct{})},
		wake:    make(chan struct{}, 1),
		pullSem: make(chan struct{}, cfg.MaxConcurrentPulls),
	}
	d.space = newSpace(d)
	d.leases = &leaseSet{store: st, m: map[string]map[string]*apiLease{}, changed: func() {
		d.mu.Lock()
		d.notify()
		d.mu.Unlock()
	}}
	desired := func() map[string]api.Desire {
		d.mu.Lock()
		defer d.mu.Unlock()
		return d.desires.merged()
	}
	if d.sources, err = sources.New(cfg.sourcesConfig(st), log, desired); err != nil {
		st.Close()
		return nil, err
	}
	d.metrics = newMetrics(&stateCollector{d: d})
	kcfg := kernels.Config{GPUInventory: cfg.GPUInventory, SignaturePolicy: cfg.KernelCacheSignaturePolicy,
		Signatures: d.metrics.signatures, Compat: d.metrics.compatChecks}
	if d.kernels, err = kernels.New(kcfg, log, st, desired); err != nil {
		st.Close()
		return nil, err
	}
	if cfg.BandwidthLimit > 0 {
		d.limiter = rate.NewLimiter(rate.Limit(cfg.BandwidthLimit), int(min(cfg.BandwidthLimit, 4<<20)))
	}
	d.space.metrics = d.metrics
	if cfg.Peer != nil {
		o := fanout.Options{Access: &d.desires.access, Log: log, Metrics: d.metrics.peer}
		pc := *cfg.Peer
		if cfg.Cluster != nil {
			o.NodeName = cfg.Cluster.NodeName
			pc.Settle = max(pc.Settle, clusterViewLag(cfg.Cluster))
		}
		if d.fanout, err = fanout.New(pc, o); err != nil {
			st.Close()
			return nil, err
		}
	}
	if d.warming, err = newWarming(cfg, st, log, d.metrics); err != nil {
		st.Close()
		return nil, err
	}
	d.leases.warm = d.warming
	if cfg.Cluster != nil {
		// client-go's global log is set here, before Run starts anything
		// that uses client-go (and before the caller goes on).
		cl := cfg.Cluster.Log
		if cl == nil {
			cl = log.With("component", "k8ssync")
		}
		k8ssync.SetClientLog(cl)
	}
	if err := d.desires.load(log); err != nil {
		st.Close()
		return nil, err
	}
	d.desires.markCredentialed(d.sources.Credentialed) // before the desires are published: who may read what depends on it
	d.mu.Lock()
	d.desires.publish()
	d.mu.Unlock()
	modelsDir{d}.load()
	d.csi = newCSIVolumes(d, desired)
	d.csi.load()
	// Trees that startup repair rebuilt are closed (0700): public ones
	// open before anything is served.
	d.modes = &treeModes{store: st, log: log, desired: desired, volumes: d.csi}
	d.modes.all()
	return d, nil
}

// newSpace wires the evictor to the daemon's view of desires and uses.
func newSpace(d *Daemon) *space {
	s := &space{cfg: d.cfg, log: d.log, store: d.store, kick: make(chan struct{}, 1), evicted: func(vs []capacity.Victim) { evictionsOf(d).noteEvicted(vs) },
		reservations: map[*reservation]struct{}{}, touched: map[string]time.Time{}, scanUses: map[string][]api.Holder{},
		scanner: &capacity.Scanner{Root: d.store.Root(), Self: os.Getpid()}}
	wanted := func(keep func(api.Desire) bool) func() map[string]bool {
		return func() map[string]bool {
			d.mu.Lock()
			defer d.mu.Unlock()
			out := map[string]bool{}
			for n, ds := range d.desires.merged() {
				out[n] = ds.State != api.StateAbsent && keep(ds)
			}
			return out
		}
	}
	s.evictor = &capacity.Evictor{
		Policy: d.cfg.Capacity, Store: d.store, FS: d.store, Now: time.Now, InUse: d.inUse, Log: d.log.With("component", "evict"),
		Desired:  wanted(func(api.Desire) bool { return true }),
		Declared: wanted(declared),
		Kept:     d.kept,
		// An ad-hoc entry's desire goes before its version does, so
		// nothing pulls it back.
		Evicting: func(v capacity.Victim, p capacity.Pass) error {
			if !v.AdHoc {
				return nil
			}
			return evictionsOf(d).dropAdHoc(v, p.For)
		},
		Evicted: func(v capacity.Victim) {
			s.metrics.evictions.WithLabelValues(v.Reason).Inc()
			d.warming.evicted(v.Name, v.Revision)
		},
		// The partials of a pull being admitted stay.
		Reclaim: func(ctx context.Context, need int64, p capacity.Pass) (int64, error) {
			return s.reclaimIngests(ctx, need, p.Protect...)
		},
	}
	return s
}

// newCSIVolumes wires the volumes to the daemon's desires, views and
// wake-ups.
func newCSIVolumes(d *Daemon, desired func() map[string]api.Desire) *csiVolumes {
	var kept *keptLayers
	if d.cfg.CSI != nil {
		kept = newKeptLayers(d.store.Root(), d.cfg.KeptLayers, d.log)
	}
	return &csiVolumes{cfg: d.cfg, log: d.log, store: d.store, records: d.records, kernels: d.kernels, warming: d.warming,
		writeMu: &d.desires.writeMu, kept: kept,
		host: volumeHost{desired: desired, kick: d.kick,
			changed: func() {
				d.mu.Lock()
				d.notify()
				d.mu.Unlock()
			},
			view: func(name string) (*api.Artifact, error) { return viewsOf(d).view(name, false) }}}
}

// openStore opens the store, running startup repair, and logs what the
// repair did.
func openStore(ctx context.Context, cfg Config, log *slog.Logger, abandoned func(cachestore.IngestInfo) bool) (*cachestore.Store, error) {
	opts := []cachestore.Option{cachestore.WithLogger(log.With("component", "store")), cachestore.WithDirectIO(cfg.DirectIO), cachestore.WithWriteBuffer(int(cfg.WriteBufferSize)),
		cachestore.WithAbandoned(abandoned)}
	if cfg.Hook != nil {
		opts = append(opts, cachestore.WithHook(cfg.Hook))
	}
	st, rep, err := cachestore.Open(ctx, cfg.Root, opts...)
	if err != nil {
		return nil, err
	}
	switch {
	case rep.IndexRebuilt != nil:
		log.Warn("startup repair rebuilt a lost index from the trees on disk; sources, pins and modelctl pull desires are gone (docs/configuration.md: A damaged or lost index)", "report", rep)
	case !rep.Clean():
		log.Info("startup repair", "report", rep)
	case rep.AfterCleanShutdown:
		log.Debug("the store was closed cleanly: startup repair looked at tmp/ and ingest/ only (modelctl verify checks every blob)")
	}
	return st, nil
}

// Run serves until ctx ends: the socket API, metrics, the models-dir
// watcher and the reconciler. It tells systemd READY=1 once the socket
// serves and STOPPING=1 on the way out; on return pulls in flight have
// stopped (their partial data stays for a resume) and the index is closed.
func (d *Daemon) Run(ctx context.Context) error {
	defer d.store.Close()
	defer d.warming.close() // before the store closes: warms read its trees
	ln, err := d.listen()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// Every connection is bounded: its uid's count (peerListener), the
	// time to send a request (headers and body), the time idle between
	// requests, and each write (statusWriter). A handler's context ends
	// when its peer goes. Accept errors such as EMFILE are temporary to
	// http.Server: it logs them and retries after a growing pause (5ms to
	// 1s), without spinning or stopping.
	self := uint32(os.Geteuid())
	pl := newPeerListener(ln, d.cfg.MaxConnectionsPerUID, func(uid uint32) bool { return uid == 0 || uid == self }, d.metrics, d.log)
	d.peers.Store(pl)
	srv := &http.Server{
		Handler: d.routes(), ConnContext: peerContext,
		ReadHeaderTimeout: d.cfg.SocketReadTimeout, ReadTimeout: d.cfg.SocketReadTimeout, IdleTimeout: d.cfg.SocketIdleTimeout,
		ErrorLog: slog.NewLogLogger(d.log.With("component", "api").Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 5)
	if err := d.fanout.Serve(d.store, d.kube(), errc); err != nil {
		ln.Close()
		return err
	}
	defer d.fanout.Close() // after a failed start below

	// The metrics listener opens before the socket answers: a daemon
	// whose socket answers has every listener it needs.
	msrv, err := d.serveMetrics(errc)
	if err != nil {
		ln.Close()
		return err
	}
	go func() { errc <- srv.Serve(pl) }()

	var bg sync.WaitGroup
	if d.cfg.CSI != nil {
		bg.Add(1)
		go func() { defer bg.Done(); errc <- d.csi.serve(ctx) }()
	}
	bg.Add(3)
	go func() { defer bg.Done(); modelsDir{d}.watch(ctx) }()
	go func() { defer bg.Done(); d.space.loop(ctx) }()
	go func() { defer bg.Done(); d.reconcileLoop(ctx) }()
	if c := (clusterNode{d}).syncConfig(); c != nil {
		syncer, err := k8ssync.New(*c, clusterNode{d})
		if err != nil {
			cancel()
			bg.Wait()
			srv.Close()
			d.pulls.Wait() // the reconciler may have started pulls: the store closes after them
			return err
		}
		bg.Add(1)
		go func() { defer bg.Done(); syncer.Run(ctx) }()
		d.log.Info("syncing with the cluster", "node", c.NodeName, "local_pvs", c.LocalPVs)
	}

	d.log.Info("serving", "socket", d.cfg.Socket, "root", d.store.Root(), "version", d.cfg.Version)
	if ok, err := daemon.SdNotify(false, daemon.SdNotifyReady); ok {
		d.log.Info("told systemd READY=1")
	} else if err != nil {
		d.log.Warn("sd_notify", "err", err)
	}
	go d.watchdog(ctx)

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			runErr = err
		}
	}
	daemon.SdNotify(false, daemon.SdNotifyStopping)
	d.log.Info("stopping")
	cancel()
	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	srv.Shutdown(sctx)
	if msrv != nil {
		msrv.Shutdown(sctx)
	}
	d.fanout.Shutdown(sctx)
	bg.Wait()
	d.pulls.Wait() // pulls see ctx end, close their writers (data kept), and return
	return runErr
}

// watchdog pings systemd at half the interval while the store answers.
func (d *Daemon) watchdog(ctx context.Context) {
	interval, err := daemon.SdWatchdogEnabled(false)
	if err != nil || interval == 0 {
		return
	}
	t := time.NewTicker(interval / 2)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if d.healthy() == nil {
				daemon.SdNotify(false, daemon.SdNotifyWatchdog)
			}
		}
	}
}

// listen opens the API socket: a stale socket left by a dead daemon is
// replaced, a live one is an error, and anything that is not a socket is
// never removed.
func (d *Daemon) listen() (net.Listener, error) {
	// Socket activation: systemd passes the listener (modelcached.socket).
	if os.Getenv("LISTEN_FDS") != "" {
		lns, err := activation.Listeners()
		if err != nil {
			return nil, fmt.Errorf("socket activation: %w", err)
		}
		for _, ln := range lns {
			if ln != nil && ln.Addr().Network() == "unix" {
				d.log.Info("serving on the socket systemd passed", "socket", ln.Addr().String())
				d.cfg.Socket = ln.Addr().String()
				return ln, nil
			}
		}
		if d.cfg.SystemdSocket {
			return nil, errors.New("--systemd-socket: systemd passed no unix socket (LISTEN_FDS); is modelcached.socket enabled?")
		}
	} else if d.cfg.SystemdSocket {
		return nil, errors.New("--systemd-socket: no socket from systemd (LISTEN_FDS unset); start modelcached.socket, or drop the flag to listen on --socket")
	}
	path := d.cfg.Socket
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("socket dir: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("--socket %s exists and is not a socket; remove it or choose another path", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("--socket %s: another modelcached is serving there; stop it first", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
		d.log.Info("removed stale socket", "socket", path)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("--socket %s: %w", path, err)
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(true)
	if err := os.Chmod(path, d.cfg.SocketMode); err != nil {
		ln.Close()
		return nil, err
	}
	if d.gid >= 0 {
		if err := os.Chown(path, -1, d.gid); err != nil {
			d.log.Warn("chown socket to its group", "gid", d.gid, "err", err)
		}
	}
	return ln, nil
}

// abandoned is the store's predicate (cachestore.WithAbandoned): which
// partial downloads are abandoned (admission.go says which are kept).
func (d *Daemon) abandoned(in cachestore.IngestInfo) bool {
	if strings.HasPrefix(in.Ref, layerRefPrefix) {
		return true
	}
	if in.Owner == "" {
		return false // written before owners were recorded: reclaimable, not abandoned
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ds, ok := d.desires.merged()[in.Owner]
	return !ok || ds.State == api.StateAbsent
}

// clusterViewLag is how old a daemon's view of who wants a revision may
// be in a cluster: the other nodes' statuses reach it through the elected
// daemon (one status write, then one publish of the ModelCache's
// status.peers). A node that ranks the nodes wanting a revision itself,
// where the cluster recorded no origin nodes yet, waits at least this
// long (fanout.Config.Settle), or every node that got the ModelCache at
// once sees itself alone and goes to the origin.
func clusterViewLag(c *k8ssync.Config) time.Duration {
	status, publish := c.StatusInterval, c.PublishInterval
	if status <= 0 {
		status = k8ssync.DefaultStatusInterval
	}
	if publish <= 0 {
		publish = k8ssync.DefaultPublishInterval
	}
	return status + publish
}

// serveMetrics opens the metrics listener (--metrics-addr; none when it
// is "") and serves /metrics and /healthz on it, its end sent to errc.
func (d *Daemon) serveMetrics(errc chan<- error) (*http.Server, error) {
	if d.cfg.MetricsAddr == "" {
		return nil, nil
	}
	ml, err := net.Listen("tcp", d.cfg.MetricsAddr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-addr %s: %w (is another modelcached running? pass --metrics-addr to pick another port)", d.cfg.MetricsAddr, err)
	}
	msrv := &http.Server{Handler: d.metricsHandler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { errc <- msrv.Serve(ml) }()
	d.metricsAddr.Store(ml.Addr().String())
	d.log.Info("metrics", "addr", ml.Addr().String())
	return msrv, nil
}
