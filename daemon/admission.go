package daemon

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/daemon/capacity"
)

// reservation is the space an admitted pull may still write: need for
// its files of known size, and what its files of unknown size have
// written so far (within their budget).
type reservation struct {
	need int64
	prog *progress
}

// evictionRecord is the last pass that did or wanted something.
type evictionRecord struct {
	at  time.Time
	rep *capacity.Report
}

// capacityError is a pull refused by admission.
type capacityError struct{ msg string }

func (e *capacityError) Error() string { return e.msg }

// reserved is what admitted pulls may still write.
func (d *Daemon) reserved() int64 {
	d.capMu.Lock()
	defer d.capMu.Unlock()
	return d.reservedLocked()
}

func (d *Daemon) reservedLocked() int64 {
	out, _ := d.reservedBoth()
	return out
}

// reservedBoth returns what admitted pulls may still write (it counts
// against free space, which their written bytes already reduce) and what
// they will add in all (it counts against the quota, since partial
// downloads are not yet store bytes).
func (d *Daemon) reservedBoth() (outstanding, total int64) {
	for r := range d.reservations {
		unknown := r.prog.unknown.Load()
		outstanding += max(r.need-(r.prog.done.Load()-unknown), 0)
		total += r.need + unknown
	}
	return outstanding, total
}

// capacityLoop runs an eviction pass (which scans for use first) every
// interval, and when kicked (a pull finished: an old revision may be free to go).
func (d *Daemon) capacityLoop(ctx context.Context) {
	t := time.NewTicker(d.cfg.CapacityInterval)
	defer t.Stop()
	for {
		if n, bytes := d.store.RemoveAbandoned(); n > 0 {
			d.log.Info("removed abandoned partial downloads", "ingests", n, "bytes", bytes)
		}
		if _, err := d.evictPass(ctx, 0); err != nil && ctx.Err() == nil {
			d.log.Warn("eviction pass", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-d.capKick:
		}
	}
}

func (d *Daemon) kickCapacity() {
	select {
	case d.capKick <- struct{}{}:
	default:
	}
}

// evictPass runs the evictor; extra asks for more than the policy needs,
// and protect names artifacts whose versions must stay (a pull being
// admitted for them). Every pass (pressure, admission) first scans /proc,
// so that it decides against what is in use now, not at the last
// interval: a model mapped a moment ago is not a victim (the scan's cost
// is in docs/benchmarks.md).
func (d *Daemon) evictPass(ctx context.Context, extra int64, protect ...string) (*capacity.Report, error) {
	d.evictMu.Lock()
	defer d.evictMu.Unlock()
	if err := d.scan(); err != nil {
		d.log.Warn("in-use scan", "err", err)
	}
	// Making room for a pull: ad-hoc entries may go, never a declared
	// model (that would thrash). Pressure alone may take declared ones.
	p := capacity.Pass{Extra: extra, Protect: protect, SpareDeclared: extra > 0}
	if extra > 0 && len(protect) > 0 {
		p.For = protect[0]
	}
	rep, err := d.evictor.Run(ctx, p)
	if rep != nil && (len(rep.Evicted) > 0 || len(rep.Failed) > 0 || rep.Short > 0) {
		d.lastEviction.Store(&evictionRecord{at: time.Now(), rep: rep})
	}
	if rep != nil && rep.BytesFreed > 0 {
		d.metrics.freedBytes.Add(float64(rep.BytesFreed))
	}
	if rep != nil && len(rep.Evicted) > 0 {
		d.mu.Lock()
		want := d.desired()
		for _, v := range rep.Evicted {
			if v.Reason != capacity.ReasonSpace || v.AdHoc {
				continue // an ad-hoc entry's note says why (dropAdHoc)
			}
			if st := d.arts[v.Name]; st != nil {
				st.message = "evicted for disk space (" + v.Revision + "); pulled again when there is room"
			}
			if ds, ok := want[v.Name]; ok && declared(ds) {
				d.log.Warn("disk pressure evicted a declared artifact; it is pulled again when there is room", "artifact", v.Name, "revision", v.Revision, "bytes", v.Bytes)
			}
		}
		d.notify()
		d.mu.Unlock()
		d.kick()
	}
	return rep, err
}

// admit checks that a pull needing need more bytes fits, reclaiming
// partial downloads and then evicting first when that can make it fit,
// and reserves the space until release. A pull with files of unknown size
// (unknown) gets what is usable beyond need as their budget (prog.budget).
func (d *Daemon) admit(ctx context.Context, name string, need int64, unknown bool, prog *progress) (func(), error) {
	d.capMu.Lock()
	defer d.capMu.Unlock()
	room, err := d.room()
	if err != nil {
		return nil, err
	}
	if need > room || (unknown && need >= room) {
		// Partial downloads no pull is writing go before any version (this
		// pull's own stay: it resumes them). Only where that frees room: a
		// quota counts blobs, not partial downloads.
		if rec := d.reclaimable(name); rec > 0 {
			if more, err := d.roomWith(rec); err == nil && more > room {
				want := need - room
				if unknown {
					want = -1 // sizes unknown: all there is
				}
				if _, err := d.reclaimIngests(ctx, want, name); err != nil {
					return nil, err
				}
				if room, err = d.room(); err != nil {
					return nil, err
				}
			}
		}
	}
	if need > room {
		in, err := d.evictor.Inputs()
		if err != nil {
			return nil, err
		}
		in.Skip = capacity.Protect(in.Artifacts, name)
		in.SpareDeclared = true
		evictable := capacity.Evictable(in)
		if need > room+evictable {
			d.metrics.admissions.WithLabelValues("rejected").Inc()
			_, free, _ := d.store.FSStat()
			return nil, &capacityError{fmt.Sprintf("%s: %s needs %s more; %s free on the filesystem (%s usable under the policy, %s reserved by pulls in flight); evictable now %s (pinned, in-use, declared and younger-than-%s versions are not)%s; free space, raise the quota, or evict or unpin artifacts (modelctl evict, modelctl unpin)",
				api.ReasonInsufficientCapacity, name, api.FormatBytes(need), api.FormatBytes(free), api.FormatBytes(max(room, 0)), api.FormatBytes(d.reservedLocked()), api.FormatBytes(evictable), d.cfg.Capacity.MinAge, takersText(in))}
		}
		if _, err := d.evictPass(ctx, need-max(room, 0), name); err != nil {
			return nil, err
		}
		d.metrics.admissions.WithLabelValues("evicted_first").Inc()
	} else {
		d.metrics.admissions.WithLabelValues("admitted").Inc()
	}
	if unknown {
		if room, err = d.room(); err != nil {
			return nil, err
		}
		prog.budget = max(room-need, 0)
	}
	r := &reservation{need: need, prog: prog}
	d.reservations[r] = struct{}{}
	return func() {
		d.capMu.Lock()
		delete(d.reservations, r)
		d.capMu.Unlock()
	}, nil
}

// room is how many bytes a new pull may write under the policy, after
// what admitted pulls have reserved. Called with capMu held.
func (d *Daemon) room() (int64, error) { return d.roomWith(0) }

// roomWith is room as it would be with extra more bytes free on the
// filesystem (partial downloads reclaimed).
func (d *Daemon) roomWith(extra int64) (int64, error) {
	sb, err := d.store.StoreBytes()
	if err != nil {
		return 0, err
	}
	capa, free, err := d.store.FSStat()
	if err != nil {
		return 0, err
	}
	outstanding, total := d.reservedBoth()
	return d.cfg.Capacity.Room(sb+total, capa, free+extra-outstanding), nil
}

// takersText names what holds the space admission may not free.
func takersText(in capacity.Inputs) string {
	const n = 5
	ts := capacity.Takers(in, n+1)
	if len(ts) == 0 {
		return ""
	}
	var parts []string
	for i, t := range ts {
		if i == n {
			parts = append(parts, "…")
			break
		}
		parts = append(parts, fmt.Sprintf("%s (%s, %s)", t.Name, t.Why, api.FormatBytes(t.Bytes)))
	}
	return "; the space is held by " + strings.Join(parts, ", ")
}
