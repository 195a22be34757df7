package k8ssync_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore/storetest"
	"github.com/modelcache/modelcache/daemon"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/k8ssync"
)

// pollClock is the leaders' Poll clock: a test moves it past an interval
// instead of waiting a minute.
type pollClock struct{ off atomic.Int64 }

func (c *pollClock) now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *pollClock) advance(d time.Duration) { c.off.Add(int64(d)) }

// rolloutNode: the daemon's clock for Poll, and old revisions go as soon
// as nothing keeps them (no minimum age, none kept by count).
func rolloutNode(clock *pollClock, more ...func(*daemon.Config)) func(*daemon.Config) {
	return func(c *daemon.Config) {
		c.Cluster.Now = clock.now
		c.Capacity.MinAge, c.Capacity.KeepRevisions = 0, 0
		for _, f := range more {
			f(c)
		}
	}
}

// kick touches a ModelCache's annotations: the leader makes a pass (and
// polls what is due).
func kick(t *testing.T, dyn dynamic.Interface, name string) {
	t.Helper()
	updateMC(t, dyn, name, func(u *unstructured.Unstructured) {
		u.SetAnnotations(map[string]string{"test/kick": time.Now().Format(time.RFC3339Nano)})
	})
}

func activeOf(m *k8ssync.ModelCache, artifact string) string {
	if m == nil {
		return ""
	}
	for _, e := range m.Status.Active {
		if e.Artifact == artifact {
			return e.Revision
		}
	}
	return ""
}

// holdsRev: the node holds rev of name, current or prefetched (Next
// while the desire stages it; a Ready version between the flip and the
// move of current).
func holdsRev(x *api.Artifact, rev string) bool {
	if x == nil {
		return false
	}
	if (x.Phase == api.PhaseReady && x.Revision == rev) || (x.Next != nil && x.Next.Phase == api.PhaseReady && x.Next.Revision == rev) {
		return true
	}
	for _, v := range x.Versions {
		if v.Revision == rev && v.State == "Ready" {
			return true
		}
	}
	return false
}

func hasVersion(n *node, name, rev string) bool {
	x, err := n.c.Get(context.Background(), name)
	if err != nil {
		return false
	}
	for _, v := range x.Versions {
		if v.Revision == rev {
			_, err := os.Stat(filepath.Join(n.root, "models", name, rev))
			return err == nil
		}
	}
	return false
}

func eventsFor(kc kubernetes.Interface, name, reason string) []string {
	evs, err := kc.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name + ",reason=" + reason})
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range evs.Items {
		out = append(out, e.Message)
	}
	return out
}

// rolloutFleet is two nodes on a real API server and a hub whose main is
// commit c1; node-b's daemon configuration is adjusted by nodeB.
type rolloutFleet struct {
	kc    kubernetes.Interface
	dyn   dynamic.Interface
	hub   *hubtest.Hub
	c1    string
	clock *pollClock
	a, b  *node
}

func newRolloutFleet(t *testing.T, nodeB func(*daemon.Config)) *rolloutFleet {
	t.Helper()
	cl, kc, dyn := fleetCluster(t, "node-a", "node-b")
	hub := hubtest.New()
	t.Cleanup(hub.Close)
	c1 := hub.Commit("org/m", map[string][]byte{"config.json": []byte(`{"model_type":"x"}`), "w.safetensors": storetest.Data(100<<10, 1)}, "main")
	t.Setenv("HF_ENDPOINT", hub.URL())
	t.Setenv("HF_TOKEN", "")
	clock := &pollClock{}
	a := startNodeIn(t, cl.Config, "node-a", noGPU, false, "modelcache-system", rolloutNode(clock))
	b := startNodeIn(t, cl.Config, "node-b", noGPU, false, "modelcache-system", rolloutNode(clock, nodeB))
	return &rolloutFleet{kc: kc, dyn: dyn, hub: hub, c1: c1, clock: clock, a: a, b: b}
}

// TestRolloutPollPrefetchThenFlip: a branch moves under updatePolicy
// Poll. Both nodes prefetch the new commit while the old one stays
// current (node-b downloads slowly); no node moves current before both
// hold the new commit, then both flip. After the flip the previous
// commit stays where spec.rollout.retainOld keeps it or a lease holds
// it, and goes where nothing does. Rolling back to the old commit is
// immediate and downloads nothing.
func TestRolloutPollPrefetchThenFlip(t *testing.T) {
	f := newRolloutFleet(t, func(c *daemon.Config) { c.BandwidthLimit = 256 << 10 })
	ctx, kc, dyn, hub, c1, clock, a, b := context.Background(), f.kc, f.dyn, f.hub, f.c1, f.clock, f.a, f.b
	poll := map[string]any{"type": "Poll", "interval": "1m"}
	for name, spec := range map[string]map[string]any{
		"m": {"source": "hf://org/m", "updatePolicy": poll, "rollout": map[string]any{"retainOld": "1h"}},
		"h": {"source": "hf://org/m", "updatePolicy": poll},
	} {
		if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc(name, spec), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"m", "h"} {
		testenv.Eventually(t, name+" active at commit 1 on both nodes", 40*time.Second, func() error {
			for _, n := range []*node{a, b} {
				if x, err := n.c.Get(ctx, name); err != nil || x.Phase != api.PhaseReady || x.Revision != c1 {
					return fmt.Errorf("%s: %+v %v", n.name, x, err)
				}
			}
			m := getMC(t, dyn, name)
			if activeOf(m, name) != c1 || m.Status.Rollout == nil || m.Status.Rollout.Phase != k8ssync.RolloutComplete || m.Status.Rollout.Active != c1 {
				return fmt.Errorf("%+v", m.Status)
			}
			return nil
		})
	}
	// A process on node-a holds h's commit 1.
	if _, err := a.c.Lease(ctx, "h", "job-1", time.Hour); err != nil {
		t.Fatal(err)
	}

	// main moves; the leaders' clock passes the Poll interval.
	c2 := hub.Commit("org/m", map[string][]byte{"config.json": []byte(`{"model_type":"x"}`), "w.safetensors": storetest.Data(512<<10, 2)}, "main")
	clock.advance(2 * time.Minute)
	kick(t, dyn, "m")
	kick(t, dyn, "h")
	prefetched := false
	testenv.Eventually(t, "both nodes active on commit 2 for m and h", 60*time.Second, func() error {
		for _, name := range []string{"m", "h"} {
			xa, erra := a.c.Get(ctx, name)
			xb, errb := b.c.Get(ctx, name)
			if erra != nil || errb != nil {
				return fmt.Errorf("%v %v", erra, errb)
			}
			// Holding is for good once reached (a prefetched revision is
			// kept), so one read after the other is enough.
			for _, x := range []*api.Artifact{xa, xb} {
				if x.Revision == c2 && !(holdsRev(xa, c2) && holdsRev(xb, c2)) {
					m := getMC(t, dyn, name)
					na, _ := nodeStatus(dyn, "node-a")
					nb, _ := nodeStatus(dyn, "node-b")
					t.Logf("events %q\nstatus %+v\nactive %+v\nrollout %+v\nnode-a %+v\nnode-b %+v", eventsFor(kc, name, k8ssync.EventRolledOut), m.Status.Resolved, m.Status.Active, m.Status.Rollout, artifactOn(na, name), artifactOn(nb, name))
					t.Fatalf("%s: current moved to commit 2 before both nodes held it: node-a %s %s %+v / node-b %s %s %+v", name, xa.Phase, xa.Revision, xa.Next, xb.Phase, xb.Revision, xb.Next)
				}
				if x.Revision != c1 && x.Revision != c2 {
					t.Fatalf("%s serves %s: %s %q %+v %+v", name, x.Revision, x.Phase, x.Message, x.Versions, x.Desire)
				}
			}
			if xa.Revision == c1 && holdsRev(xa, c2) && !holdsRev(xb, c2) {
				prefetched = true // node-a holds it, node-b is still downloading: no flip
			}
			if xa.Revision != c2 || xb.Revision != c2 {
				return fmt.Errorf("%s: node-a %s, node-b %s", name, xa.Revision, xb.Revision)
			}
		}
		return nil
	})
	if !prefetched {
		t.Error("never saw node-a holding commit 2 prefetched while node-b fetched it")
	}
	for _, name := range []string{"m", "h"} {
		testenv.Eventually(t, name+"'s status shows the rollout done", 20*time.Second, func() error {
			m := getMC(t, dyn, name)
			r := m.Status.Rollout
			if r == nil || r.Phase != k8ssync.RolloutComplete || r.Target != c2 || r.Active != c2 || r.Previous != c1 || r.ReadyText != "2/2" || m.Status.Revision != c2 {
				return fmt.Errorf("%+v", r)
			}
			return nil
		})
	}
	if evs := eventsFor(kc, "m", k8ssync.EventRolledOut); len(evs) == 0 || !strings.Contains(evs[0], c1+" → "+c2) {
		t.Errorf("RolledOut events: %q", evs)
	}
	if evs := eventsFor(kc, "m", k8ssync.EventPrefetched); len(evs) == 0 {
		t.Error("no Prefetched event")
	}

	// Commit 1 of h goes from node-b (nothing keeps it there) ...
	testenv.Eventually(t, "h's commit 1 evicted from node-b", 20*time.Second, func() error {
		if hasVersion(b, "h", c1) {
			return fmt.Errorf("still there")
		}
		return nil
	})
	// ... and stays where retainOld or a lease keeps it.
	for _, n := range []*node{a, b} {
		if !hasVersion(n, "m", c1) {
			t.Errorf("%s: m's commit 1 went, though spec.rollout.retainOld keeps it for 1h", n.name)
		}
	}
	if !hasVersion(a, "h", c1) {
		t.Error("node-a: h's commit 1 went while a lease holds it")
	}
	if err := a.c.Release(ctx, "h", "job-1"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "h's commit 1 evicted from node-a once released", 20*time.Second, func() error {
		if hasVersion(a, "h", c1) {
			return fmt.Errorf("still there")
		}
		return nil
	})

	// Rollback: the spec names commit 1 again; the nodes hold it.
	sent := hub.Sent.Load()
	updateSpec(t, dyn, "m", func(spec map[string]any) { spec["source"] = "hf://org/m@" + c1 })
	testenv.Eventually(t, "m active on commit 1 again on both nodes", 30*time.Second, func() error {
		for _, n := range []*node{a, b} {
			if x, err := n.c.Get(ctx, "m"); err != nil || x.Phase != api.PhaseReady || x.Revision != c1 {
				return fmt.Errorf("%s: %+v %v", n.name, x, err)
			}
		}
		if m := getMC(t, dyn, "m"); activeOf(m, "m") != c1 {
			return fmt.Errorf("%+v", m.Status.Active)
		}
		return nil
	})
	if d := hub.Sent.Load() - sent; d != 0 {
		for _, n := range []*node{a, b} {
			x, _ := n.c.Get(ctx, "m")
			t.Logf("%s: last pull %+v, versions %+v", n.name, x.LastPull, x.Versions)
		}
		t.Errorf("the rollback downloaded %d bytes", d)
	}
}

// TestRolloutNodeThatCannotGetIt: node-b has no room for the new commit.
// With minReadyPercent 100 nothing flips: node-a holds the new commit
// prefetched, both serve the old one, and the status and an Event say
// why node-b cannot; with 50 the flip happens on node-a, and node-b keeps
// serving the old commit and says why. A Poll interval under a minute is
// refused with the remedy.
func TestRolloutNodeThatCannotGetIt(t *testing.T) {
	f := newRolloutFleet(t, func(c *daemon.Config) { c.Capacity.QuotaBytes = 300 << 10 })
	ctx, kc, dyn, hub, c1, clock, a, b := context.Background(), f.kc, f.dyn, f.hub, f.c1, f.clock, f.a, f.b

	_, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc("fast", map[string]any{"source": "hf://org/m", "updatePolicy": map[string]any{"type": "Poll", "interval": "10s"}}), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "at least 1m") {
		t.Fatalf("a Poll interval of 10s: %v", err)
	}

	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc("m", map[string]any{"source": "hf://org/m", "updatePolicy": map[string]any{"type": "Poll", "interval": "5m"}}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "m at commit 1 on both nodes", 40*time.Second, func() error {
		for _, n := range []*node{a, b} {
			if x, err := n.c.Get(ctx, "m"); err != nil || x.Phase != api.PhaseReady || x.Revision != c1 {
				return fmt.Errorf("%s: %+v %v", n.name, x, err)
			}
		}
		if activeOf(getMC(t, dyn, "m"), "m") != c1 {
			return fmt.Errorf("not active yet")
		}
		return nil
	})
	c2 := hub.Commit("org/m", map[string][]byte{"config.json": []byte(`{"model_type":"x"}`), "w.safetensors": storetest.Data(400<<10, 2)}, "main")
	clock.advance(6 * time.Minute)
	kick(t, dyn, "m")
	testenv.Eventually(t, "the rollout waits for node-b and says why", 40*time.Second, func() error {
		m := getMC(t, dyn, "m")
		r := m.Status.Rollout
		if r == nil || r.Phase != k8ssync.RolloutProgressing || r.Target != c2 || r.Active != c1 || r.ReadyText != "1/2" || r.MinReadyPercent != 100 ||
			!strings.Contains(r.Message, "node-b: ") || !strings.Contains(r.Message, api.ReasonInsufficientCapacity) {
			return fmt.Errorf("%+v", r)
		}
		return nil
	})
	for _, n := range []*node{a, b} {
		if x, _ := n.c.Get(ctx, "m"); x.Phase != api.PhaseReady || x.Revision != c1 {
			t.Fatalf("%s no longer serves commit 1 before the flip: %+v", n.name, x)
		}
	}
	testenv.Eventually(t, "both nodes keep their scheduling label during the rollout", 20*time.Second, func() error {
		for _, n := range []string{"node-a", "node-b"} {
			if l := labelsOf(kc, n); l[k8ssync.LabelModelPrefix+"m"] != "ready" {
				return fmt.Errorf("%s: %v", n, l)
			}
		}
		return nil
	})
	if x, _ := a.c.Get(ctx, "m"); !holdsRev(x, c2) {
		t.Fatalf("node-a does not hold commit 2 prefetched: %+v", x.Next)
	}
	// node-b's status is written after its failed prefetch (a retry may
	// be under way when it is read): wait for the write that says so.
	testenv.Eventually(t, "node-b's status: commit 1 Ready, commit 2 failed for capacity", 20*time.Second, func() error {
		ns, err := nodeStatus(dyn, "node-b")
		if err != nil {
			return err
		}
		if as := artifactOn(ns, "m"); as == nil || as.Phase != string(api.PhaseReady) || as.Revision != c1 || as.Next == nil ||
			as.Next.Phase != string(api.PhaseFailed) || as.Next.Reason != api.ReasonInsufficientCapacity {
			return fmt.Errorf("%+v", as)
		}
		return nil
	})
	testenv.Eventually(t, "a PrefetchFailed event", 20*time.Second, func() error {
		if evs := eventsFor(kc, "m", k8ssync.EventPrefetchFailed); len(evs) == 0 || !strings.Contains(evs[0], "keeps serving revision "+c1) {
			return fmt.Errorf("%q", evs)
		}
		return nil
	})

	// Half the nodes are enough: node-a flips, node-b keeps commit 1.
	updateSpec(t, dyn, "m", func(spec map[string]any) { spec["rollout"] = map[string]any{"minReadyPercent": int64(50)} })
	testenv.Eventually(t, "node-a active on commit 2", 30*time.Second, func() error {
		if x, err := a.c.Get(ctx, "m"); err != nil || x.Phase != api.PhaseReady || x.Revision != c2 {
			return fmt.Errorf("%+v %v", x, err)
		}
		if activeOf(getMC(t, dyn, "m"), "m") != c2 {
			return fmt.Errorf("not active")
		}
		return nil
	})
	testenv.Eventually(t, "node-b serves commit 1 and says why", 30*time.Second, func() error {
		x, err := b.c.Get(ctx, "m")
		if err != nil || x.Revision != c1 || x.Reason != api.ReasonInsufficientCapacity {
			return fmt.Errorf("%+v %v", x, err)
		}
		if _, err := os.Stat(filepath.Join(b.root, "models", "m", "current", "w.safetensors")); err != nil {
			return err
		}
		return nil
	})
	testenv.Eventually(t, "only node-a, on the active revision, keeps the label", 20*time.Second, func() error {
		if la, lb := labelsOf(kc, "node-a"), labelsOf(kc, "node-b"); la[k8ssync.LabelModelPrefix+"m"] != "ready" || lb[k8ssync.LabelModelPrefix+"m"] != "" {
			return fmt.Errorf("node-a %v, node-b %v", la, lb)
		}
		return nil
	})
}
