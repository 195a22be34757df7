package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sort"
	"sync/atomic"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/capacity"
	"github.com/modelcache/modelcache/fetchers"
)

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

type progress struct {
	done, skipped atomic.Int64
	total         atomic.Int64 // -1 while unknown
	filesDone     atomic.Int32
	filesTotal    atomic.Int32
	started       time.Time

	// What the stages of the pull share besides the counts, set before it
	// starts: the artifact its partial downloads belong to, its share of
	// the pull slots, and the backoff that gives the slot up while it
	// waits. budget is what admission allows its files of unknown size
	// (set before any download starts); unknown is what they have written.
	owner   string
	slot    *slot
	backoff fetchers.Backoff
	budget  int64
	unknown atomic.Int64
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

// fingerprint identifies what a desire asks the store for; a change of it
// means a new pull.
func fingerprint(ds api.Desire) string {
	// The URI as stored: a credential that changes (a rotated token, a
	// new presigned signature) is not a new spec, and one lost in a
	// restart (never written to disk) does not make the desire look new.
	parts := []any{fetchers.RedactURI(ds.URI), ds.Digest, ds.Include, ds.Exclude}
	if ds.Kind == api.KindKernelCache { // models keep the fingerprint they always had
		parts = append(parts, ds.Kind, ds.Signature)
	}
	b, _ := json.Marshal(parts)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// desired merges the sources: a file desire wins over a cluster one, which
// wins over an API one.
// Called with d.mu held.
func (d *Daemon) desired() map[string]api.Desire {
	out := make(map[string]api.Desire, len(d.apiDesires)+len(d.fileDesires)+len(d.clusterDesires))
	for n, ds := range d.apiDesires {
		out[n] = ds
	}
	for n, ds := range d.clusterDesires {
		out[n] = ds
	}
	for n, ds := range d.fileDesires {
		out[n] = ds
	}
	// Expand in name order: where two models name the same kernel cache,
	// the same one wins every time (a declared model over a socket one,
	// then the first by name), so pulls do not flip between them.
	var models []string
	for n, ds := range out {
		if len(ds.KernelCaches) > 0 {
			models = append(models, n)
		}
	}
	sort.Strings(models)
	for _, n := range models {
		expandKernelCaches(out, out[n])
	}
	return out
}

// notify wakes every waiter; called with d.mu held.
func (d *Daemon) notify() {
	close(d.changed)
	d.changed = make(chan struct{})
}

// kick asks the reconciler for a pass now.
func (d *Daemon) kick() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

func (d *Daemon) reconcileLoop(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			d.mu.Lock()
			for _, st := range d.arts {
				if st.cancel != nil {
					st.cancel()
				}
			}
			d.mu.Unlock()
			return
		case <-t.C:
		case <-d.wake:
		}
		next := d.reconcile(ctx)
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(next)
	}
}

// reconcile makes one pass over the desired set and returns how long until
// the next pass is due (the nearest retry, at most 30s).
//
// Evictions of absent artifacts (tree removal, an index fsync) run after
// the pass, without the daemon lock, so API reads never wait for them.
func (d *Daemon) reconcile(ctx context.Context) time.Duration {
	next, absent := d.reconcileLocked(ctx)
	for _, name := range absent {
		d.evictAbsent(ctx, name)
	}
	return next
}

func (d *Daemon) reconcileLocked(ctx context.Context) (time.Duration, []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var absent []string
	now := time.Now()
	next := 30 * time.Second
	names := make([]string, 0)
	want := d.desired()
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		ds := want[name]
		st := d.arts[name]
		if st == nil {
			st = &artState{phase: api.PhasePending}
			d.arts[name] = st
		}
		fp := fingerprint(ds)
		if ds.State == api.StateAbsent {
			if st.cancel != nil {
				st.cancel()
				continue
			}
			absent = append(absent, name)
			continue
		}
		if st.cancel != nil {
			if st.spec != fp {
				st.cancel() // the desire changed under the pull: restart with the new one
			}
			continue
		}
		if !st.force && d.satisfied(name, fp) {
			if st.phase != api.PhaseReady {
				st.phase, st.message, st.attempts = api.PhaseReady, "", 0
				d.notify()
			}
			continue
		}
		if st.phase == api.PhaseIncompatible && !st.force && st.spec == fp {
			continue // the GPUs do not change while the daemon runs
		}
		if st.phase == api.PhaseFailed && st.permanent && !st.force && st.spec == fp {
			continue // a typo'd repo, branch or URI: asking again the same way cannot help
		}
		if st.phase == api.PhaseFailed && !st.force && st.spec == fp && now.Before(st.nextRetry) {
			if w := st.nextRetry.Sub(now); w < next {
				next = w
			}
			continue
		}
		d.startPull(ctx, ds, st, fp)
	}
	return next, absent
}

// satisfied: the current version is Ready and came from this desire.
func (d *Daemon) satisfied(name, fp string) bool {
	a, err := d.store.Summary(name)
	if err != nil || len(a.Versions) == 0 || a.Versions[0].Revision != a.Current {
		return false
	}
	v := a.Versions[0]
	return v.State == cachestore.StateReady && v.Spec == fp
}

func (d *Daemon) evictAbsent(ctx context.Context, name string) {
	// say sets the artifact's message (and phase) under the lock, if it is
	// still desired absent: the desire may have changed meanwhile.
	say := func(phase api.Phase, msg string, log bool) {
		d.mu.Lock()
		defer d.mu.Unlock()
		st := d.arts[name]
		if ds, ok := d.desired()[name]; st == nil || !ok || ds.State != api.StateAbsent || st.message == msg {
			return
		}
		if phase != "" {
			st.phase = phase
		}
		st.message = msg
		if log {
			d.log.Warn("evict absent artifact", "artifact", name, "err", msg)
		}
		d.notify()
	}
	if _, err := d.store.Summary(name); errors.Is(err, cachestore.ErrNotFound) {
		say(api.PhasePending, "absent", false)
		return
	}
	// What a lease, a process or a pod holds stays until they let go.
	if hs := holdersOf(d.inUse(), name); len(hs) > 0 {
		msg := fmt.Sprintf("desired absent; kept while in use by %s %s", hs[0].Kind, hs[0].ID)
		if len(hs) > 1 {
			msg += fmt.Sprintf(" and %d more", len(hs)-1)
		}
		say("", msg, false)
		return
	}
	revs, err := d.store.Evict(ctx, name, "", false)
	if err != nil {
		say("", fmt.Sprintf("desired absent but not evicted: %v", err), true)
		return
	}
	d.log.Info("evicted absent artifact", "artifact", name, "revisions", revs)
	d.metrics.evictions.WithLabelValues(capacity.ReasonAbsent).Add(float64(len(revs)))
	say(api.PhasePending, "absent", false)
	go d.gc(context.WithoutCancel(ctx))
}

func (d *Daemon) gc(ctx context.Context) {
	if rep, err := d.store.GC(ctx); err != nil {
		d.log.Warn("gc", "err", err)
	} else if rep.BlobsRemoved > 0 {
		d.log.Info("gc", "blobs_removed", rep.BlobsRemoved, "bytes_freed", rep.BytesFreed)
	}
}

// startPull launches a pull; called with d.mu held.
func (d *Daemon) startPull(ctx context.Context, ds api.Desire, st *artState, fp string) {
	pctx, cancel := context.WithCancel(ctx)
	st.cancel, st.spec, st.force, st.permanent = cancel, fp, false, false
	st.done = make(chan struct{})
	st.phase, st.message = api.PhasePending, "waiting for a pull slot"
	st.prog = &progress{started: time.Now(), owner: ds.Name, slot: &slot{sem: d.pullSem}, backoff: d.backoff}
	st.prog.backoff.Sleep = st.prog.slot.sleeper(d.backoff.Sleep)
	st.prog.total.Store(-1)
	prog := st.prog
	d.notify()
	d.pulls.Add(1)
	go func() {
		defer d.pulls.Done()
		defer cancel()
		err := d.runPull(pctx, ds, fp, st, prog)
		d.finishPull(ctx, pctx, ds, st, err)
	}()
}

// permanentReason is the reason for a failure a retry cannot fix, or "".
func permanentReason(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, fetchers.ErrNotFound):
		return api.ReasonSourceNotFound
	case errors.Is(err, fetchers.ErrUnauthorized):
		return api.ReasonAccessDenied
	case errors.Is(err, fetchers.ErrBadSource), errors.Is(err, fetchers.ErrUnsupported):
		return api.ReasonInvalidSource
	}
	return ""
}

// unknownHostAttempts is how many pulls in a row DNS must deny a source's
// host before it counts as a typo (permanent): a resolver that is briefly
// down at boot answers "no such host" too, now and then.
const unknownHostAttempts = 3

// failureReason is permanentReason, plus a host DNS has denied for
// unknownHostAttempts pulls in a row (attempt counts this one).
func failureReason(err error, attempt int) string {
	if r := permanentReason(err); r != "" {
		return r
	}
	var de *net.DNSError
	if errors.As(err, &de) && de.IsNotFound && attempt >= unknownHostAttempts {
		return api.ReasonSourceNotFound
	}
	return ""
}

func (d *Daemon) finishPull(ctx, pctx context.Context, ds api.Desire, st *artState, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st.cancel = nil
	close(st.done)
	st.completed++
	st.lastErr = nil // a failure sets it below; a cancelled or incompatible pull leaves the phase to speak
	if err != nil {
		err = redactedError{err} // the message is shown (status, waiters, events) and stored
	}
	scheme, _ := fetchers.Scheme(ds.URI)
	switch {
	case err == nil:
		st.phase, st.message, st.attempts, st.reason = api.PhaseReady, "", 0, ""
		st.nextRetry = time.Time{}
		if st.prog != nil {
			el := time.Since(st.prog.started).Seconds()
			st.last = &api.PullStats{Seconds: el, BytesFetched: st.prog.done.Load(), At: time.Now().UTC()}
			if el > 0 {
				st.last.BytesPerSecond = float64(st.last.BytesFetched) / el
			}
		}
		d.metrics.pulls.WithLabelValues(scheme, "ok").Inc()
		d.log.Info("pulled", "artifact", ds.Name, "uri", ds.URI)
	case pctx.Err() != nil && ctx.Err() != nil:
		st.phase, st.message = api.PhasePending, "daemon stopping; the pull resumes at the next start"
	case pctx.Err() != nil:
		st.phase, st.message = api.PhasePending, "restarting: the desire changed"
		d.kick()
	case failureReason(err, st.attempts+1) != "":
		st.attempts++
		st.phase, st.message, st.reason = api.PhaseFailed, err.Error(), failureReason(err, st.attempts)
		st.permanent, st.nextRetry, st.lastErr = true, time.Time{}, err
		d.metrics.pulls.WithLabelValues(scheme, "failed").Inc()
		d.log.Error("pull failed; not retried until the desire changes or 'modelctl pull' asks again ('modelctl evict NAME' drops the desire)",
			"artifact", ds.Name, "uri", ds.URI, "reason", st.reason, "err", err)
		if a, gerr := d.store.Summary(ds.Name); gerr == nil && len(a.Versions) > 0 && a.Versions[0].State != cachestore.StateReady {
			d.store.SetState(ds.Name, a.Versions[0].Revision, cachestore.StateFailed, "re-fetch failed: "+err.Error())
		}
	case errors.As(err, new(*incompatibleError)):
		st.phase, st.message, st.reason, st.attempts = api.PhaseIncompatible, err.Error(), api.ReasonIncompatible, 0
		d.metrics.pulls.WithLabelValues(scheme, "incompatible").Inc()
		d.log.Info("kernel cache incompatible with this node's GPUs; not downloaded", "artifact", ds.Name, "uri", ds.URI, "why", err)
	default:
		st.attempts++
		delay := d.cfg.RetryInitial << min(st.attempts-1, 16)
		if delay > d.cfg.RetryMax || delay <= 0 {
			delay = d.cfg.RetryMax
		}
		delay = delay/2 + rand.N(delay/2+1)
		st.phase, st.message, st.reason = api.PhaseFailed, err.Error(), api.ReasonPullFailed
		var ce *capacityError
		if errors.As(err, &ce) {
			st.reason = api.ReasonInsufficientCapacity
		}
		if errors.As(err, new(*signatureError)) {
			st.reason = api.ReasonSignatureFailed
		}
		st.nextRetry = time.Now().Add(delay)
		st.lastErr = err
		d.metrics.pulls.WithLabelValues(scheme, "failed").Inc()
		d.log.Error("pull failed", "artifact", ds.Name, "uri", ds.URI, "attempt", st.attempts, "retry_in", delay.Round(time.Second), "err", err)
		// A version that lost its blobs and cannot be re-fetched says why.
		if a, gerr := d.store.Summary(ds.Name); gerr == nil && len(a.Versions) > 0 && a.Versions[0].State != cachestore.StateReady {
			d.store.SetState(ds.Name, a.Versions[0].Revision, cachestore.StateFailed, "re-fetch failed: "+err.Error())
		}
		d.kick()
	}
	d.notify()
	// An old revision may be free to go, or a partial download abandoned.
	d.kickCapacity()
}
