package capacity

import (
	"math"
	"sort"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
)

// Eviction reasons, as metrics and logs name them.
const (
	ReasonSpace  = "space"  // disk pressure or quota
	ReasonAge    = "age"    // an old revision beyond KeepRevisions
	ReasonAbsent = "absent" // the desire says absent
	ReasonManual = "manual" // modelctl evict
	// ReasonAdmission: chosen to make room for a pull being admitted
	// (never a declared model).
	ReasonAdmission = "admission"
)

// Key names a version in in-use maps: "name@revision".
func Key(name, rev string) string { return name + "@" + rev }

// Victim is a version chosen for eviction, with the bytes its removal
// frees (blobs no remaining version uses).
type Victim struct {
	Name     string `json:"name"`
	Revision string `json:"revision"`
	Reason   string `json:"reason"`
	Bytes    int64  `json:"bytes"`
	// AdHoc: the current version of an ad-hoc entry (desired by a plain
	// modelctl pull); its desire goes with it.
	AdHoc bool `json:"adHoc,omitempty"`
}

// Inputs is what a plan is made from. Desired names artifacts that a
// present desire wants: their current versions go last, those Declared
// last of all.
type Inputs struct {
	Now       time.Time
	Policy    Policy
	Artifacts []cachestore.Artifact   // with manifests
	InUse     map[string][]api.Holder // by Key
	Desired   map[string]bool
	// Declared names the desired artifacts that the node's configuration
	// declares (a ModelCache, a models.d file, a pin, pull --keep, a
	// model's kernel caches); the other desired ones are ad-hoc entries
	// (a plain modelctl pull), which a cache may drop to admit new ones.
	Declared map[string]bool
	Skip     map[string]bool // by Key: versions not to pick (an eviction of them failed)
	// Kept (by Key) are versions the desires keep, with why (Evictor.Kept).
	Kept map[string]string
	// SpareDeclared keeps current versions of declared artifacts out of a
	// space plan: a pull may make room by evicting what nobody wants and
	// ad-hoc entries, least recently used first, never a declared model
	// (that would thrash). Disk pressure may still take them, last.
	SpareDeclared bool
}

// refcounts counts, per blob, the versions that use it.
func refcounts(arts []cachestore.Artifact) (map[string]int, map[string]int64) {
	refs, sizes := map[string]int{}, map[string]int64{}
	for _, a := range arts {
		for _, v := range a.Versions {
			for _, e := range v.Manifest {
				refs[e.Digest]++
				sizes[e.Digest] = e.Size
			}
		}
	}
	return refs, sizes
}

// release drops v's references and returns the bytes that become free.
func release(v cachestore.Version, refs map[string]int, sizes map[string]int64) int64 {
	var freed int64
	seen := map[string]bool{}
	for _, e := range v.Manifest {
		if seen[e.Digest] {
			continue
		}
		seen[e.Digest] = true
		if refs[e.Digest]--; refs[e.Digest] == 0 {
			freed += sizes[e.Digest]
		}
	}
	return freed
}

// eligible says whether v may be evicted by policy, and why not.
func (in Inputs) eligible(a cachestore.Artifact, v cachestore.Version) (bool, string) {
	switch {
	case v.Pinned:
		return false, "pinned"
	case in.Skip[Key(a.Name, v.Revision)]:
		return false, "eviction failed"
	case len(in.InUse[Key(a.Name, v.Revision)]) > 0:
		return false, "in use"
	case in.Kept[Key(a.Name, v.Revision)] != "":
		return false, in.Kept[Key(a.Name, v.Revision)]
	case in.Now.Sub(v.Created) < in.Policy.MinAge:
		return false, "younger than the minimum age"
	}
	return true, ""
}

// Protect returns the keys of every version of the named artifacts, for
// Inputs.Skip.
func Protect(arts []cachestore.Artifact, names ...string) map[string]bool {
	skip := map[string]bool{}
	for _, a := range arts {
		for _, n := range names {
			if a.Name == n {
				for _, v := range a.Versions {
					skip[Key(a.Name, v.Revision)] = true
				}
			}
		}
	}
	return skip
}

// PlanRevisions picks old revisions beyond KeepRevisions (newest kept
// first) that nothing uses, oldest first.
func PlanRevisions(in Inputs) []Victim {
	refs, sizes := refcounts(in.Artifacts)
	var out []Victim
	for _, a := range in.Artifacts {
		var old []cachestore.Version
		for _, v := range a.Versions {
			if v.Revision != a.Current && a.Current != "" {
				old = append(old, v)
			}
		}
		sort.Slice(old, func(i, j int) bool { return old[i].Created.After(old[j].Created) })
		for i, v := range old {
			if i < in.Policy.KeepRevisions {
				continue
			}
			if ok, _ := in.eligible(a, v); ok {
				out = append(out, Victim{Name: a.Name, Revision: v.Revision, Reason: ReasonAge, Bytes: release(v, refs, sizes)})
			}
		}
	}
	return out
}

type candidate struct {
	art  cachestore.Artifact
	v    cachestore.Version
	tier int
}

// Tiers of a space plan, taken in this order.
const (
	tierOld      = iota // a revision that is not current
	tierUnwanted        // the current version of an artifact nobody desires
	tierAdHoc           // the current version of an ad-hoc entry
	tierDeclared        // the current version of a declared artifact
)

func (in Inputs) tier(a cachestore.Artifact, v cachestore.Version) int {
	switch {
	case v.Revision != a.Current:
		return tierOld
	case !in.Desired[a.Name]:
		return tierUnwanted
	case in.Declared[a.Name]:
		return tierDeclared
	}
	return tierAdHoc
}

// PlanSpace picks versions to evict until need bytes would be freed:
// old revisions first, then current versions nobody desires, then those of
// ad-hoc entries, then (unless SpareDeclared) those of declared
// artifacts; within a tier least recently used first,
// ties broken by first seen (created), then name. It never picks a pinned
// version, one in use, or one younger than MinAge. exclude names versions
// already chosen by another plan. It returns the victims and the bytes
// they free; fewer than need when that is all there is.
func PlanSpace(in Inputs, need int64, exclude []Victim) ([]Victim, int64) {
	refs, sizes := refcounts(in.Artifacts)
	skip := map[string]bool{}
	for _, x := range exclude {
		skip[Key(x.Name, x.Revision)] = true
		for _, a := range in.Artifacts {
			for _, v := range a.Versions {
				if a.Name == x.Name && v.Revision == x.Revision {
					release(v, refs, sizes)
				}
			}
		}
	}
	var cands []candidate
	for _, a := range in.Artifacts {
		for _, v := range a.Versions {
			if skip[Key(a.Name, v.Revision)] {
				continue
			}
			if ok, _ := in.eligible(a, v); !ok {
				continue
			}
			tier := in.tier(a, v)
			if tier == tierDeclared && in.SpareDeclared {
				continue
			}
			cands = append(cands, candidate{a, v, tier})
		}
	}
	sort.Slice(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		switch {
		case a.tier != b.tier:
			return a.tier < b.tier
		case !a.v.LastUsed.Equal(b.v.LastUsed):
			return a.v.LastUsed.Before(b.v.LastUsed)
		case !a.v.Created.Equal(b.v.Created):
			return a.v.Created.Before(b.v.Created)
		case a.art.Name != b.art.Name:
			return a.art.Name < b.art.Name
		}
		return a.v.Revision < b.v.Revision
	})
	var out []Victim
	var freed int64
	for _, c := range cands {
		if freed >= need {
			break
		}
		n := release(c.v, refs, sizes)
		freed += n
		out = append(out, Victim{Name: c.art.Name, Revision: c.v.Revision, Reason: ReasonSpace, Bytes: n, AdHoc: c.tier == tierAdHoc})
	}
	return out, freed
}

// Evictable is how many bytes eviction could free right now.
func Evictable(in Inputs) int64 {
	_, n := PlanSpace(in, math.MaxInt64, nil)
	return n
}

// Taker is an artifact holding space that a space plan may not free, and
// why.
type Taker struct {
	Name  string
	Bytes int64
	Why   string // "declared", "pinned", "in use", ...
}

// Takers lists the current versions a space plan of in cannot take, the
// largest first, at most n: what an operator must act on to make room.
func Takers(in Inputs, n int) []Taker {
	var out []Taker
	for _, a := range in.Artifacts {
		for _, v := range a.Versions {
			if v.Revision != a.Current {
				continue
			}
			ok, why := in.eligible(a, v)
			if ok && in.SpareDeclared && in.tier(a, v) == tierDeclared {
				ok, why = false, "declared"
			}
			if !ok {
				out = append(out, Taker{Name: a.Name, Bytes: versionBytes(v), Why: why})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Bytes != out[j].Bytes {
			return out[i].Bytes > out[j].Bytes
		}
		return out[i].Name < out[j].Name
	})
	return out[:min(n, len(out))]
}

// versionBytes is the logical size of v (its files, shared or not).
func versionBytes(v cachestore.Version) int64 {
	if v.Bytes > 0 {
		return v.Bytes
	}
	var n int64
	for _, e := range v.Manifest {
		n += e.Size
	}
	return n
}
