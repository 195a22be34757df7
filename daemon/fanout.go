package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	authv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/k8ssync"
	p2p "github.com/modelcache/modelcache/peer"
)

// fanout is the daemon's part in fan-out between nodes (docs/fan-out.md,
// Fan-out between nodes): it serves this node's committed blobs on the
// peer port (handler) and fetches the blobs of a file with a known digest
// and size from the peers that hold them before the origin
// (downloadFanout). Peers come from the ModelCacheNode statuses k8ssync
// hands over (setNodes), or from a static list outside Kubernetes.
//
// In a cluster, only a few nodes go to the origin for one revision, each
// for its share of the blobs (rendezvous hashing of (artifact, blob)):
// the origin nodes the elected daemon recorded with the cluster's
// resolution (api.Desire.OriginNodes, k8ssync/origins.go), less those
// whose status went stale or failed it. Without such a record (an older
// leader, kernel cache images), or once none of them is left, each node
// ranks the nodes that want the artifact (their statuses list it Pending
// or Downloading) by rendezvous hashing of (artifact, node) and the first
// OriginConcurrency go. The others ask their peers until one holds the
// blob, and go to the origin themselves when Wait has passed since their
// pull started (a pull never hangs on a peer). A static fleet cannot tell
// who wants what: its nodes ask every peer first, then the origin.
//
// A nil *fanout is off (viaPeers says no to every file).
type fanout struct {
	cfg     PeerConfig
	cluster bool     // peers from the cluster's statuses; else static
	self    string   // this node's name (cluster) or base URL (static)
	static  []string // the static peers as base URLs, without self
	fetcher *p2p.Fetcher
	metrics *p2p.Metrics
	log     *slog.Logger
	srv     *http.Server // the peer port's, once serve started it
	authz   *peerAuthz   // which node may have which blob (a cluster's); set by serve
	addr    atomic.Value // string: where the peer port listens, once served

	mu      sync.Mutex
	nodes   []k8ssync.ModelCacheNode // the cluster's, as last handed over
	seen    map[string]bool          // the names of every node ever handed over (made by setNodes)
	changed chan struct{}            // closed and replaced when nodes change
	listed  map[string]time.Time     // artifact@revision → since when this node's status lists it
}

// peerStale: a node whose status is older than this is no peer (its
// daemon may be gone). Statuses are written at least hourly.
const peerStale = k8ssync.PeerStale

// maxPeersAsked bounds the peers one blob is asked of.
const maxPeersAsked = 8

func newFanout(cfg Config, log *slog.Logger, m *p2p.Metrics) (*fanout, error) {
	pc := *cfg.Peer
	f := &fanout{cfg: pc, metrics: m, log: log.With("component", "peer"), changed: make(chan struct{}), listed: map[string]time.Time{}}
	tokens := pc.TokenFile
	if pc.StaticTokenFile != "" {
		tokens = pc.StaticTokenFile
		if pc.Advertise != "" {
			f.self, _ = peerBase(pc.Advertise)
		}
		for _, s := range pc.Peers {
			if b, err := peerBase(s); err == nil && b != f.self && !slices.Contains(f.static, b) {
				f.static = append(f.static, b)
			}
		}
	} else {
		f.cluster, f.self = true, cfg.Cluster.NodeName
	}
	var err error
	f.fetcher, err = p2p.NewFetcher(p2p.NewTokenFile(tokens), p2p.WithFetcherLogger(f.log), p2p.WithFetcherMetrics(m))
	return f, err
}

// serve starts the peer port (nothing when f is nil): committed blobs
// to the daemons its authenticator accepts, on an http.Server whose
// connections are bounded (the time to send headers, the time idle; each
// upload's writes by the peer server itself). Serve's end goes to errc.
func (f *fanout) serve(d *Daemon, errc chan<- error) error {
	if f == nil {
		return nil
	}
	h, err := f.handler(d)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", f.cfg.Addr)
	if err != nil {
		return fmt.Errorf("--peer-addr %s: %w (is another modelcached running? pass --peer-addr to pick another port)", f.cfg.Addr, err)
	}
	f.srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(f.log.Handler(), slog.LevelWarn)}
	go func() { errc <- f.srv.Serve(ln) }()
	f.addr.Store(ln.Addr().String())
	f.log.Info("serving blobs to peers", "addr", ln.Addr().String(), "advertise", f.cfg.Advertise)
	return nil
}

// listening is where the peer port listens, "" before serve.
func (f *fanout) listening() string {
	s, _ := f.addr.Load().(string)
	return s
}

// shutdown stops the peer port, letting uploads finish until ctx ends,
// then cutting them; close cuts them at once. Both do nothing when f is
// nil or the port is not served.
func (f *fanout) shutdown(ctx context.Context) {
	if f != nil && f.srv != nil && f.srv.Shutdown(ctx) != nil {
		f.srv.Close()
	}
}

func (f *fanout) close() {
	if f != nil && f.srv != nil {
		f.srv.Close()
	}
}

// advertised is the base URL written to this node's status: "" when f
// is nil or its peers are a static list.
func (f *fanout) advertised() string {
	if f == nil || !f.cluster {
		return ""
	}
	b, _ := peerBase(f.cfg.Advertise)
	return b
}

// handler is the peer port's: the store's committed blobs, to the
// daemons the authenticator accepts (the shared token file, or a
// TokenReview of the daemons' service account). In a cluster each caller
// gets the blobs peerAuthz gives the node its token is bound to; a
// static fleet has no tenancy, and every holder of its shared token gets
// every blob.
func (f *fanout) handler(d *Daemon) (http.Handler, error) {
	var auth p2p.Authenticator
	opts := []p2p.ServerOption{p2p.WithMaxUploads(f.cfg.MaxUploads), p2p.WithUploadRate(float64(f.cfg.UploadRate)),
		p2p.WithServerLogger(f.log), p2p.WithServerMetrics(f.metrics)}
	if f.cfg.StaticTokenFile != "" {
		auth = p2p.StaticTokenAuthenticator{File: p2p.NewTokenFile(f.cfg.StaticTokenFile)}
	} else {
		kc, err := authv1client.NewForConfig(d.cfg.Cluster.Kube)
		if err != nil {
			return nil, fmt.Errorf("peer port: %w", err)
		}
		ns, name, _ := strings.Cut(f.cfg.ServiceAccount, "/")
		if auth, err = p2p.NewTokenReviewAuthenticator(kc.TokenReviews(), p2p.DefaultAudience, ns, name); err != nil {
			return nil, fmt.Errorf("peer port: %w", err)
		}
		sel, err := k8ssync.NewNodeSelection(d.cfg.Cluster.Kube)
		if err != nil {
			return nil, fmt.Errorf("peer port: %w", err)
		}
		f.authz = newPeerAuthz(d, sel)
		opts = append(opts, p2p.WithAuthorizer(f.authz))
	}
	return p2p.NewServer(p2p.StoreBlobs{Store: d.store}, auth, opts...)
}

// viaPeers reports whether file fl of the pull is fetched through the
// peers: a blob of known digest and size, of a desire the cluster
// resolved (in a cluster; a socket pull's digests are its requester's,
// and peers may hold blobs the requester may not read), or of any desire
// in a static fleet.
func (p *pull) viaPeers(fl fetchers.File) bool {
	f := p.d.fanout
	if f == nil || fl.Digest == "" || fl.Size < 0 {
		return false
	}
	if !f.cluster {
		return true
	}
	_, ok := p.clusterDesire()
	return ok
}

// clusterDesire is the cluster's desire of the pull's name as it stands
// now, when it still names the pull's URI.
func (p *pull) clusterDesire() (api.Desire, bool) {
	p.d.mu.Lock()
	cd, ok := p.d.desires.cluster[p.ds.Name]
	p.d.mu.Unlock()
	return cd, ok && cd.URI == p.ds.URI
}

// setNodes takes the cluster's ModelCacheNodes (k8ssync) and wakes the
// pulls that wait for a peer.
func (f *fanout) setNodes(nodes []k8ssync.ModelCacheNode) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes = nodes
	if f.seen == nil {
		f.seen = map[string]bool{}
	}
	for _, n := range nodes {
		f.seen[n.Name] = true
	}
	close(f.changed)
	f.changed = make(chan struct{})
}

// pullPartial is a file's ingest as the peer fetcher writes it: what it
// reads goes through the pull's sink (budget, bandwidth limit, layer
// check, progress), the time spent reading the source is summed, and
// each commit is recorded as download's is.
type pullPartial struct {
	*cachestore.Writer
	ctx    context.Context
	p      *pull
	ref    string
	fl     fetchers.File
	check  *layerCheck
	readNs *int64
}

func (w *pullPartial) ReadFrom(r io.Reader) (int64, error) {
	n, err := w.Writer.ReadFrom(w.p.sinkReader(w.ctx, timedReader{r, w.readNs}, w.fl, w.check, w.Offset()))
	return n, w.p.sinkError(err, w.fl)
}

func (w *pullPartial) Commit(ctx context.Context, size int64, expected string) (string, error) {
	before, t0 := w.Stages(), time.Now()
	d, err := w.Writer.Commit(ctx, size, expected)
	return d, w.p.committed(w.ref, w.Writer, before, time.Since(t0), time.Duration(*w.readNs), err)
}

// meteredBody counts an origin's body in modelcache_fetch_bytes_total.
type meteredBody struct {
	*meteredReader
	io.Closer
}

func (m meteredBody) Close() error {
	m.flush()
	return m.Closer.Close()
}

// downloadFanout is download for a blob of known digest and size: from
// the peers that hold it, then the origin (p2p.Fetcher.Ingest), into
// the same resumable ingest. A node that is not among the first to fetch
// the artifact from the origin asks only its peers, again at each change
// of the statuses or Poll, until plan lets it go to the origin.
func (p *pull) downloadFanout(ctx context.Context, ref string, fl fetchers.File, lease *cachestore.Lease, check *layerCheck) (string, int64, error) {
	d, fo := p.d, p.d.fanout
	blob := p2p.Blob{Digest: fl.Digest, Size: fl.Size}
	opts := cachestore.WriterOpts{Ref: ref, Size: fl.Size, Lease: lease, Check: fl.Check, Owner: p.ds.Name}
	var readNs int64
	var last *cachestore.Writer
	open := func(ctx context.Context) (p2p.Partial, error) {
		w, err := d.store.Writer(ctx, opts)
		if err != nil {
			return nil, err
		}
		if last == nil && w.Resumed() > 0 {
			p.prog.skipped.Add(w.Resumed())
			d.log.Info("resuming download", "ref", ref, "offset", w.Resumed())
		}
		last = w
		return &pullPartial{Writer: w, ctx: ctx, p: p, ref: ref, fl: fl, check: check, readNs: &readNs}, nil
	}
	origin := func(ctx context.Context, off int64) (io.ReadCloser, error) {
		rc, err := p.f.Open(ctx, fl, off)
		if err != nil {
			return nil, err
		}
		rc = fetchers.MinRate(rc, d.cfg.ProgressFloor, d.cfg.ProgressWindow)
		return meteredBody{&meteredReader{r: rc, c: d.metrics.fetchedBytes.WithLabelValues(p.src.scheme)}, rc}, nil
	}
	offset := func() int64 {
		if last == nil {
			return 0
		}
		return last.Offset()
	}
	start, told := time.Now(), false
	for {
		ds := p.ds
		if cd, ok := p.clusterDesire(); ok && cd.Revision == ds.Revision {
			ds.OriginNodes = cd.OriginNodes // recorded since the pull started, maybe
		}
		pl := fo.plan(ds, p.res.Revision, fl.Digest, p.prog.started, time.Now())
		var from p2p.Origin
		if pl.origin {
			from = origin
		}
		var digest string
		final := errNoPeerYet
		if len(pl.peers) > 0 || pl.origin {
			p.backoff.Do(ctx, func(int) error {
				var res p2p.Result
				digest, res, final = fo.fetcher.Ingest(ctx, blob, pl.peers, open, from)
				p.fromPeers(fl.Path, res)
				switch {
				case final == nil:
					return nil
				case errors.Is(final, p2p.ErrNoSource), errors.Is(final, cachestore.ErrDigestMismatch),
					errors.Is(final, cachestore.ErrSizeMismatch), errors.Is(final, syscall.ENOSPC):
					return fetchers.Permanent(final) // no peer has it yet; the origin's own bytes are wrong; a full disk
				}
				return final
			}, p.retrying(ref, fl, offset))
		}
		switch {
		case final == nil:
			fo.authz.fetched(digest, p.ds.Name) // servable to the nodes this artifact may go to before its version commits
			d.metrics.fetchDuration.WithLabelValues(p.src.scheme).Observe(time.Since(start).Seconds())
			if told { // the wait is over: say so where it was said
				p.setPhase(api.PhaseDownloading, fl.Path+": fetched after waiting for a peer")
			}
			return digest, fl.Size, nil
		case errors.Is(final, p2p.ErrNoSource), errors.Is(final, errNoPeerYet):
			if !told {
				told = true
				p.setPhase(api.PhaseDownloading, fmt.Sprintf("%s: waiting for a peer to hold it: %s fetch it from the origin first (--origin-concurrency %d); this node goes to the origin itself at %s if no peer has it by then",
					fl.Path, strings.Join(pl.first, ", "), fo.cfg.OriginConcurrency, pl.until.UTC().Format(time.RFC3339)))
			}
			if err := fo.wait(ctx, p, pl.until); err != nil {
				return "", 0, err
			}
		default:
			d.metrics.fetchErrors.WithLabelValues(p.src.scheme).Inc()
			return "", 0, final
		}
	}
}

// errNoPeerYet: no peer to ask and the origin not yet this node's turn.
var errNoPeerYet = errors.New("no peer holds the blob yet")
