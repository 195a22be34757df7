package daemon

import (
	"context"
	"sort"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
)

func (d *Daemon) reconcileLoop(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			d.mu.Lock()
			d.arts.cancelAll()
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
	next, absent, flips := d.reconcileLocked(ctx)
	if len(absent) > 0 {
		// One scan for the pass, not one per artifact: a process that
		// opened one since the last scan holds it.
		if err := d.space.scan(); err != nil {
			d.log.Warn("in-use scan before evicting absent artifacts", "err", err)
		}
	}
	for _, name := range absent {
		evictionsOf(d).evictAbsent(ctx, name)
	}
	for name, rev := range flips {
		d.activate(name, rev)
	}
	d.modes.all()
	return next
}

// activate makes a staged version current: the cluster flipped its
// rollout to it (the desire came back without Stage). An index write:
// without the daemon lock.
func (d *Daemon) activate(name, rev string) {
	// Not while an eviction pass runs: it plans from a listing in which
	// rev is not current yet (and kept only as such), and would take it
	// once it is.
	err := d.space.betweenPasses(func() error { return d.store.Activate(name, rev) })
	if err != nil {
		d.log.Warn("rollout: activating a prefetched revision; pulling it again", "artifact", name, "revision", rev, "err", err)
		d.mu.Lock()
		if st := d.arts[name]; st != nil {
			st.force = true
		}
		d.mu.Unlock()
		d.kick()
		return
	}
	d.log.Info("rollout: current moved to the prefetched revision", "artifact", name, "revision", rev)
	d.mu.Lock()
	if st := d.arts[name]; st != nil {
		st.phase, st.message, st.attempts, st.reason = api.PhaseReady, "", 0, ""
	}
	d.notify()
	d.mu.Unlock()
	d.space.kickPass() // the old revision may go (unless held or retained)
}

func (d *Daemon) reconcileLocked(ctx context.Context) (time.Duration, []string, map[string]string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var absent []string
	flips := map[string]string{}
	now := time.Now()
	next := 30 * time.Second
	names := make([]string, 0)
	want := d.desires.merged()
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		ds := want[name]
		st := d.arts.of(name)
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
		if cd, ok := d.desires.cluster[name]; ok && !st.force && !ds.Stage && fingerprint(cd) == fp {
			// Only the cluster stages: another desire that names an old
			// version's source again resolves it anew, as it always did.
			if rev := d.staged(name, fp); rev != "" {
				flips[name] = rev // prefetched: becomes current without a pull
				continue
			}
		}
		if !st.force && d.satisfied(name, fp, ds.Stage) {
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
	return next, absent, flips
}

// satisfied: the current version is Ready and came from this desire (a
// staged desire: any Ready version did).
func (d *Daemon) satisfied(name, fp string, stage bool) bool {
	a, err := d.store.Summary(name)
	if err != nil {
		return false
	}
	for _, v := range a.Versions {
		if v.State == cachestore.StateReady && v.Spec == fp && (stage || v.Revision == a.Current) {
			return true
		}
	}
	return false
}

// staged is the revision of a Ready version of name that this desire
// (fingerprint fp) prefetched and that is not current, "" when there is
// none (a rollout's flip: it becomes current without a pull).
func (d *Daemon) staged(name, fp string) string {
	a, err := d.store.Summary(name)
	if err != nil {
		return ""
	}
	for _, v := range a.Versions {
		if v.Revision == a.Current && v.Spec == fp && v.State == cachestore.StateReady {
			return "" // already current
		}
	}
	for _, v := range a.Versions {
		if v.State == cachestore.StateReady && v.Spec == fp && v.Revision != a.Current {
			return v.Revision
		}
	}
	return ""
}
