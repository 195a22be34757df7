package fanout_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/fanout"
	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/k8ssync"
	p2p "github.com/modelcache/modelcache/peer"
)

// The fleet simulation of BenchmarkFleetBytes: per node, the real
// fan-out (fanout.Fleet: Plan, Fetch, the peer port with Authz over the
// store's committed and growing blobs) behind the daemon a k8ssync loop
// drives (simDaemon, a k8ssync.Node), its own store, its own loopback
// address, and a modelled link (its downloads through one rate limiter,
// its uploads through the peer port's --peer-upload-rate); one origin
// for all, throttled and counting the bytes it sends.

// simModel is the model every node pulls: blobs of random bytes.
type simModel struct {
	blobs [][]byte
	files []simFile
	size  int64
}

// simFile is one blob of the model as a pull knows it.
type simFile struct {
	path, digest string
	size         int64
}

// newSimModel is a model of size bytes in n blobs (seeded: the same each
// run).
func newSimModel(size int64, n int) *simModel {
	m := &simModel{}
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], uint64(size)*31+uint64(n))
	r := rand.NewChaCha8(seed)
	for i := range n {
		b := make([]byte, size/int64(n))
		r.Read(b)
		m.blobs = append(m.blobs, b)
		m.files = append(m.files, simFile{path: fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, n), digest: cachestore.DigestBytes(b), size: int64(len(b))})
		m.size += int64(len(b))
	}
	return m
}

// simOrigin serves the model's blobs at /<digest> (one Range bytes=N-
// honoured), all its answers through one rate limiter (a throttled hub),
// and counts what it sends.
type simOrigin struct {
	blobs map[string][]byte
	limit *rate.Limiter
	sent  atomic.Int64
	reqs  atomic.Int64
	// first and last are when the first request came and the last
	// answer ended (UnixNano).
	first, last atomic.Int64
	url         string
	srv         *http.Server
}

func startOrigin(m *simModel, bps float64) (*simOrigin, error) {
	o := &simOrigin{blobs: map[string][]byte{}, limit: rate.NewLimiter(rate.Limit(bps), 64<<10)}
	for i, f := range m.files {
		o.blobs[f.digest] = m.blobs[i]
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	o.url = "http://" + ln.Addr().String()
	o.srv = &http.Server{Handler: o}
	go o.srv.Serve(ln)
	return o, nil
}

func (o *simOrigin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	o.reqs.Add(1)
	o.first.CompareAndSwap(0, time.Now().UnixNano())
	defer func() { o.last.Store(time.Now().UnixNano()) }()
	b, ok := o.blobs[strings.TrimPrefix(r.URL.Path, "/")]
	if !ok {
		http.NotFound(w, r)
		return
	}
	var off int64
	if rng := r.Header.Get("Range"); rng != "" {
		s, _ := strings.CutSuffix(strings.TrimPrefix(rng, "bytes="), "-")
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 || n >= int64(len(b)) {
			http.Error(w, "bad range", http.StatusRequestedRangeNotSatisfiable)
			return
		}
		off = n
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", off, len(b)-1, len(b)))
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(b)-int(off)))
	if off > 0 {
		w.WriteHeader(http.StatusPartialContent)
	}
	n, _ := io.Copy(w, fetchers.RateLimited(r.Context(), bytes.NewReader(b[off:]), o.limit))
	o.sent.Add(n)
}

// open is a pull's Origin for one blob.
func (o *simOrigin) open(digest string) p2p.Origin {
	return func(ctx context.Context, off int64) (io.ReadCloser, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, o.url+"/"+digest, nil)
		if err != nil {
			return nil, err
		}
		if off > 0 {
			req.Header.Set("Range", fmt.Sprintf("bytes=%d-", off))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusPartialContent {
			resp.Body.Close()
			return nil, fmt.Errorf("origin: %s", resp.Status)
		}
		return resp.Body, nil
	}
}

// simDaemon is one node's daemon as the k8ssync loop sees it (a
// k8ssync.Node): a cluster desire with a revision starts a pull of the
// model through its fanout.Fleet, each blob a fanout.Transfer as
// daemon/fanout.go makes it (the partial ingest of its store, the
// origin), the version committed when every blob is; the peer view the
// loop hands over goes to the Fleet (SetNodes).
type simDaemon struct {
	name   string
	st     *cachestore.Store
	fleet  *fanout.Fleet
	access *fanout.AccessTable
	link   *rate.Limiter // this node's downloads
	model  *simModel
	origin *simOrigin
	ctx    context.Context

	mu      sync.Mutex
	changed chan struct{}
	desire  api.Desire
	art     *api.Artifact
	started time.Time // the desire with a revision arrived
	readyAt time.Time
	err     error
}

func (n *simDaemon) notifyLocked() {
	close(n.changed)
	n.changed = make(chan struct{})
}

func (n *simDaemon) SetClusterDesires(want map[string]api.Desire, _ map[string]map[string]string) error {
	acc := map[string]fanout.Access{}
	for name := range want {
		acc[name] = fanout.Access{Public: true} // no credentials: public bytes
	}
	n.access.Set(acc)
	n.mu.Lock()
	defer n.mu.Unlock()
	for name, ds := range want {
		if ds.State == api.StateAbsent || ds.Revision == "" {
			continue
		}
		n.desire = ds
		if n.art != nil {
			continue // one revision per run
		}
		n.started = time.Now()
		n.art = &api.Artifact{Name: name, Kind: api.KindModel, Phase: api.PhaseDownloading, Revision: ds.Revision, Source: ds.URI,
			Bytes: n.model.size, Progress: &api.Progress{Started: n.started}}
		n.notifyLocked()
		go n.pull(ds)
	}
	return nil
}

// pull fetches every blob of the model (4 at once, as --files-per-pull)
// and commits the version.
func (n *simDaemon) pull(ds api.Desire) {
	var wg sync.WaitGroup
	errs := make([]error, len(n.model.files))
	sem := make(chan struct{}, 4)
	for i, f := range n.model.files {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			_, _, errs[i] = n.fleet.Fetch(n.ctx, n.transfer(ds, f))
		}()
	}
	wg.Wait()
	var m cachestore.Manifest
	for _, f := range n.model.files {
		m = append(m, cachestore.Entry{Path: f.path, Digest: f.digest, Size: f.size})
	}
	var err error
	for _, e := range errs {
		if e != nil && err == nil {
			err = e
		}
	}
	if err == nil {
		_, err = n.st.CommitVersion(n.ctx, cachestore.VersionSpec{Name: ds.Name, Revision: ds.Revision, Source: ds.URI, Manifest: m})
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.err = err
	if err != nil {
		n.art.Phase, n.art.Message = api.PhaseFailed, err.Error()
	} else {
		n.art.Phase, n.art.Path, n.art.Progress = api.PhaseReady, "/var/lib/modelcache/models/"+ds.Name+"/current", nil
		n.readyAt = time.Now()
	}
	n.notifyLocked()
}

// transfer is blob f of the pull as daemon/fanout.go's downloadFanout
// makes it: the desire as it stands (its origin nodes, recorded maybe
// after the pull started), the store's partial ingest (through this
// node's link), the origin.
func (n *simDaemon) transfer(ds api.Desire, f simFile) fanout.Transfer {
	return fanout.Transfer{
		Blob: p2p.Blob{Digest: f.digest, Size: f.size}, Path: f.path, Revision: ds.Revision, Started: n.started,
		Desire: func() api.Desire {
			n.mu.Lock()
			defer n.mu.Unlock()
			return n.desire
		},
		Open: func(ctx context.Context) (p2p.Partial, error) {
			w, err := n.st.Writer(ctx, cachestore.WriterOpts{Ref: ds.Name + ":" + f.digest, Size: f.size, Owner: ds.Name, Digest: f.digest})
			if err != nil {
				return nil, err
			}
			return &linkPartial{Writer: w, ctx: ctx, link: n.link}, nil
		},
		Origin:  n.origin.open(f.digest),
		Backoff: fetchers.Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second, Attempts: 5},
	}
}

// linkPartial is a partial ingest whose bytes come through the node's
// link (its download rate).
type linkPartial struct {
	*cachestore.Writer
	ctx  context.Context
	link *rate.Limiter
}

func (w *linkPartial) ReadFrom(r io.Reader) (int64, error) {
	return w.Writer.ReadFrom(fetchers.RateLimited(w.ctx, r, w.link))
}

func (n *simDaemon) Artifacts() ([]api.Artifact, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.art == nil {
		return nil, nil
	}
	a := *n.art
	if a.Progress != nil {
		p := *a.Progress
		a.Progress = &p
	}
	return []api.Artifact{a}, nil
}

func (n *simDaemon) StatusNow() (*api.Status, error) {
	return &api.Status{StoreBytes: n.model.size, FSCapacityBytes: 1 << 40, FSFreeBytes: 1 << 39}, nil
}
func (n *simDaemon) GPUs() api.GPUInventory { return api.GPUInventory{Source: "simulated"} }
func (n *simDaemon) Root() string           { return "/var/lib/modelcache" }
func (n *simDaemon) Changed() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.changed
}
func (n *simDaemon) SetPodHolders(map[string][]api.Holder, map[string]string) {}

// Resolve pins the model at one revision (the elected daemon's).
func (n *simDaemon) Resolve(_ context.Context, ds api.Desire, _ map[string]string) (string, string, error) {
	return simRevision, ds.URI, nil
}

func (n *simDaemon) SetPeerNodes(nodes []k8ssync.ModelCacheNode) { n.fleet.SetNodes(nodes) }

const simRevision = "0123456789abcdef0123456789abcdef01234567"

// publicOnly is Authz's node selection where every artifact is public:
// never asked.
type publicOnly struct{}

func (publicOnly) Selects(context.Context, string, string) (bool, error)         { return false, nil }
func (publicOnly) From(context.Context, k8ssync.Bound, netip.Addr) (bool, error) { return false, nil }
