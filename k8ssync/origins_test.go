package k8ssync

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/modelcache/modelcache/internal/kubetest"
	"github.com/modelcache/modelcache/internal/testenv"
)

// TestOriginNodesRanking: the assignment is the candidates' rendezvous
// order for the artifact, whatever order they come in and however often
// one is named, different for another artifact, and capped.
func TestOriginNodesRanking(t *testing.T) {
	var names []string
	for i := range 20 {
		names = append(names, "node-"+strconv.Itoa(i))
	}
	want := OriginNodes("llama", names, 3)
	if len(want) != 3 || !slices.Equal(want, Rendezvous("llama", names)[:3]) {
		t.Fatalf("%v: want the first 3 of the rendezvous order", want)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		shuffled := append(slices.Clone(names), names[r.IntN(len(names))])
		r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if got := OriginNodes("llama", shuffled, 3); !slices.Equal(got, want) {
			t.Fatalf("%v in another order (with a duplicate): %v, want %v", shuffled, got, want)
		}
	}
	others := 0
	for i := range 10 {
		if !slices.Equal(OriginNodes("model-"+strconv.Itoa(i), names, 3), want) {
			others++
		}
	}
	if others == 0 {
		t.Fatal("every artifact gets the same origin nodes: the load is not spread")
	}
	if got := OriginNodes("llama", names, 1000); len(got) != MaxOriginNodes {
		t.Fatalf("%d origin nodes for --origin-concurrency 1000, want the cap %d", len(got), MaxOriginNodes)
	}
	if got := OriginNodes("llama", names, 0); len(got) != 1 {
		t.Fatalf("%v for a concurrency of 0: want one node", got)
	}
	if got := OriginNodes("llama", nil, 2); got != nil {
		t.Fatalf("%v without candidates, want none", got)
	}
}

// TestRecordOrigins: against a real API server, the elected daemon's
// origin nodes of a resolution are taken among the nodes the
// ModelCache's selector picks (by their labels) whose ModelCacheNode is
// live; a kernel cache image and a failed resolution get none; one LIST
// of Nodes serves a pass, and a pass with the same revision and the same
// live nodes (a status write that failed) gives the same answer without
// another; a recorded list stays; without a live selected node none is
// recorded, and a node whose labels come to match is assigned once its
// status lists the artifact.
func TestRecordOrigins(t *testing.T) {
	cl := kubetest.Start(t)
	cfg := rest.CopyConfig(cl.Config)
	var lists atomic.Int64
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes" && r.URL.Query().Get("watch") == "" {
				lists.Add(1)
			}
			return rt.RoundTrip(r)
		})
	}
	ctx := context.Background()
	core, _, err := typedClients(cl.Config)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var mcns []ModelCacheNode
	for _, n := range []struct {
		name, pool string
		age        time.Duration // of its ModelCacheNode's heartbeat; -1: none
		peer       bool
	}{
		{"gpu-a", "gpu", time.Minute, true},
		{"gpu-b", "gpu", time.Minute, true},
		{"gpu-c", "gpu", 2 * time.Hour, true},
		{"gpu-stale", "gpu", 4 * time.Hour, true},
		{"gpu-nopeer", "gpu", time.Minute, false},
		{"gpu-nomcn", "gpu", -1, false},
		{"cpu-d", "cpu", time.Minute, true},
	} {
		if _, err := core.Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: map[string]string{"pool": n.pool}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if n.age < 0 {
			continue
		}
		m := ModelCacheNode{ObjectMeta: metav1.ObjectMeta{Name: n.name}}
		m.Status.Heartbeat = metav1.NewTime(now.Add(-n.age))
		if n.peer {
			m.Status.PeerAddress = "http://10.0.0.1:7435"
		}
		mcns = append(mcns, m)
	}
	s, err := New(Config{NodeName: "gpu-a", Kube: cfg, OriginConcurrency: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	mc := &ModelCache{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Spec: ModelCacheSpec{Source: "hf://org/m",
		NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"pool": "gpu"}},
		KernelCaches: []KernelCacheSpec{{Name: "k", Image: "oci://r/k:v1"}},
		Versions:     []VersionSpec{{Suffix: "old", Source: "hf://org/m@v0"}}}}
	resolved := []ResolvedSource{
		{Artifact: "m", Source: "hf://org/m", URI: "hf://org/m@" + sha40("1"), Revision: sha40("1")},
		{Artifact: "k", Source: "oci://r/k:v1", URI: "oci://r/k@sha256:" + sha40("2"), Revision: sha40("2")},
		{Artifact: "m-old", Source: "hf://org/m@v0", Error: "not found"},
	}
	want := Rendezvous("m", []string{"gpu-a", "gpu-b", "gpu-c"})[:2]
	check := func(what string, out []ResolvedSource, lists0 int64) {
		t.Helper()
		if !slices.Equal(out[0].OriginNodes, want) {
			t.Fatalf("%s: origin nodes %v, want %v (the selected nodes with a live ModelCacheNode, ranked)", what, out[0].OriginNodes, want)
		}
		if out[1].OriginNodes != nil || out[2].OriginNodes != nil {
			t.Fatalf("%s: origin nodes for a kernel cache image %v or a failed resolution %v", what, out[1].OriginNodes, out[2].OriginNodes)
		}
		if got := lists.Load(); got != lists0 {
			t.Fatalf("%s: %d LISTs of Nodes in all, want %d", what, got, lists0)
		}
	}
	out := s.recordOrigins(ctx, mc, resolved, mcns, now)
	check("first pass", out, 1)
	// Published with the resolution: the nodes it was assigned from, as
	// Pending at its revision, but for those whose status lists it.
	exp := s.expected(mc, out)
	if len(exp) != 1 || exp[0].Artifact != "m" || exp[0].Revision != sha40("1") || exp[0].Phase != "Pending" ||
		!slices.Equal(slices.Sorted(slices.Values(exp[0].Nodes)), []string{"gpu-a", "gpu-b", "gpu-c"}) {
		t.Fatalf("expected %+v: want m at its revision, Pending, on the live selected nodes", exp)
	}
	listing := slices.Clone(mcns)
	for i := range listing {
		if listing[i].Name == "gpu-b" {
			listing[i].Status.Artifacts = []ArtifactStatus{{Name: "m", ModelCache: "m", Phase: "Downloading", Revision: sha40("1")}}
		}
	}
	withOut := *mc
	withOut.Status.Resolved = out
	st, _ := aggregate(&withOut, listing, exp, now)
	var pending, downloading []string
	for _, p := range st.Peers {
		switch {
		case p.Artifact == "m" && p.Revision == sha40("1") && p.Phase == "Pending":
			pending = append(pending, p.Nodes...)
		case p.Artifact == "m" && p.Phase == "Downloading":
			downloading = append(downloading, p.Nodes...)
		}
	}
	addrs := map[string]bool{}
	for _, a := range st.PeerAddresses {
		addrs[a.Node] = a.Address != ""
	}
	if !slices.Equal(pending, []string{"gpu-a", "gpu-c"}) || !slices.Equal(downloading, []string{"gpu-b"}) || !addrs["gpu-a"] || !addrs["gpu-c"] {
		t.Fatalf("status.peers %+v, addresses %v: want gpu-a and gpu-c expected (Pending, with addresses), gpu-b as its status says", st.Peers, addrs)
	}
	if resolved[0].OriginNodes != nil {
		t.Fatal("the caller's entries were changed")
	}
	slices.Reverse(mcns)
	check("again, the write having failed", s.recordOrigins(ctx, mc, resolved, mcns, now), 1)
	check("recorded", s.recordOrigins(ctx, mc, out, mcns[:1], now), 1)

	// A new revision is assigned again (one more LIST); with no live
	// selected node it stays without, and asks once.
	moved := slices.Clone(resolved)
	moved[0].URI, moved[0].Revision = "hf://org/m@"+sha40("3"), sha40("3")
	check("a new revision", s.recordOrigins(ctx, mc, moved, mcns, now), 2)
	var unselected []ModelCacheNode
	for _, m := range mcns {
		if m.Name == "cpu-d" || m.Name == "gpu-stale" {
			unselected = append(unselected, m)
		}
	}
	moved[0].URI, moved[0].Revision = "hf://org/m@"+sha40("4"), sha40("4")
	for range 2 {
		if got := s.recordOrigins(ctx, mc, moved, unselected, now); got[0].OriginNodes != nil || lists.Load() != 3 {
			t.Fatalf("no live selected node: origin nodes %v after %d LISTs, want none after 3", got[0].OriginNodes, lists.Load())
		}
	}
	if got := s.recordOrigins(ctx, mc, moved, nil, now); got[0].OriginNodes != nil || lists.Load() != 3 {
		t.Fatalf("no live node: origin nodes %v after %d LISTs, want none, no LIST", got[0].OriginNodes, lists.Load())
	}
	// A node whose labels come to match: its status lists the artifact,
	// and the next pass asks again and assigns it.
	if _, err := core.Nodes().Patch(ctx, "cpu-d", types.MergePatchType, []byte(`{"metadata":{"labels":{"pool":"gpu"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range unselected {
		if unselected[i].Name == "cpu-d" {
			unselected[i].Status.Artifacts = []ArtifactStatus{{Name: "m", Phase: "Pending"}}
		}
	}
	testenv.Eventually(t, "the API server's watch cache has cpu-d's labels", 10*time.Second, func() error {
		l, err := core.Nodes().List(ctx, metav1.ListOptions{LabelSelector: "pool=gpu", ResourceVersion: "0"})
		if err != nil {
			return err
		}
		for _, n := range l.Items {
			if n.Name == "cpu-d" {
				return nil
			}
		}
		return errors.New("not yet")
	})
	if got := s.recordOrigins(ctx, mc, moved, unselected, now); !slices.Equal(got[0].OriginNodes, []string{"cpu-d"}) || lists.Load() != 4 {
		t.Fatalf("a node newly selected that lists the artifact: origin nodes %v after %d LISTs, want [cpu-d] after 4", got[0].OriginNodes, lists.Load())
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// sha40 is a 40-hex-digit revision made of s.
func sha40(s string) string {
	out := ""
	for len(out) < 40 {
		out += s
	}
	return out[:40]
}
