package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
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

// space is admission and eviction: the space admitted pulls may still
// write (reservations), the evictor and its passes (one at a time), the
// partial downloads that may be reclaimed, and the /proc scan of what
// processes hold. Its locks come before the daemon's (daemon.go).
type space struct {
	// Set once in New, read without a lock.
	cfg     Config
	log     *slog.Logger
	store   *cachestore.Store
	metrics *metrics
	evictor *capacity.Evictor // each pass gets its capacity.Pass (evictPass, under evictMu)
	kick    chan struct{}     // asks the loop for a pass now
	// evicted is told what a pass evicted (it takes the daemon lock).
	evicted func([]capacity.Victim)

	capMu        sync.Mutex // admission and reservations
	reservations map[*reservation]struct{}
	evictMu      sync.Mutex // one eviction pass at a time
	scanRun      sync.Mutex // one scan at a time; guards scanner and touched
	scanner      *capacity.Scanner
	touched      map[string]time.Time
	scanMu       sync.Mutex // guards scanUses; taken last of all
	scanUses     map[string][]api.Holder

	lastEviction atomic.Pointer[evictionRecord]
}

// betweenPasses runs fn while no eviction pass runs.
func (s *space) betweenPasses(fn func() error) error {
	s.evictMu.Lock()
	defer s.evictMu.Unlock()
	return fn()
}

// scanned adds what the last /proc scan found to an in-use map.
func (s *space) scanned(out map[string][]api.Holder) {
	s.scanMu.Lock()
	defer s.scanMu.Unlock()
	for k, hs := range s.scanUses {
		out[k] = append(out[k], hs...)
	}
}

// reserved is what admitted pulls may still write.
func (s *space) reserved() int64 {
	s.capMu.Lock()
	defer s.capMu.Unlock()
	return s.reservedLocked()
}

func (s *space) reservedLocked() int64 {
	out, _ := s.reservedBoth()
	return out
}

// reservedBoth returns what admitted pulls may still write (it counts
// against free space, which their written bytes already reduce) and what
// they will add in all (it counts against the quota, since partial
// downloads are not yet store bytes).
func (s *space) reservedBoth() (outstanding, total int64) {
	for r := range s.reservations {
		unknown := r.prog.unknown.Load()
		outstanding += max(r.need-(r.prog.done.Load()-unknown), 0)
		total += r.need + unknown
	}
	return outstanding, total
}

// capacityLoop runs an eviction pass (which scans for use first) every
// interval, and when kicked (a pull finished: an old revision may be free to go).
func (s *space) loop(ctx context.Context) {
	t := time.NewTicker(s.cfg.CapacityInterval)
	defer t.Stop()
	for {
		if n, bytes := s.store.RemoveAbandoned(); n > 0 {
			s.log.Info("removed abandoned partial downloads", "ingests", n, "bytes", bytes)
		}
		if _, err := s.evictPass(ctx, 0); err != nil && ctx.Err() == nil {
			s.log.Warn("eviction pass", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.kick:
		}
	}
}

func (s *space) kickPass() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// evictPass runs the evictor; extra asks for more than the policy needs,
// and protect names artifacts whose versions must stay (a pull being
// admitted for them). Every pass (pressure, admission) first scans /proc,
// so that it decides against what is in use now, not at the last
// interval: a model mapped a moment ago is not a victim (the scan's cost
// is in docs/benchmarks.md).
func (s *space) evictPass(ctx context.Context, extra int64, protect ...string) (*capacity.Report, error) {
	s.evictMu.Lock()
	defer s.evictMu.Unlock()
	if err := s.scan(); err != nil {
		s.log.Warn("in-use scan", "err", err)
	}
	// Making room for a pull: ad-hoc entries may go, never a declared
	// model (that would thrash). Pressure alone may take declared ones.
	p := capacity.Pass{Extra: extra, Protect: protect, SpareDeclared: extra > 0}
	if extra > 0 && len(protect) > 0 {
		p.For = protect[0]
	}
	rep, err := s.evictor.Run(ctx, p)
	if rep != nil && (len(rep.Evicted) > 0 || len(rep.Failed) > 0 || rep.Short > 0) {
		s.lastEviction.Store(&evictionRecord{at: time.Now(), rep: rep})
	}
	if rep != nil && rep.BytesFreed > 0 {
		s.metrics.freedBytes.Add(float64(rep.BytesFreed))
	}
	if rep != nil && len(rep.Evicted) > 0 {
		s.evicted(rep.Evicted)
	}
	return rep, err
}

// admit checks that a pull needing need more bytes fits, reclaiming
// partial downloads and then evicting first when that can make it fit,
// and reserves the space until release. A pull with files of unknown size
// (unknown) gets what is usable beyond need as their budget (prog.budget).
func (s *space) admit(ctx context.Context, name string, need int64, unknown bool, prog *progress) (func(), []capacity.Victim, error) {
	var evicted []capacity.Victim
	release, err := s.admitting(ctx, name, need, unknown, prog, &evicted)
	return release, evicted, err
}

// admitting is admit; what it evicts goes to evicted.
func (s *space) admitting(ctx context.Context, name string, need int64, unknown bool, prog *progress, evicted *[]capacity.Victim) (func(), error) {
	s.capMu.Lock()
	defer s.capMu.Unlock()
	room, err := s.room()
	if err != nil {
		return nil, err
	}
	if need > room || (unknown && need >= room) {
		// Partial downloads no pull is writing go before any version (this
		// pull's own stay: it resumes them). Only where that frees room: a
		// quota counts blobs, not partial downloads.
		if rec := s.reclaimable(name); rec > 0 {
			if more, err := s.roomWith(rec); err == nil && more > room {
				want := need - room
				if unknown {
					want = -1 // sizes unknown: all there is
				}
				if _, err := s.reclaimIngests(ctx, want, name); err != nil {
					return nil, err
				}
				if room, err = s.room(); err != nil {
					return nil, err
				}
			}
		}
	}
	if need > room {
		in, err := s.evictor.Inputs()
		if err != nil {
			return nil, err
		}
		in.Skip = capacity.Protect(in.Artifacts, name)
		in.SpareDeclared = true
		evictable := capacity.Evictable(in)
		if need > room+evictable {
			s.metrics.admissions.WithLabelValues("rejected").Inc()
			_, free, _ := s.store.FSStat()
			return nil, &capacityError{fmt.Sprintf("%s: %s needs %s more; %s free on the filesystem (%s usable under the policy, %s reserved by pulls in flight); evictable now %s (pinned, in-use, declared and younger-than-%s versions are not)%s; free space, raise the quota, or evict or unpin artifacts (modelctl evict, modelctl unpin)",
				api.ReasonInsufficientCapacity, name, api.FormatBytes(need), api.FormatBytes(free), api.FormatBytes(max(room, 0)), api.FormatBytes(s.reservedLocked()), api.FormatBytes(evictable), s.cfg.Capacity.MinAge, takersText(in))}
		}
		rep, err := s.evictPass(ctx, need-max(room, 0), name)
		if rep != nil {
			*evicted = rep.Evicted
		}
		if err != nil {
			return nil, err
		}
		s.metrics.admissions.WithLabelValues("evicted_first").Inc()
	} else {
		s.metrics.admissions.WithLabelValues("admitted").Inc()
	}
	if unknown {
		if room, err = s.room(); err != nil {
			return nil, err
		}
		prog.budget = max(room-need, 0)
	}
	r := &reservation{need: need, prog: prog}
	s.reservations[r] = struct{}{}
	return func() {
		s.capMu.Lock()
		delete(s.reservations, r)
		s.capMu.Unlock()
	}, nil
}

// room is how many bytes a new pull may write under the policy, after
// what admitted pulls have reserved. Called with capMu held.
func (s *space) room() (int64, error) { return s.roomWith(0) }

// roomWith is room as it would be with extra more bytes free on the
// filesystem (partial downloads reclaimed).
func (s *space) roomWith(extra int64) (int64, error) {
	sb, err := s.store.StoreBytes()
	if err != nil {
		return 0, err
	}
	capa, free, err := s.store.FSStat()
	if err != nil {
		return 0, err
	}
	outstanding, total := s.reservedBoth()
	return s.cfg.Capacity.Room(sb+total, capa, free+extra-outstanding), nil
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

// Partial downloads (the store's ingests) are kept only while a pull may
// resume them. Each download records the artifact it was for as the
// ingest's owner. An ingest is:
//   - open while a writer holds it: never touched;
//   - abandoned when its owner has no present desire (evicted, removed
//     from models.d, set absent), or when it is an archive member (those
//     restart with their layer): the store's GC removes it, and the
//     capacity loop runs that sweep every pass and after every pull;
//   - resumable otherwise (a pull that failed for a reason worth retrying,
//     or one that has not restarted since the daemon did): kept, but
//     counted as reclaimable space that eviction and admission free before
//     any artifact version.
// A pull that fails permanently (a full disk, a source that broke its
// word, its budget spent) removes its own partial data at once.

// reclaimIngests frees up to need bytes (need < 0: all) of partial
// downloads that no writer holds open, oldest first, sparing those of the
// artifacts named keep (a pull being admitted resumes its own). It returns
// the bytes freed.
func (s *space) reclaimIngests(ctx context.Context, need int64, keep ...string) (int64, error) {
	list, err := s.store.ListIngests()
	if err != nil {
		return 0, err
	}
	var freed int64
	for _, in := range list {
		if ctx.Err() != nil || (need >= 0 && freed >= need) {
			break
		}
		if in.Open || (in.Owner != "" && slices.Contains(keep, in.Owner)) {
			continue
		}
		if err := s.store.RemoveIngest(in.Ref); err != nil {
			if !errors.Is(err, cachestore.ErrLocked) {
				s.log.Warn("reclaim partial download", "owner", in.Owner, "err", err)
			}
			continue
		}
		s.log.Info("reclaimed a partial download for space", "owner", in.Owner, "bytes", in.Size)
		freed += in.Size
	}
	return freed, ctx.Err()
}

// reclaimable is what reclaimIngests(ctx, -1, keep) would free now.
func (s *space) reclaimable(keep string) int64 {
	list, err := s.store.ListIngests()
	if err != nil {
		return 0
	}
	var n int64
	for _, in := range list {
		if !in.Open && (keep == "" || in.Owner != keep) {
			n += in.Size
		}
	}
	return n
}

// scan reads /proc for processes that hold files of the store, maps them
// to artifact versions, and records their use.
func (s *space) scan() error {
	s.scanRun.Lock() // the loop and an evict may both scan; touched is theirs
	defer s.scanRun.Unlock()
	uses, _, err := s.scanner.Scan()
	if err != nil {
		return err
	}
	found := map[string][]api.Holder{}
	blobs := map[string][]api.Holder{}
	for _, u := range uses {
		if name, rev, ok := capacity.VersionOf(u.Rel); ok {
			h := u.Holder
			h.Revision = rev
			found[capacity.Key(name, rev)] = appendHolder(found[capacity.Key(name, rev)], h)
		} else if dg, ok := capacity.BlobOf(u.Rel); ok {
			blobs[dg] = appendHolder(blobs[dg], u.Holder)
		}
	}
	if len(blobs) > 0 { // opened through blobs/: every version that uses the blob
		arts, err := s.store.List()
		if err != nil {
			return err
		}
		for _, a := range arts {
			for _, v := range a.Versions {
				for _, e := range v.Manifest {
					for _, h := range blobs[e.Digest] {
						h.Revision = v.Revision
						k := capacity.Key(a.Name, v.Revision)
						found[k] = appendHolder(found[k], h)
					}
				}
			}
		}
	}
	now := time.Now()
	for k := range found {
		if now.Sub(s.touched[k]) > time.Minute { // record last use, at most once a minute
			name, rev := splitKey(k)
			if err := s.store.Touch(name, rev); err == nil {
				s.touched[k] = now
			}
		}
	}
	s.scanMu.Lock()
	s.scanUses = found
	s.scanMu.Unlock()
	return nil
}
