package daemon

import (
	"context"
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
