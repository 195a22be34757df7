package k8ssync

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers"
)

// Coordinated rollouts (blue-green at fleet scale). For each model
// artifact of a ModelCache (the main one, each versions entry) the status
// has two resolutions: status.resolved, what the spec names now (the
// target), and status.active, what the nodes serve. While they differ,
// every selected node that serves the active revision prefetches the
// target (a staged commit: verified, Ready, current unchanged), and a
// node that serves nothing yet pulls the active one first. The elected
// daemon flips status.active to the target when spec.rollout.
// minReadyPercent of the selected nodes that are not Failed or
// Incompatible hold it; each node then moves current to the prefetched
// revision without a pull. A node that cannot get the target keeps
// serving the active revision and says why (its status's next, an
// Event). The previous revision stays on a node while something holds it
// and, with spec.rollout.retainOld, that long after the flip; rolling
// back is pointing the spec at the old source again: the nodes still hold
// it, so the flip is immediate. Kernel caches are not rolled out: a node
// takes a new kernel cache resolution at once.

// minReadyPercent is mc's threshold of the flip (default 100).
func minReadyPercent(mc *ModelCache) int {
	if r := mc.Spec.Rollout; r != nil && r.MinReadyPercent != nil {
		return min(max(*r.MinReadyPercent, 0), 100)
	}
	return 100
}

// retainOld is how long mc keeps the previous revision after a flip.
func retainOld(mc *ModelCache) time.Duration {
	if r := mc.Spec.Rollout; r != nil && r.RetainOld != "" {
		if d, err := time.ParseDuration(r.RetainOld); err == nil && d > 0 {
			return d
		}
	}
	return 0
}

// activeOf is mc's active resolution of artifact.
func activeOf(mc *ModelCache, artifact string) (ResolvedSource, bool) {
	for _, e := range mc.Status.Active {
		if e.Artifact == artifact && e.URI != "" {
			return e, true
		}
	}
	return ResolvedSource{}, false
}

// activeFor is mc's active resolution of artifact when its URI is the
// spec's source at a revision. An entry of another source (the spec
// named another one since) does not count; one of the spec's source with
// another URI is refused (pinned.go).
func activeFor(mc *ModelCache, artifact, source string) (e ResolvedSource, ok bool, refused error) {
	e, ok = activeOf(mc, artifact)
	if !ok {
		return e, false, nil
	}
	if err := atRevision(source, e.URI); err != nil {
		if e.Source == source {
			return e, false, err
		}
		return e, false, nil
	}
	return e, true, nil
}

// sameRevision: a and b name the same bytes to pull.
func sameRevision(a, b ResolvedSource) bool { return a.URI == b.URI && a.Revision == b.Revision }

// withRevision adds the cluster's revision to a desire whose source has
// no pinned form (an S3 prefix, a URL, a path: the URI stays the same
// when the revision moves), so a moved revision is a new desire and a
// node whose own resolution differs fails SourceChanged. A pinned URI
// (hf @commit, oci @sha256, ngc :version) names its revision already.
func withRevision(e ResolvedSource, ds api.Desire) api.Desire {
	switch scheme, _ := fetchers.Scheme(e.URI); scheme {
	case "s3", "http", "https", "file":
		ds.Revision = e.Revision
	}
	return ds
}

// modelDesire is the desire this node hands its daemon for a model
// artifact of mc (ds, from spec source), given the revision the node
// serves now (current): the target when no rollout is under way; during
// one, the target staged when the node serves the active revision, else
// the active revision. until is when a retained previous revision may go
// (zero: none retained).
func modelDesire(mc *ModelCache, ds api.Desire, source string, current served, now time.Time) (out api.Desire, ok bool, why string, until time.Time) {
	t, tok, _ := resolution(mc, ds.Name, source) // pinned says why a refused one waits
	a, aok, refused := activeFor(mc, ds.Name, source)
	if refused != nil {
		return ds, false, refusedWhy("status.active", refused), until
	}
	retain := func(d api.Desire) api.Desire {
		if !aok || a.Previous == "" || a.ActivatedAt == nil {
			return d
		}
		if u := a.ActivatedAt.Add(retainOld(mc)); now.Before(u) {
			d.Retain, until = []string{a.Previous}, u
		}
		return d
	}
	if !aok || (tok && sameRevision(a, t)) {
		out, ok, why = pinned(mc, ds, source)
		if ok {
			out = retain(withRevision(t, out))
		}
		return out, ok, why, until
	}
	serve := retain(withRevision(a, pinnedFrom(a, ds)))
	if !tok || (!current.is(a) && !current.is(t)) {
		return serve, true, "", until
	}
	next := retain(withRevision(t, pinnedFrom(t, ds)))
	next.Stage = true
	return next, true, "", until
}

// served is the revision a node serves of an artifact, and the
// (redacted) source it came from; zero when it serves none.
type served struct{ revision, source string }

// is: the node serves e's revision.
func (c served) is(e ResolvedSource) bool {
	return c.source != "" && c.source == fetchers.RedactURI(e.URI) && (e.Revision == "" || c.revision == e.Revision)
}

// holds: the node's status of an artifact has revision e, current or
// prefetched.
func holds(as ArtifactStatus, e ResolvedSource) bool {
	if api.Phase(as.Phase) == api.PhaseReady && (served{as.Revision, as.Source}).is(e) {
		return true
	}
	n := as.Next
	return n != nil && api.Phase(n.Phase) == api.PhaseReady && (served{n.Revision, n.Source}).is(e)
}

// flip is one change of status.active by the elected daemon.
type flip struct {
	artifact, from, to string
	ready, eligible    int
}

// rollouts is mc's status.active after this pass (from resolved, the
// targets, and the nodes' reports), the main artifact's rollout status,
// and the flips this pass made.
func rollouts(mc *ModelCache, resolved []ResolvedSource, nodes []ModelCacheNode, now time.Time) (active []ResolvedSource, main *RolloutStatus, flips []flip) {
	pct := minReadyPercent(mc)
	stamp := metav1.NewTime(now.Truncate(time.Second))
	for _, src := range sources(mc) {
		if src.ds.Kind == api.KindKernelCache {
			continue
		}
		a, had, _ := activeFor(mc, src.artifact, src.source) // a forged one is dropped: the target becomes active
		var t ResolvedSource
		tok := false
		for _, e := range resolved {
			if e.Artifact == src.artifact && e.Source == src.source && e.URI != "" && e.Error == "" {
				t, tok = e, true
			}
		}
		rs := &RolloutStatus{Phase: RolloutComplete, MinReadyPercent: pct}
		switch {
		case !tok:
			if had {
				active = append(active, a)
			}
			rs.Phase, rs.Message = RolloutProgressing, "waiting for the cluster's resolution of the source (status.resolved)"
		case !had:
			n := t
			n.ActivatedAt = &stamp // the first revision: nothing serves yet, nothing to coordinate
			active = append(active, n)
			a = n
		case sameRevision(a, t):
			n := t
			n.ActivatedAt, n.Previous = a.ActivatedAt, a.Previous
			active = append(active, n)
			a = n
		default:
			ready, eligible, failed := count(nodes, mc.Name, src.artifact, t)
			rs.NodesReady, rs.NodesEligible = ready, eligible
			if ready*100 >= pct*eligible {
				n := t
				n.ActivatedAt, n.Previous = &stamp, a.Revision
				active = append(active, n)
				flips = append(flips, flip{artifact: src.artifact, from: a.Revision, to: t.Revision, ready: ready, eligible: eligible})
				a = n
				break
			}
			active = append(active, a)
			rs.Phase = RolloutProgressing
			rs.Message = fmt.Sprintf("%d of %d nodes hold %s; the flip needs %d%%", ready, eligible, t.Revision, pct)
			if len(failed) > 0 {
				rs.Message += "; could not get it (they keep serving " + a.Revision + "): " + strings.Join(failed, "; ")
			}
			rs.Message = clip(rs.Message, MaxStatusMessage) // the nodes' messages, each clipped too (count)
		}
		if src.artifact != mc.Name {
			continue
		}
		if tok {
			rs.Target = t.Revision
		}
		rs.Active, rs.Previous, rs.ActivatedAt = a.Revision, a.Previous, a.ActivatedAt
		if rs.Phase == RolloutComplete && tok {
			rs.NodesReady, rs.NodesEligible, _ = count(nodes, mc.Name, src.artifact, t)
		}
		rs.ReadyText = strconv.Itoa(rs.NodesReady) + "/" + strconv.Itoa(rs.NodesEligible)
		main = rs
	}
	return active, main, flips
}

// count is how many of the nodes that report artifact of mc hold e, how
// many are eligible (not Failed or Incompatible), and why those whose
// prefetch of e failed could not get it ("node: message").
func count(nodes []ModelCacheNode, mc, artifact string, e ResolvedSource) (ready, eligible int, failed []string) {
	src := fetchers.RedactURI(e.URI)
	for _, n := range nodes {
		for _, as := range n.Status.Artifacts {
			if as.Name != artifact || as.ModelCache != mc {
				continue
			}
			switch api.Phase(as.Phase) {
			case api.PhaseFailed, api.PhaseIncompatible:
				continue
			}
			eligible++
			if holds(as, e) {
				ready++
			} else if x := as.Next; x != nil && x.Source == src && api.Phase(x.Phase) == api.PhaseFailed {
				failed = append(failed, n.Name+": "+clip(x.Message, MaxStatusField))
			}
		}
	}
	sort.Strings(failed)
	return ready, eligible, failed
}
