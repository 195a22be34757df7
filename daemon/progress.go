package daemon

import (
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcache/modelcache/api"
)

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
	// the peers, fanout.go), at most maxPeerFiles of them.
	fromPeers atomic.Int64
	peerMu    sync.Mutex
	peerFiles map[string][]string
}

// maxPeerFiles bounds the files a pull's stats name by their peers.
const maxPeerFiles = 1024

// peerStats fills what st (the pull's stats) says of peers.
func (p *progress) peerStats(st *api.PullStats) {
	st.BytesFromPeers = p.fromPeers.Load()
	p.peerMu.Lock()
	defer p.peerMu.Unlock()
	if len(p.peerFiles) > 0 {
		st.FilesFromPeers = maps.Clone(p.peerFiles)
	}
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
