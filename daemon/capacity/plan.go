package capacity

import (
	"math"
	"sort"
	"time"

	"github.com/modelcache/modelcache/cachestore"
)

// Eviction reasons, as metrics and logs name them.
const (
	ReasonSpace  = "space"  // disk pressure or quota
	ReasonAge    = "age"    // an old revision beyond KeepRevisions
	ReasonAbsent = "absent" // the desire says absent
	ReasonManual = "manual" // modelctl evict
)

// Holder is one reason an artifact version is in use.
type Holder struct {
	Kind     string     `json:"kind"` // "lease" or "process"
	ID       string     `json:"id"`   // the lease holder, or "pid 123 (python3)"
	Revision string     `json:"revision"`
	Expires  *time.Time `json:"expires,omitempty"`
}

// Key names a version in in-use maps: "name@revision".
func Key(name, rev string) string { return name + "@" + rev }

// Victim is a version chosen for eviction, with the bytes its removal
// frees (blobs no remaining version uses).
type Victim struct {
	Name     string `json:"name"`
	Revision string `json:"revision"`
	Reason   string `json:"reason"`
	Bytes    int64  `json:"bytes"`
}

// Inputs is what a plan is made from. Desired names artifacts that a
// present desire wants: their current versions go last.
type Inputs struct {
	Now       time.Time
	Policy    Policy
	Artifacts []cachestore.Artifact // with manifests
	InUse     map[string][]Holder   // by Key
	Desired   map[string]bool
	Skip      map[string]bool // by Key: versions not to pick (an eviction of them failed)
	// SpareDesired keeps current versions of desired artifacts out of a
	// space plan: a pull may make room by evicting what nobody wants, never
	// by evicting another desired model (that would thrash). Disk pressure
	// from outside the store may still take them, last.
	SpareDesired bool
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

// PlanSpace picks versions to evict until need bytes would be freed:
// old revisions first, then current versions nobody desires, then current
// versions of desired artifacts; within a tier least recently used first,
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
			tier := 0
			if v.Revision == a.Current {
				tier = 1
				if in.Desired[a.Name] {
					tier = 2
				}
			}
			if tier == 2 && in.SpareDesired {
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
		out = append(out, Victim{Name: c.art.Name, Revision: c.v.Revision, Reason: ReasonSpace, Bytes: n})
	}
	return out, freed
}

// Evictable is how many bytes eviction could free right now.
func Evictable(in Inputs) int64 {
	_, n := PlanSpace(in, math.MaxInt64, nil)
	return n
}
