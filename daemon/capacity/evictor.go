package capacity

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
)

// Store is what the evictor needs of the store: cachestore's eviction
// role, and every version's manifest for the plan.
type Store interface {
	cachestore.Pruner
	List() ([]cachestore.Artifact, error)
}

// FSStats reports the capacity and free bytes of the store's filesystem.
type FSStats interface {
	FSStat() (capacity, free int64, err error)
}

// Report is what one eviction pass saw and did.
type Report struct {
	Before     Pressure `json:"before"`
	Evicted    []Victim `json:"evicted,omitempty"`
	Failed     []string `json:"failed,omitempty"` // "name@rev: error"
	BytesFreed int64    `json:"bytesFreed"`       // by the GC after the evictions
	// IngestBytesFreed is what Reclaim freed (partial downloads) before
	// any version was considered.
	IngestBytesFreed int64 `json:"ingestBytesFreed,omitempty"`
	// Short is how many bytes pressure wanted freed that no eligible
	// version could give (pinned, in use, too young).
	Short int64 `json:"shortBytes,omitempty"`
}

// Pass is what one eviction pass is asked to do, given to Run: the
// values that differ from pass to pass (the Evictor's fields do not).
type Pass struct {
	// Extra asks for that many bytes on top of the pressure (a pull that
	// is being admitted); 0: the policy's own need.
	Extra int64
	// Protect names artifacts none of whose versions this pass may evict.
	Protect []string
	// SpareDeclared: see Inputs.SpareDeclared.
	SpareDeclared bool
	// For names the artifact this pass makes room for ("": none), for
	// Evicting.
	For string
}

// Evictor runs eviction passes after a policy. Its fields are set once,
// before the first pass; what differs per pass is Run's Pass. Run is safe
// to call from one goroutine at a time; Pressure and Inputs may be called
// concurrently with it.
type Evictor struct {
	Policy  Policy
	Store   Store
	FS      FSStats
	Now     func() time.Time
	InUse   func() map[string][]api.Holder // by Key; nil: nothing in use
	Desired func() map[string]bool         // nil: nothing desired
	// Kept names versions (by Key) that the desires keep besides the
	// current ones, with why: a rollout's prefetched revision, its
	// previous one for retainOld. Nil: none.
	Kept func() map[string]string
	// Declared: see Inputs.Declared; nil: every desired artifact is.
	Declared func() map[string]bool
	Log      *slog.Logger
	// Evicting, when set, is told of each version before it is removed,
	// and of the pass that removes it; an error leaves the version
	// (recorded as failed). The daemon drops an ad-hoc entry's desire
	// there, so nothing pulls it back.
	Evicting func(v Victim, p Pass) error
	// Evicted, when set, is told of every version removed (for metrics).
	Evicted func(v Victim)
	// Reclaim, when set, frees space that is not in any version (partial
	// downloads that no pull is writing now, and none of p.Protect's) and
	// returns the bytes freed; under pressure a pass calls it first,
	// asking for need bytes, and evicts versions only for what is still
	// needed after it.
	Reclaim func(ctx context.Context, need int64, p Pass) (int64, error)
}

// Inputs gathers the state a plan needs.
func (e *Evictor) Inputs() (Inputs, error) {
	arts, err := e.Store.List()
	if err != nil {
		return Inputs{}, err
	}
	in := Inputs{Now: e.Now(), Policy: e.Policy, Artifacts: arts, InUse: map[string][]api.Holder{}, Desired: map[string]bool{}}
	if e.InUse != nil {
		in.InUse = e.InUse()
	}
	if e.Desired != nil {
		in.Desired = e.Desired()
	}
	in.Declared = in.Desired
	if e.Declared != nil {
		in.Declared = e.Declared()
	}
	if e.Kept != nil {
		in.Kept = e.Kept()
	}
	return in, nil
}

// Pressure reads the store and filesystem and assesses them.
func (e *Evictor) Pressure() (Pressure, error) {
	sb, err := e.Store.StoreBytes()
	if err != nil {
		return Pressure{}, err
	}
	capa, free, err := e.FS.FSStat()
	if err != nil {
		return Pressure{}, err
	}
	return e.Policy.Assess(sb, capa, free), nil
}

// Run makes one pass: old revisions beyond KeepRevisions go; under
// pressure, least recently used versions go until the low mark is reached;
// failures are recorded and the pass continues; then GC frees the blobs.
// p says what this pass is for (Pass).
func (e *Evictor) Run(ctx context.Context, p Pass) (*Report, error) {
	extra := p.Extra
	pr, err := e.Pressure()
	if err != nil {
		return nil, err
	}
	rep := &Report{Before: pr}
	if pr.Need > 0 && e.Reclaim != nil {
		// Partial downloads go before any version, even an unwanted one.
		if pr, err = e.reclaim(ctx, pr, p, rep); err != nil {
			return rep, err
		}
	}
	if pr.Need+extra <= 0 {
		// No pressure: only old revisions can be due.
		due, err := e.oldRevisions()
		if err != nil {
			return nil, err
		}
		if !due {
			return rep, nil
		}
	}
	in, err := e.Inputs()
	if err != nil {
		return nil, err
	}
	in.SpareDeclared = p.SpareDeclared
	in.Skip = Protect(in.Artifacts, p.Protect...)
	victims := PlanRevisions(in)
	var done []Victim // evicted so far, their references released in later plans
	var freed int64
	for round := 0; round < 4; round++ {
		var planned int64
		for _, v := range victims {
			planned += v.Bytes
		}
		if need := pr.Need + extra - freed - planned; need > 0 {
			more, got := PlanSpace(in, need, append(append([]Victim(nil), done...), victims...))
			if extra > 0 {
				for i := range more {
					more[i].Reason = ReasonAdmission
				}
			}
			victims = append(victims, more...)
			rep.Short = max(need-got, 0)
		} else {
			rep.Short = 0
		}
		evicted, failed, err := e.evict(ctx, victims, in.Skip, p, rep)
		if err != nil {
			return rep, err
		}
		for _, v := range evicted {
			freed += v.Bytes
		}
		done = append(done, evicted...)
		if !failed {
			break
		}
		victims = nil // plan again around the failures, for what is still needed
	}
	return e.collect(ctx, pr, rep)
}

// reclaim frees partial downloads for pr.Need bytes (Reclaim), counts
// them in rep, and returns the pressure after: pr when nothing was freed.
func (e *Evictor) reclaim(ctx context.Context, pr Pressure, p Pass, rep *Report) (Pressure, error) {
	n, err := e.Reclaim(ctx, pr.Need, p)
	if err != nil && e.Log != nil {
		e.Log.Warn("reclaim partial downloads", "err", err)
	}
	if n <= 0 {
		return pr, nil
	}
	rep.IngestBytesFreed = n
	return e.Pressure()
}

// oldRevisions tells whether some artifact has more than one version, so
// that old revisions may be due. It looks at summaries: manifests are
// read only when some artifact has one.
func (e *Evictor) oldRevisions() (bool, error) {
	sums, err := e.Store.ListSummaries()
	if err != nil {
		return false, err
	}
	for _, a := range sums {
		if len(a.Versions) > 1 {
			return true, nil
		}
	}
	return false, nil
}

// evict removes victims in order, telling Evicting before and Evicted
// after each, and records them in rep. A version that Evicting or the
// store refuses is recorded as failed and added to skip, so a later plan
// passes it by (failed is then true); one already gone is passed over.
// It returns the versions removed, and ctx's error when ctx ends.
func (e *Evictor) evict(ctx context.Context, victims []Victim, skip map[string]bool, p Pass, rep *Report) (evicted []Victim, failed bool, err error) {
	for _, v := range victims {
		if err := ctx.Err(); err != nil {
			return evicted, failed, err
		}
		if e.Evicting != nil {
			if err := e.Evicting(v, p); err != nil {
				rep.Failed = append(rep.Failed, fmt.Sprintf("%s: %v", Key(v.Name, v.Revision), err))
				skip[Key(v.Name, v.Revision)] = true
				failed = true
				continue
			}
		}
		if _, err := e.Store.Evict(ctx, v.Name, v.Revision, false); err != nil {
			if !errors.Is(err, cachestore.ErrNotFound) {
				rep.Failed = append(rep.Failed, fmt.Sprintf("%s: %v", Key(v.Name, v.Revision), err))
				skip[Key(v.Name, v.Revision)] = true
				failed = true
			}
			continue
		}
		evicted = append(evicted, v)
		rep.Evicted = append(rep.Evicted, v)
		if e.Evicted != nil {
			e.Evicted(v)
		}
	}
	return evicted, failed, nil
}

// collect ends a pass: when it removed or failed to remove a version,
// GC frees the blobs no version holds any more; the pass is logged when
// it did or could not do something.
func (e *Evictor) collect(ctx context.Context, pr Pressure, rep *Report) (*Report, error) {
	if len(rep.Evicted) == 0 && len(rep.Failed) == 0 {
		if e.Log != nil && rep.IngestBytesFreed > 0 {
			e.Log.Info("eviction pass", "ingest_bytes_freed", rep.IngestBytesFreed, "short_bytes", rep.Short)
		}
		return rep, nil
	}
	gc, err := e.Store.GC(ctx)
	if err != nil {
		return rep, err
	}
	rep.BytesFreed = gc.BytesFreed
	if e.Log != nil && (len(rep.Evicted) > 0 || len(rep.Failed) > 0 || rep.Short > 0) {
		e.Log.Info("eviction pass", "evicted", len(rep.Evicted), "bytes_freed", rep.BytesFreed, "ingest_bytes_freed", rep.IngestBytesFreed,
			"failed", rep.Failed, "short_bytes", rep.Short, "over_quota", pr.OverQuota, "above_high", pr.AboveHigh)
	}
	return rep, nil
}
