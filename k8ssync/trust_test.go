package k8ssync

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelcache/modelcache/api"
)

// readyOn is node's report of artifact m of ModelCache m Ready at uri's
// revision rev with folder checksum digest.
func readyOn(node, uri, rev, digest string) ModelCacheNode {
	return ModelCacheNode{ObjectMeta: metav1.ObjectMeta{Name: node}, Status: ModelCacheNodeStatus{Artifacts: []ArtifactStatus{
		{Name: "m", ModelCache: "m", Phase: string(api.PhaseReady), Source: uri, Revision: rev, Digest: digest}}}}
}

func pendingOn(node string) ModelCacheNode {
	return ModelCacheNode{ObjectMeta: metav1.ObjectMeta{Name: node}, Status: ModelCacheNodeStatus{Artifacts: []ArtifactStatus{
		{Name: "m", ModelCache: "m", Phase: string(api.PhasePending)}}}}
}

// A recorded folder checksum stays only while two nodes bear it out: a
// forged one (the forger's own report beside it) goes, one the nodes
// agree on replaces it.
func TestRecordedChecksumNeedsTheNodes(t *testing.T) {
	uri := "hf://org/m@" + commit
	forged := "sha256:" + strings.Repeat("0", 64)
	res := []ResolvedSource{{Artifact: "m", Source: "hf://org/m", URI: uri, Revision: commit, Digest: forged}}
	for _, c := range []struct {
		what  string
		nodes []ModelCacheNode
		want  string
	}{
		{"no node reports it", nil, ""},
		{"only the forger reports it", []ModelCacheNode{readyOn("evil", uri, commit, forged), pendingOn("b")}, ""},
		{"two nodes agree on another", []ModelCacheNode{readyOn("evil", uri, commit, forged), readyOn("a", uri, commit, digest1), readyOn("b", uri, commit, digest1)}, digest1},
		{"two nodes bear it out", []ModelCacheNode{readyOn("a", uri, commit, forged), readyOn("b", uri, commit, forged)}, forged},
		{"two nodes at another revision", []ModelCacheNode{readyOn("a", uri, "other", forged), readyOn("b", uri, "other", forged)}, ""},
	} {
		if got := recordDigests(res, c.nodes)[0].Digest; got != c.want {
			t.Errorf("%s: %q, want %q", c.what, got, c.want)
		}
	}
	// A checksum on an entry without a resolution goes.
	if got := recordDigests([]ResolvedSource{{Artifact: "m", Error: "x", Digest: forged}}, nil)[0].Digest; got != "" {
		t.Errorf("a failed resolution keeps checksum %q", got)
	}
}

// A resolution the leader did not write is resolved again unless two
// nodes hold it; one it wrote is kept; one stamped in the future is
// resolved again whoever wrote it.
func TestFoundedResolutions(t *testing.T) {
	now := time.Now()
	uri := "hf://meta-llama/Llama-3-8B@" + commit
	e := ResolvedSource{Artifact: "m", Source: llama, URI: uri, Revision: commit, ResolvedAt: metav1.NewTime(now.Add(-time.Hour).Truncate(time.Second))}
	mc := &ModelCache{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Status: ModelCacheStatus{Resolved: []ResolvedSource{e}}}
	var en endorsements
	founded := func(mc *ModelCache, nodes []ModelCacheNode, now time.Time) []ResolvedSource {
		return founded(mc, nodes, now, &en, discard)
	}
	if got := founded(mc, []ModelCacheNode{readyOn("evil", uri, commit, digest1), pendingOn("a"), pendingOn("b")}, now); len(got) != 0 {
		t.Errorf("one node's of three: kept %+v", got)
	}
	if got := founded(mc, []ModelCacheNode{readyOn("a", uri, commit, digest1)}, now); len(got) != 1 {
		t.Errorf("the one node there is holds it: %+v", got)
	}
	two := []ModelCacheNode{readyOn("a", uri, commit, digest1), readyOn("b", uri, commit, digest1)}
	if got := founded(mc, two, now); len(got) != 1 {
		t.Errorf("two nodes hold it: %+v", got)
	}
	en.add("m", mc.Status.Resolved)
	if got := founded(mc, nil, now); len(got) != 1 {
		t.Errorf("the leader's own: %+v", got)
	}
	moved := *mc
	moved.Status.Resolved = []ResolvedSource{e}
	moved.Status.Resolved[0].Revision = "another"
	if got := founded(&moved, nil, now); len(got) != 1 || got[0].Revision != commit {
		t.Errorf("changed since the leader wrote it: %+v, want the leader's own resolution back", got)
	}
	other := moved
	other.Status.Resolved = []ResolvedSource{e}
	other.Status.Resolved[0].Source, other.Status.Resolved[0].Revision = "hf://meta-llama/Llama-3-8B@dev", "another"
	if got := founded(&other, nil, now); len(got) != 0 {
		t.Errorf("another source's, changed: kept %+v", got)
	}
	future := *mc
	future.Status.Resolved = []ResolvedSource{e}
	future.Status.Resolved[0].ResolvedAt = metav1.NewTime(now.Add(24 * time.Hour))
	en.add("m", future.Status.Resolved)
	if got := founded(&future, two, now); len(got) != 0 {
		t.Errorf("stamped a day ahead: kept %+v", got)
	}
}

// An active revision the leader did not write that fewer than two nodes
// hold gives way to the target; one it wrote stays.
func TestForgedActiveGivesWay(t *testing.T) {
	old, target := "hf://meta-llama/Llama-3-8B@"+strings.Repeat("1", 40), "hf://meta-llama/Llama-3-8B@"+commit
	mc := &ModelCache{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Spec: ModelCacheSpec{Source: llama}}
	mc.Status.Active = []ResolvedSource{{Artifact: "m", Source: llama, URI: old, Revision: strings.Repeat("1", 40)}}
	resolved := []ResolvedSource{{Artifact: "m", Source: llama, URI: target, Revision: commit}}
	var en endorsements
	for _, c := range []struct {
		what  string
		nodes []ModelCacheNode
		want  string
	}{
		{"only the forger holds it", []ModelCacheNode{readyOn("evil", old, strings.Repeat("1", 40), digest1), pendingOn("a"), pendingOn("b")}, target},
		{"two nodes hold it", []ModelCacheNode{readyOn("a", old, strings.Repeat("1", 40), digest1), readyOn("b", old, strings.Repeat("1", 40), digest1), pendingOn("c")}, old},
		{"the one node there is holds it", []ModelCacheNode{readyOn("a", old, strings.Repeat("1", 40), digest1)}, old},
	} {
		m := *mc
		m.Status.Active = foundedActive(mc, c.nodes, &en, discard)
		active, _, _ := rollouts(&m, resolved, c.nodes, time.Now())
		if len(active) != 1 || active[0].URI != c.want {
			t.Errorf("%s: active %+v, want %s", c.what, active, c.want)
		}
	}
	en.add(activeKey("m"), mc.Status.Active)
	if got := foundedActive(mc, []ModelCacheNode{pendingOn("a"), pendingOn("b")}, &en, discard); len(got) != 1 {
		t.Errorf("the leader's own active revision, no node holding it yet: dropped")
	}
}

// A recorded origin-node list is kept only when it is what the leader
// would assign: a node that names itself alone, or ranks itself first
// out of turn, is not.
func TestOriginsBorneOut(t *testing.T) {
	cand := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j"}
	rank := Rendezvous("m", cand)
	last := rank[len(rank)-1]
	for _, c := range []struct {
		what     string
		recorded []string
		want     int
		ok       bool
	}{
		{"the leader's own assignment", rank[:2], 2, true},
		{"a longer one, ranked", rank[:3], 2, true},
		{"the last-ranked node alone", []string{last}, 2, false},
		{"the last-ranked node alone, concurrency 1", []string{last}, 1, false},
		{"the first-ranked node alone, with concurrency 2", rank[:1], 2, false},
		{"out of order", []string{rank[1], rank[0]}, 2, false},
		{"a node that is no candidate", []string{rank[0], "evil"}, 2, false},
		{"none", nil, 2, false},
		{"too many", rank, 2, false},
	} {
		if got := originsBorneOut("m", c.recorded, cand, c.want); got != c.ok {
			t.Errorf("%s (%v): %v, want %v", c.what, c.recorded, got, c.ok)
		}
	}
	if !originsBorneOut("m", []string{"a"}, []string{"a"}, 2) {
		t.Error("the only candidate, concurrency 2: refused")
	}
}
