package daemon

import (
	"context"
	"io"
	"sync"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/fanout"
	"github.com/modelcache/modelcache/fetchers"
	p2p "github.com/modelcache/modelcache/peer"
)

// The daemon's side of fan-out (package fanout): the Fleet made and
// served in run.go, the statuses handed over by clusterNode, and here
// what a pull gives a blob's fetch (a fanout.Transfer). The desires'
// access is published for the peer port by desireSet.publish.

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
	if !f.Cluster() {
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
// the peers that hold it, then the origin (fanout.Fleet.Fetch), into the
// same resumable ingest, through the pull's sink.
func (p *pull) downloadFanout(ctx context.Context, ref string, fl fetchers.File, lease *cachestore.Lease, check *layerCheck) (string, int64, error) {
	d := p.d
	// Digest: the peer port serves the bytes written so far (fanout.Fleet.Fetch).
	opts := cachestore.WriterOpts{Ref: ref, Size: fl.Size, Lease: lease, Check: fl.Check, Owner: p.ds.Name, Digest: fl.Digest}
	var readNs int64
	var last *cachestore.Writer
	var origin io.Reader // the origin's reader of the last attempt
	var mu sync.Mutex
	offset := func() int64 {
		if last == nil {
			return 0
		}
		return last.Offset()
	}
	start := time.Now()
	t := fanout.Transfer{
		Blob: p2p.Blob{Digest: fl.Digest, Size: fl.Size}, Path: fl.Path,
		Desire: func() api.Desire {
			ds := p.ds
			if cd, ok := p.clusterDesire(); ok && cd.Revision == ds.Revision {
				ds.OriginNodes = cd.OriginNodes // recorded since the pull started, maybe
			}
			return ds
		},
		Revision: p.res.Revision, Started: p.prog.started,
		Open: func(ctx context.Context) (p2p.Partial, error) {
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
		},
		Origin: func(ctx context.Context, off int64) (io.ReadCloser, error) {
			rc, err := p.f.Open(ctx, fl, off)
			if err != nil {
				return nil, err
			}
			mu.Lock()
			origin = rc
			mu.Unlock()
			rc = fetchers.MinRate(rc, d.cfg.ProgressFloor, d.cfg.ProgressWindow)
			return meteredBody{&meteredReader{r: rc, c: d.metrics.fetchedBytes.WithLabelValues(p.src.scheme)}, rc}, nil
		},
		Backoff: p.backoff, OnRetry: p.retrying(ref, fl, offset),
		Got:     func(res p2p.Result) { p.fromPeers(fl.Path, res) },
		Idle:    p.slot.wait,
		Waiting: func(msg string) { p.setPhase(api.PhaseDownloading, msg) },
	}
	digest, waited, err := d.fanout.Fetch(ctx, t)
	if err != nil {
		if ctx.Err() == nil {
			d.metrics.fetchErrors.WithLabelValues(p.src.scheme).Inc()
		}
		return "", 0, err
	}
	mu.Lock()
	o := origin
	mu.Unlock()
	tellCommitted(o, digest)
	d.metrics.fetchDuration.WithLabelValues(p.src.scheme).Observe(time.Since(start).Seconds())
	if waited { // the wait is over: say so where it was said
		p.setPhase(api.PhaseDownloading, fl.Path+": fetched after waiting for a peer")
	}
	return digest, fl.Size, nil
}
