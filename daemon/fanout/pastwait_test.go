package fanout

import (
	"slices"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/k8ssync"
)

// TestPlanPastWaitHoldsTheCap: ten nodes want a revision and every one
// is past --peer-wait; still at most --origin-concurrency of them (2)
// may fetch any one blob from the origin: the recorded origin nodes while
// they are alive and want it, and a node that is not one keeps waiting
// (its ask held at a peer). When an origin node fails the artifact, its
// slot goes to the next node by the blob's hash, one node per blob; with
// no origin node left, the nodes that want it fill both slots.
func TestPlanPastWaitHoldsTheCap(t *testing.T) {
	now := time.Now()
	started := now.Add(-90 * time.Minute) // --peer-wait (1h) passed for every node, not a second one
	pc := DefaultConfig()
	pc.OriginConcurrency, pc.Wait, pc.Settle = 2, time.Hour, time.Minute
	names := []string{"o1", "o2"}
	for i := range 8 {
		names = append(names, "n"+strconv.Itoa(i))
	}
	ds := api.Desire{Name: "llama", OriginNodes: []string{"o1", "o2"}}
	statuses := func(failed ...string) []k8ssync.ModelCacheNode {
		var out []k8ssync.ModelCacheNode
		for _, name := range names {
			var n k8ssync.ModelCacheNode
			n.Name = name
			n.Status.PeerAddress = "http://" + name + ":7435"
			n.Status.Heartbeat = metav1.NewTime(now.Add(-time.Minute))
			phase := "Downloading"
			if slices.Contains(failed, name) {
				phase = "Failed"
			}
			n.Status.Artifacts = []k8ssync.ArtifactStatus{{Name: "llama", Phase: phase, Revision: "r1"}}
			out = append(out, n)
		}
		return out
	}
	var toOriginSince func(d string, started time.Time, failed ...string) []string
	// toOrigin is the nodes whose plan lets them fetch blob d from the
	// origin, each planning from the same statuses, past its wait.
	toOrigin := func(d string, failed ...string) []string { return toOriginSince(d, started, failed...) }
	toOriginSince = func(d string, started time.Time, failed ...string) []string {
		var out []string
		for _, self := range names {
			if slices.Contains(failed, self) {
				continue
			}
			f := &Fleet{cfg: pc, cluster: true, self: self, changed: make(chan struct{}), listed: map[string]time.Time{}}
			f.SetNodes(statuses(failed...))
			f.Plan(ds, "r1", d, started, now.Add(-pc.Settle)) // its own status listed the artifact a Settle ago
			pl := f.Plan(ds, "r1", d, started, now)
			if pl.Origin {
				out = append(out, self)
			} else if !pl.Hold.After(now) {
				t.Fatalf("%s, beyond the cap past --peer-wait: hold until %v, want an ask held at a peer (after %v)", self, pl.Hold, now)
			}
		}
		return out
	}
	for i := range 20 {
		d := "sha256:b" + strconv.Itoa(i)
		if got := toOrigin(d); !slices.Equal(got, []string{"o1", "o2"}) {
			t.Fatalf("blob %s past --peer-wait: %v go to the origin, want the two origin nodes only (--origin-concurrency 2)", d, got)
		}
		got := toOrigin(d, "o1")
		if len(got) != 2 || got[0] != "o2" {
			t.Fatalf("blob %s, o1 failed: %v go to the origin, want o2 and one other node", d, got)
		}
		if got := toOrigin(d, "o1", "o2"); len(got) != 2 {
			t.Fatalf("blob %s, both origin nodes failed: %v go to the origin, want 2", d, got)
		}
	}
	// Two --peer-waits on, the origin nodes still list it Downloading and
	// have sent nothing (a wedged daemon, a forged status): the others
	// are no longer held to the cap.
	if got := toOriginSince("sha256:b0", now.Add(-2*time.Hour)); len(got) != len(names) {
		t.Fatalf("a second --peer-wait passed: %v go to the origin, want all %d nodes", got, len(names))
	}
}
