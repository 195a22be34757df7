package daemon

import (
	"context"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcache/modelcache/api"
)

// pullStates is what the daemon knows of each artifact beyond the index,
// by name: its phase, the pull in flight and the last one's outcome. The
// reconciler and the pulls write it; the views, the waits, the evictions
// and the cluster's statuses read it. It has no lock of its own: the
// daemon lock (Daemon.mu) guards it and its states' fields, because the
// views read it together with the desires, as one snapshot.
type pullStates map[string]*artState

// of is name's state, made Pending when there is none yet.
func (ps pullStates) of(name string) *artState {
	st := ps[name]
	if st == nil {
		st = &artState{phase: api.PhasePending}
		ps[name] = st
	}
	return st
}

// cancelAll cancels every pull in flight.
func (ps pullStates) cancelAll() {
	for _, st := range ps {
		if st.cancel != nil {
			st.cancel()
		}
	}
}

// artState is what the daemon knows of a name beyond the index.
type artState struct {
	phase     api.Phase
	message   string
	attempts  int
	nextRetry time.Time
	spec      string               // fingerprint of the desire of the pull in flight or last pulled
	cancel    context.CancelFunc   // set while a pull is in flight
	done      chan struct{}        // closed when that pull has finished
	force     bool                 // re-resolve even when satisfied (an explicit pull)
	completed uint64               // pulls finished (either way); waiters watch it
	lastErr   error                // outcome of the last finished pull
	reason    string               // machine-readable cause of Failed or Incompatible
	permanent bool                 // Failed for a cause a retry cannot fix: not retried until the desire changes or a pull asks again
	kc        *api.KernelCacheInfo // what the last kernel-cache pull checked
	last      *api.PullStats       // the last successful pull
	prog      *progress
}

// flight is one download of one blob; pulls that want the same blob wait
// for it instead of fetching it again.
type flight struct {
	done    chan struct{}
	digest  string
	size    int64
	err     error
	waiters int // pulls waiting for it; under d.mu
}

// progress is how far a pull got: what views show, and what admission
// counts against its reservation.
type progress struct {
	done, skipped atomic.Int64
	total         atomic.Int64 // -1 while unknown
	filesDone     atomic.Int32
	filesTotal    atomic.Int32
	started       time.Time

	// budget is what admission allows the pull's files of unknown size
	// (set before any download starts); unknown is what they have written.
	budget  int64
	unknown atomic.Int64

	// fromPeers: the bytes peers sent, and the files they came to (path →
	// the peers, package fanout): every such file of the pull, for its
	// version's manifest; the stats name at most maxPeerFiles.
	fromPeers atomic.Int64
	peerMu    sync.Mutex
	peerFiles map[string][]string
	// transports: how the source sent each file it said so of (path →
	// api.TransportXet or api.TransportResolve), under peerMu.
	transports map[string]string
}

// maxPeerFiles bounds the files a pull's stats name by their peers.
const maxPeerFiles = 1024

// peerStats fills what st (the pull's stats) says of peers.
func (p *progress) peerStats(st *api.PullStats) {
	st.BytesFromPeers = p.fromPeers.Load()
	p.peerMu.Lock()
	defer p.peerMu.Unlock()
	for _, path := range slices.Sorted(maps.Keys(p.peerFiles)) {
		if len(st.FilesFromPeers) == maxPeerFiles {
			break
		}
		if st.FilesFromPeers == nil {
			st.FilesFromPeers = map[string][]string{}
		}
		st.FilesFromPeers[path] = slices.Clone(p.peerFiles[path])
	}
}

// peersOf is the peers that sent bytes of file path in this pull (nil:
// the origin sent them all, or none were fetched).
func (p *progress) peersOf(path string) []string {
	p.peerMu.Lock()
	defer p.peerMu.Unlock()
	return slices.Clone(p.peerFiles[path])
}

// setTransport records how the source sent file path (a reader's
// Transport, download.go); a value other than the known ones is dropped,
// so nothing a source says unbounded reaches the index.
func (p *progress) setTransport(path, t string) {
	if t != api.TransportXet && t != api.TransportResolve {
		return
	}
	p.peerMu.Lock()
	defer p.peerMu.Unlock()
	if p.transports == nil {
		p.transports = map[string]string{}
	}
	p.transports[path] = t
}

// transportOf is how the source sent file path in this pull; "" when it
// did not say, or the file was not fetched.
func (p *progress) transportOf(path string) string {
	p.peerMu.Lock()
	defer p.peerMu.Unlock()
	return p.transports[path]
}

func (p *progress) view() *api.Progress {
	if p == nil {
		return nil
	}
	v := &api.Progress{
		BytesDone: p.done.Load(), BytesSkipped: p.skipped.Load(), BytesTotal: p.total.Load(),
		FilesDone: int(p.filesDone.Load()), FilesTotal: int(p.filesTotal.Load()), Started: p.started,
	}
	if el := time.Since(p.started).Seconds(); el > 0 {
		v.BytesPerSecond = float64(v.BytesDone) / el
	}
	return v
}
