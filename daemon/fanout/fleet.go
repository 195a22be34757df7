package fanout

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	authv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"
	"k8s.io/client-go/rest"

	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/k8ssync"
	p2p "github.com/modelcache/modelcache/peer"
)

// Fleet is this node's part in fan-out: it serves this node's committed
// blobs on the peer port (Serve) and fetches the blobs of a file with a
// known digest and size from the peers that hold them before the origin
// (Fetch). Peers come from the ModelCacheNode statuses k8ssync hands
// over (SetNodes), or from a static list outside Kubernetes.
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
// Use New; safe for concurrent use.
type Fleet struct {
	cfg     Config
	cluster bool     // peers from the cluster's statuses; else static
	self    string   // this node's name (cluster) or base URL (static)
	static  []string // the static peers as base URLs, without self
	fetcher *p2p.Fetcher
	metrics *p2p.Metrics
	log     *slog.Logger
	access  Accesses
	srv     *http.Server // the peer port's, once Serve started it
	authz   *Authz       // which node may have which blob (a cluster's); set by Serve
	addr    atomic.Value // string: where the peer port listens, once served
	// tokens is the peer port's TokenReview authenticator (a cluster's),
	// sized by the fleet in SetNodes.
	tokens atomic.Pointer[p2p.TokenReviewAuthenticator]

	mu      sync.Mutex
	nodes   []k8ssync.ModelCacheNode // the cluster's, as last handed over
	seen    map[string]bool          // the names of every node ever handed over (made by SetNodes)
	changed chan struct{}            // closed and replaced when nodes change
	listed  map[string]time.Time     // artifact@revision → since when this node's status lists it
}

// peerStale: a node whose status is older than this is no peer (its
// daemon may be gone). Statuses are written at least hourly.
const peerStale = k8ssync.PeerStale

// MaxPeersAsked bounds the peers one blob is asked of.
const MaxPeersAsked = 8

// Options are what New needs besides the Config.
type Options struct {
	// NodeName is this node's (a cluster's); "" in a static fleet.
	NodeName string
	// Access says what the desires make of each artifact (the peer port's
	// authorizer reads it); nil: no artifact is declared.
	Access Accesses
	// Log is the logger (nil: none); Metrics count the peer port's and
	// the peer fetcher's traffic (nil: none).
	Log     *slog.Logger
	Metrics *p2p.Metrics
}

// New returns the fan-out of a daemon with settings cfg: a cluster's
// when cfg has no StaticTokenFile (peers from SetNodes), else a static
// fleet's (cfg.Peers).
func New(cfg Config, o Options) (*Fleet, error) {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &Fleet{cfg: cfg, metrics: o.Metrics, log: log.With("component", "peer"), access: o.Access,
		changed: make(chan struct{}), listed: map[string]time.Time{}}
	if f.access == nil {
		f.access = &AccessTable{}
	}
	tokens := cfg.TokenFile
	if cfg.StaticTokenFile != "" {
		tokens = cfg.StaticTokenFile
		if cfg.Advertise != "" {
			f.self, _ = PeerBase(cfg.Advertise)
		}
		for _, s := range cfg.Peers {
			if b, err := PeerBase(s); err == nil && b != f.self && !slices.Contains(f.static, b) {
				f.static = append(f.static, b)
			}
		}
	} else {
		f.cluster, f.self = true, o.NodeName
	}
	var err error
	fopts := []p2p.FetcherOption{p2p.WithHTTP(fetchers.WithTransport(peerTransport())), p2p.WithFetcherLogger(f.log), p2p.WithFetcherMetrics(o.Metrics)}
	if cfg.Wait > 0 { // a peer's Retry-After sets it aside no longer than this node waits for peers
		fopts = append(fopts, p2p.WithMaxRetryAfter(cfg.Wait))
	}
	f.fetcher, err = p2p.NewFetcher(p2p.NewTokenFile(tokens), fopts...)
	return f, err
}

// peerDialTimeout bounds a connection to a peer port: peers are on the
// cluster's network, and a node whose daemon is gone (no answer at all,
// not even a refusal) is found within it, not the 30 s of an origin's.
const peerDialTimeout = 5 * time.Second

// peerTransport is the peer fetcher's: the fetchers' default, but a
// peer's connection takes at most peerDialTimeout, and its answer's
// headers at most 10 s more than a request may be held (p2p.MaxWait).
func peerTransport() *http.Transport {
	t := fetchers.DefaultTransport()
	t.DialContext = (&net.Dialer{Timeout: peerDialTimeout, KeepAlive: 30 * time.Second}).DialContext
	t.ResponseHeaderTimeout = p2p.MaxWait + 10*time.Second
	return t
}

// Cluster says whether the peers are the cluster's (SetNodes), not a
// static list.
func (f *Fleet) Cluster() bool { return f.cluster }

// Self is this node's name (a cluster's) or base URL (a static fleet's).
func (f *Fleet) Self() string { return f.self }

// Config is the settings New was given.
func (f *Fleet) Config() Config { return f.cfg }

// SetFetcher replaces the peer fetcher (tests: another progress floor or
// clock); call it before any Fetch.
func (f *Fleet) SetFetcher(p *p2p.Fetcher) { f.fetcher = p }

// AsCluster makes a static fleet's daemon a cluster's node named name
// (tests: real daemons whose statuses a test hands over); call it before
// any Fetch.
func (f *Fleet) AsCluster(name string) { f.cluster, f.self = true, name }

// Serve starts the peer port (nothing when f is nil): the blobs of st,
// committed or being fetched (p2p.Server), to the daemons its authenticator accepts (the shared token file, or
// a TokenReview through kube of the daemons' service account), on an
// http.Server whose connections are bounded (the time to send headers,
// the time idle; each upload's writes by the peer server itself). In a
// cluster each caller gets the blobs Authz gives the node its token is
// bound to; a static fleet has no tenancy, and every holder of its shared
// token gets every blob. Serve's end goes to errc.
func (f *Fleet) Serve(st *cachestore.Store, kube *rest.Config, errc chan<- error) error {
	if f == nil {
		return nil
	}
	if f.cfg.StaticTokenFile != "" {
		return f.listen(st, p2p.StaticTokenAuthenticator{File: p2p.NewTokenFile(f.cfg.StaticTokenFile)}, nil, errc)
	}
	kc, err := authv1client.NewForConfig(kube)
	if err != nil {
		return fmt.Errorf("peer port: %w", err)
	}
	ns, name, _ := strings.Cut(f.cfg.ServiceAccount, "/")
	ta, err := p2p.NewTokenReviewAuthenticator(kc.TokenReviews(), p2p.DefaultAudience, ns, name)
	if err != nil {
		return fmt.Errorf("peer port: %w", err)
	}
	// Every daemon's token has the issuer of this one's: a token of
	// another costs the API server no review.
	if tok, err := p2p.NewTokenFile(f.cfg.TokenFile).Token(); err == nil {
		ta.Issuer = p2p.IssuerOf(tok)
	}
	f.tokens.Store(ta)
	f.mu.Lock()
	ta.SetFleetSize(len(f.nodes))
	f.mu.Unlock()
	sel, err := k8ssync.NewNodeSelection(kube)
	if err != nil {
		return fmt.Errorf("peer port: %w", err)
	}
	return f.listen(st, ta, sel, errc)
}

// listen listens on Config.Addr and serves there (ServeOn).
func (f *Fleet) listen(st *cachestore.Store, auth p2p.Authenticator, sel NodeSelector, errc chan<- error) error {
	ln, err := net.Listen("tcp", f.cfg.Addr)
	if err != nil {
		return fmt.Errorf("--peer-addr %s: %w (is another modelcached running? pass --peer-addr to pick another port)", f.cfg.Addr, err)
	}
	if err := f.ServeOn(ln, st, auth, sel, errc); err != nil {
		ln.Close()
		return err
	}
	return nil
}

// ServeOn is Serve's peer port on ln, with an authenticator and, in a
// cluster, the node selections of Authz given (a simulation's: many
// Fleets in one process, each on its own address, a static token
// authenticating every one); the server's bounds are Serve's. A nil sel
// gives every caller every blob (a static fleet's rule). ln is served
// until Shutdown or Close; Serve's end goes to errc.
func (f *Fleet) ServeOn(ln net.Listener, st *cachestore.Store, auth p2p.Authenticator, sel NodeSelector, errc chan<- error) error {
	opts := []p2p.ServerOption{p2p.WithMaxUploads(f.cfg.MaxUploads), p2p.WithUploadRate(float64(f.cfg.UploadRate)),
		p2p.WithServerLogger(f.log), p2p.WithServerMetrics(f.metrics)}
	if sel != nil {
		f.authz = NewAuthz(st, f.access, sel)
		opts = append(opts, p2p.WithAuthorizer(f.authz))
	}
	h, err := p2p.NewServer(p2p.StoreBlobs{Store: st}, auth, opts...)
	if err != nil {
		return err
	}
	f.srv = &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(f.log.Handler(), slog.LevelWarn)}
	f.srv.RegisterOnShutdown(h.Close) // requests held for a blob end at once, not at their wait's end
	go func() { errc <- f.srv.Serve(ln) }()
	f.addr.Store(ln.Addr().String())
	f.log.Info("serving blobs to peers", "addr", ln.Addr().String(), "advertise", f.cfg.Advertise)
	return nil
}

// Listening is where the peer port listens, "" before Serve.
func (f *Fleet) Listening() string {
	s, _ := f.addr.Load().(string)
	return s
}

// Shutdown stops the peer port, letting uploads finish until ctx ends,
// then cutting them; Close cuts them at once. Both do nothing when f is
// nil or the port is not served.
func (f *Fleet) Shutdown(ctx context.Context) {
	if f != nil && f.srv != nil && f.srv.Shutdown(ctx) != nil {
		f.srv.Close()
	}
}

func (f *Fleet) Close() {
	if f != nil && f.srv != nil {
		f.srv.Close()
	}
}

// Advertised is the base URL written to this node's status: "" when f
// is nil or its peers are a static list.
func (f *Fleet) Advertised() string {
	if f == nil || !f.cluster {
		return ""
	}
	b, _ := PeerBase(f.cfg.Advertise)
	return b
}

// SetNodes takes the cluster's ModelCacheNodes (k8ssync) and wakes the
// fetches that wait for a peer.
func (f *Fleet) SetNodes(nodes []k8ssync.ModelCacheNode) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodes = nodes
	if ta := f.tokens.Load(); ta != nil {
		ta.SetFleetSize(len(nodes)) // the TokenReview cache holds every node's tokens
	}
	if f.seen == nil {
		f.seen = map[string]bool{}
	}
	for _, n := range nodes {
		f.seen[n.Name] = true
	}
	close(f.changed)
	f.changed = make(chan struct{})
}
