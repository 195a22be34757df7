package daemon

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/fanout"
	"github.com/modelcache/modelcache/k8ssync"
	p2p "github.com/modelcache/modelcache/peer"
)

// selections says which nodes each ModelCache selects, and the address
// of each node and pod ("namespace/name uid"); err, when set, is every
// answer.
type selections struct {
	mu    sync.Mutex
	nodes map[string][]string
	addrs map[string]netip.Addr
	err   error
}

func (s *selections) From(_ context.Context, b k8ssync.Bound, src netip.Addr) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return false, s.err
	}
	key := b.Node
	if b.Pod != "" {
		key = b.Namespace + "/" + b.Pod + " " + b.PodUID
	}
	a, ok := s.addrs[key]
	return ok && src.IsValid() && a == src, nil
}

func (s *selections) Selects(_ context.Context, mc, node string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return false, s.err
	}
	for _, n := range s.nodes[mc] {
		if n == node {
			return true, nil
		}
	}
	return false, nil
}

// TestPeerAuthzFollowsTheArtifactsThatHoldABlob: a private artifact's
// blob goes only to the nodes its ModelCache selects, never to a token
// bound to no node; a blob a public artifact holds too goes to any
// caller, until that artifact is evicted (the index follows the store);
// a blob a pull fetched is its artifact's before its version commits; a
// blob no artifact holds is not found; a blob a pull is fetching is its
// artifact's while it fetches; a selection that cannot be read is
// undecided, not refused.
func TestPeerAuthzFollowsTheArtifactsThatHoldABlob(t *testing.T) {
	secret, shared := data(5000, 61), data(6000, 62)
	srv := newFileServer(t, map[string][]byte{"p/w.bin": secret, "p2/w.bin": shared, "q/w.bin": shared})
	h := start(t, testConfig(t))
	defer h.stop()
	p := clusterDesire("p", srv.URL+"/p/w.bin#sha256="+sha(secret))
	p.AllowedNamespaces = []string{"team-a"}
	p2 := clusterDesire("p2", srv.URL+"/p2/w.bin#sha256="+sha(shared))
	p2.AllowedNamespaces = []string{"team-b"}
	q := clusterDesire("q", srv.URL+"/q/w.bin#sha256="+sha(shared))
	if err := (clusterNode{h.d}).SetClusterDesires(map[string]api.Desire{"p": p, "p2": p2, "q": q}, nil); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"p", "p2", "q"} {
		h.waitPhase(n, api.PhaseReady)
	}
	ipA, ipB, ipC, ipPod := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.3"), netip.MustParseAddr("10.1.0.7")
	sel := &selections{nodes: map[string][]string{"p": {"node-a"}, "p2": {"node-c"}},
		addrs: map[string]netip.Addr{"node-a": ipA, "node-b": ipB, "node-c": ipC, "ns/pod-a uid-1": ipPod}}
	a := fanout.NewAuthz(h.d.store, &h.d.desires.access, sel)
	nodeA, nodeB, nodeC := p2p.Identity{User: "sa", Node: "node-a", Source: ipA}, p2p.Identity{User: "sa", Node: "node-b", Source: ipB}, p2p.Identity{User: "sa", Node: "node-c", Source: ipC}
	nobody := p2p.Identity{User: "sa", Source: ipA}
	dSecret, dShared := "sha256:"+sha(secret), "sha256:"+sha(shared)
	check := func(what string, caller p2p.Identity, d string, want error) {
		t.Helper()
		err := a.Authorize(context.Background(), caller, d)
		if (want == nil) != (err == nil) || (want != nil && !errors.Is(err, want)) {
			t.Errorf("%s: %v, want %v", what, err, want)
		}
	}
	check("the private blob to the node its ModelCache selects", nodeA, dSecret, nil)
	check("the private blob to another node", nodeB, dSecret, p2p.ErrForbidden)
	check("the private blob to a token bound to no node", nobody, dSecret, p2p.ErrForbidden)
	check("a blob a public artifact holds too, to another node", nodeB, dShared, nil)
	check("a blob a public artifact holds too, to no node", nobody, dShared, nil)
	check("a blob no artifact holds", nodeA, "sha256:"+sha([]byte("nothing")), cachestore.ErrNotFound)

	// The request must come from what the token is bound to: node-a's
	// token replayed from node-b's address (or from nowhere known) gets
	// no private blob, public ones still.
	replayed, unknown := nodeA, nodeA
	replayed.Source, unknown.Source = ipB, netip.Addr{}
	check("node-a's token replayed from node-b's address, the private blob", replayed, dSecret, p2p.ErrSourceMismatch)
	check("node-a's token from no known address, the private blob", unknown, dSecret, p2p.ErrSourceMismatch)
	check("node-a's token replayed from node-b's address, a public blob", replayed, dShared, nil)
	podA := p2p.Identity{User: "sa", Node: "node-a", Namespace: "ns", Pod: "pod-a", PodUID: "uid-1", Source: ipPod}
	check("a pod-bound token from its pod's address", podA, dSecret, nil)
	podFromNode := podA
	podFromNode.Source = ipA
	check("a pod-bound token from its node's address, not the pod's", podFromNode, dSecret, p2p.ErrSourceMismatch)
	gone := podA
	gone.PodUID = "uid-2" // a pod of that name, but another (the token's is gone)
	check("a token of a pod that is gone", gone, dSecret, p2p.ErrSourceMismatch)
	podB := p2p.Identity{User: "sa", Node: "node-b", Namespace: "ns", Pod: "pod-a", PodUID: "uid-1", Source: ipPod}
	check("a pod-bound token from its address, on a node not selected", podB, dSecret, p2p.ErrForbidden)

	// The public artifact evicted: the blob is the private p2's alone.
	sum, err := h.d.store.Summary("q")
	if err != nil {
		t.Fatal(err)
	}
	if err := (clusterNode{h.d}).SetClusterDesires(map[string]api.Desire{"p": p, "p2": p2}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.store.Evict(context.Background(), "q", sum.Versions[0].Revision, true); err != nil && !errors.Is(err, cachestore.ErrNotFound) {
		t.Fatal(err)
	}
	check("the shared blob once only a private artifact holds it, to another node", nodeB, dShared, p2p.ErrForbidden)
	check("the shared blob to the node p2's ModelCache selects", nodeC, dShared, nil)

	// A blob a pull fetched, before its version commits.
	fresh := data(3000, 63)
	if _, err := h.d.store.Ingest(context.Background(), "test:fresh", bytes.NewReader(fresh), int64(len(fresh)), ""); err != nil {
		t.Fatal(err)
	}
	dFresh := "sha256:" + sha(fresh)
	check("an unclaimed blob", nodeA, dFresh, cachestore.ErrNotFound)
	a.Fetched(dFresh, "p")
	check("a fresh blob of p, to the node p selects", nodeA, dFresh, nil)
	check("a fresh blob of p, to another node", nodeB, dFresh, p2p.ErrForbidden)

	// A blob a pull is fetching now (its bytes served as they land): the
	// artifact's, by the same rules, until the fetch ends.
	dGrowing := "sha256:" + sha(data(2000, 65))
	done := a.Fetching(dGrowing, "p")
	check("a blob p is fetching, to the node p selects", nodeA, dGrowing, nil)
	check("a blob p is fetching, to another node", nodeB, dGrowing, p2p.ErrForbidden)
	check("a blob p is fetching, to a token bound to no node", nobody, dGrowing, p2p.ErrForbidden)
	done()
	check("a blob no pull fetches any more", nodeA, dGrowing, cachestore.ErrNotFound)

	// No desire says what an artifact is: its blobs go to no one.
	if err := (clusterNode{h.d}).SetClusterDesires(map[string]api.Desire{"p2": p2}, nil); err != nil {
		t.Fatal(err)
	}
	// (It may be evicted meanwhile: then no artifact holds it.)
	if err := a.Authorize(context.Background(), nodeA, dSecret); !errors.Is(err, p2p.ErrForbidden) && !errors.Is(err, cachestore.ErrNotFound) {
		t.Errorf("the blob of an artifact no desire declares: %v, want it refused", err)
	}

	sel.mu.Lock()
	sel.err = errors.New("the API server is unreachable")
	sel.mu.Unlock()
	err = a.Authorize(context.Background(), nodeC, dShared)
	if err == nil || errors.Is(err, p2p.ErrForbidden) {
		t.Errorf("a selection that cannot be read: %v, want an error that is not a refusal", err)
	}
}
