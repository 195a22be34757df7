package fanout

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/k8ssync"
	p2p "github.com/modelcache/modelcache/peer"
)

// TestFanOutPlanFromStatuses: in a cluster the peers of a revision are
// the nodes whose status holds it Ready, then those downloading it; a
// node that failed it, has a stale status or no usable peer address is
// neither a peer nor counted among the nodes that go to the origin
// first; after the wait every node may go to the origin.
func TestFanOutPlanFromStatuses(t *testing.T) {
	now := time.Now()
	node := func(name, addr, phase, rev string, age time.Duration) k8ssync.ModelCacheNode {
		var n k8ssync.ModelCacheNode
		n.Name = name
		n.Status.PeerAddress = addr
		n.Status.Heartbeat = metav1.NewTime(now.Add(-age))
		n.Status.Artifacts = []k8ssync.ArtifactStatus{{Name: "llama", Phase: phase, Revision: rev}}
		return n
	}
	nodes := []k8ssync.ModelCacheNode{
		node("ready", "http://10.0.0.1:7435", "Ready", "r1", time.Minute),
		node("old-rev", "http://10.0.0.2:7435", "Ready", "r0", time.Minute),
		node("fetching", "http://10.0.0.3:7435", "Downloading", "", time.Minute),
		node("pending", "http://10.0.0.4:7435", "Pending", "", time.Minute),
		node("failed", "http://10.0.0.5:7435", "Failed", "", time.Minute),
		node("stale", "http://10.0.0.6:7435", "Ready", "r1", 4*time.Hour),
		node("bad-addr", "ftp://10.0.0.7/x", "Ready", "r1", time.Minute),
		node("no-addr", "", "Downloading", "", time.Minute),
	}
	me := node("me", "http://10.0.0.9:7435", "Pending", "", time.Minute)
	pc := DefaultConfig()
	pc.OriginConcurrency, pc.Wait = 2, time.Hour
	pc.Settle = time.Minute
	f := &Fleet{cfg: pc, cluster: true, self: "me", changed: make(chan struct{}), listed: map[string]time.Time{}}
	f.SetNodes(nodes)
	ds := api.Desire{Name: "llama"}
	if pl := f.Plan(ds, "r1", "sha256:b1", now, now); pl.Origin {
		t.Fatal("the origin before this node's own status lists the artifact")
	}
	f.SetNodes(append(nodes, me))
	if pl := f.Plan(ds, "r1", "sha256:b1", now, now); pl.Origin {
		t.Fatal("the origin before this node's status has listed the artifact for the settle time")
	}
	pl := f.Plan(ds, "r1", "sha256:b1", now, now.Add(time.Minute))
	want := rendezvous("llama", []string{"me", "fetching", "pending"})[:2]
	if !slices.Equal(pl.First, want) {
		t.Fatalf("origin first %v, want %v", pl.First, want)
	}
	// Its parents in the blob's tree (of the nodes that want or hold
	// it) are asked first, then the first nodes other than this one (the
	// blob's owner before the others), then the holder, then the nodes
	// downloading.
	addr := map[string]string{"fetching": "http://10.0.0.3:7435", "pending": "http://10.0.0.4:7435", "ready": "http://10.0.0.1:7435"}
	owners := rendezvous("llama\x00sha256:b1", want)
	var peers []string
	add := func(b string) {
		if !slices.Contains(peers, b) {
			peers = append(peers, b)
		}
	}
	for _, n := range treeParents("llama\x00sha256:b1", owners[0], "me", []string{"me", "fetching", "pending", "ready"}) {
		add(addr[n])
	}
	for _, n := range owners {
		if n != "me" {
			add(addr[n])
		}
	}
	add("http://10.0.0.1:7435")
	add("http://10.0.0.3:7435")
	if !slices.Equal(pl.Peers, peers) {
		t.Fatalf("peers %v, want %v (its tree parents, the first nodes, the holder, then the nodes downloading)", pl.Peers, peers)
	}
	if owner := rendezvous("llama\x00sha256:b1", want)[0]; pl.Origin != (owner == "me") {
		t.Fatalf("origin %v, want %v: of the first nodes, %s fetches this blob", pl.Origin, owner == "me", owner)
	}
	if !f.Plan(ds, "r1", "sha256:b1", now.Add(-time.Hour), now).Origin {
		t.Fatal("after --peer-wait a node may go to the origin")
	}
}

// TestFanOutPlanOriginNodes: with the origin nodes the cluster recorded
// (api.Desire.OriginNodes) a node goes to the origin at once for the
// blobs it owns among them, whatever statuses it has seen and without
// waiting for its own to settle, and not at all when it is not one of
// them; an origin node whose status went stale, that failed the artifact
// or whose ModelCacheNode is gone leaves its share to the others; with
// none left the nodes rank the nodes that want it as without a record.
func TestFanOutPlanOriginNodes(t *testing.T) {
	now := time.Now()
	node := func(name, phase string, age time.Duration) k8ssync.ModelCacheNode {
		var n k8ssync.ModelCacheNode
		n.Name = name
		n.Status.PeerAddress = "http://" + name + ":7435"
		n.Status.Heartbeat = metav1.NewTime(now.Add(-age))
		if phase != "" {
			n.Status.Artifacts = []k8ssync.ArtifactStatus{{Name: "llama", Phase: phase}}
		}
		return n
	}
	pc := DefaultConfig()
	pc.OriginConcurrency, pc.Wait, pc.Settle = 2, time.Hour, time.Minute
	fan := func(self string, nodes ...k8ssync.ModelCacheNode) *Fleet {
		f := &Fleet{cfg: pc, cluster: true, self: self, changed: make(chan struct{}), listed: map[string]time.Time{}}
		f.SetNodes(nodes)
		return f
	}
	// digestOwnedBy is a blob digest whose owner among first is want.
	digestOwnedBy := func(first []string, want string) string {
		for i := range 1000 {
			d := "sha256:b" + strconv.Itoa(i)
			if rendezvous("llama\x00"+d, first)[0] == want {
				return d
			}
		}
		t.Fatalf("no digest owned by %s among %v", want, first)
		return ""
	}
	ds := api.Desire{Name: "llama", OriginNodes: []string{"o1", "me"}}

	// An origin node: at once, for its own share only; the other origin
	// node's status need not list the artifact yet, nor this node's own.
	f := fan("me", node("o1", "", time.Minute), node("late", "Pending", time.Minute))
	mine, theirs := digestOwnedBy([]string{"o1", "me"}, "me"), digestOwnedBy([]string{"o1", "me"}, "o1")
	pl := f.Plan(ds, "r1", mine, now, now)
	if !slices.Equal(pl.First, []string{"o1", "me"}) || !pl.Origin {
		t.Fatalf("first %v origin %v: want the recorded origin nodes, and the origin at once for this node's blob", pl.First, pl.Origin)
	}
	if f.Plan(ds, "r1", theirs, now, now).Origin {
		t.Fatal("the origin for a blob another origin node owns")
	}
	// The same answer in any order of the record and of the statuses.
	rev := api.Desire{Name: "llama", OriginNodes: []string{"me", "o1", "me"}}
	g := fan("me", node("late", "Pending", time.Minute), node("o1", "Downloading", time.Minute))
	if g.Plan(rev, "r1", theirs, now, now).Origin || !g.Plan(rev, "r1", mine, now, now).Origin {
		t.Fatal("the owner of a blob depends on the order of the record or of the statuses")
	}

	// Not an origin node: no origin before --peer-wait, however long its
	// own status has listed the artifact and whatever it ranks.
	other := fan("late", node("o1", "Downloading", time.Minute), node("me", "Downloading", time.Minute), node("late", "Pending", time.Minute))
	for _, d := range []string{mine, theirs} {
		other.Plan(ds, "r1", d, now, now)
		if pl := other.Plan(ds, "r1", d, now, now.Add(time.Hour-time.Second)); pl.Origin || !slices.Equal(pl.First, []string{"o1", "me"}) {
			t.Fatalf("a node that is not an origin node: origin %v, first %v", pl.Origin, pl.First)
		}
	}
	if other.Plan(ds, "r1", mine, now, now.Add(time.Hour)).Origin {
		t.Fatal("after --peer-wait a third node went to the origin while both origin nodes want the artifact (--origin-concurrency 2)")
	}

	// An origin node that is stale, has no peer address, failed it, or
	// is gone (its ModelCacheNode seen, then deleted): this node fetches
	// every blob.
	noAddr := node("o1", "Downloading", time.Minute)
	noAddr.Status.PeerAddress = ""
	for name, o1 := range map[string][]k8ssync.ModelCacheNode{
		"stale":   {node("o1", "Downloading", 4*time.Hour)},
		"no addr": {noAddr},
		"failed":  {node("o1", "Failed", time.Minute)},
	} {
		pl := fan("me", o1...).Plan(ds, "r1", theirs, now, now)
		if !pl.Origin || !slices.Equal(pl.First, []string{"me"}) {
			t.Fatalf("o1 %s: first %v origin %v, want this node alone, at once", name, pl.First, pl.Origin)
		}
	}
	gone := fan("me", node("o1", "Downloading", time.Minute))
	gone.SetNodes(nil)
	if pl := gone.Plan(ds, "r1", theirs, now, now); !pl.Origin || !slices.Equal(pl.First, []string{"me"}) {
		t.Fatalf("o1 gone: first %v origin %v, want this node alone, at once", pl.First, pl.Origin)
	}
	// One whose status has not reached this node yet (the elected daemon
	// saw it live) keeps its share.
	var bare k8ssync.ModelCacheNode
	bare.Name = "o1"
	for name, f := range map[string]*Fleet{"not seen yet": fan("me"), "seen without a status": fan("me", bare)} {
		if pl := f.Plan(ds, "r1", theirs, now, now); pl.Origin || !slices.Equal(pl.First, []string{"o1", "me"}) {
			t.Fatalf("o1 %s: first %v origin %v, want both recorded nodes and no origin for o1's blob", name, pl.First, pl.Origin)
		}
	}

	// No recorded origin node left: the nodes that want it are ranked,
	// after the settle time, as without a record.
	dead := api.Desire{Name: "llama", OriginNodes: []string{"o1"}}
	h := fan("me", node("o1", "Failed", time.Minute), node("me", "Pending", time.Minute), node("p", "Pending", time.Minute))
	want := rendezvous("llama", []string{"me", "p"})
	d := digestOwnedBy(want, "me")
	if pl := h.Plan(dead, "r1", d, now, now); pl.Origin || !slices.Equal(pl.First, want) {
		t.Fatalf("first %v origin %v: want %v ranked, and no origin before the settle time", pl.First, pl.Origin, want)
	}
	if !h.Plan(dead, "r1", d, now, now.Add(time.Minute)).Origin {
		t.Fatal("no origin after the settle time for a blob this node owns among the nodes that want it")
	}

	// A record of more than k8ssync.MaxOriginNodes counts that many.
	long := api.Desire{Name: "llama"}
	for i := range k8ssync.MaxOriginNodes {
		long.OriginNodes = append(long.OriginNodes, "x"+strconv.Itoa(i))
	}
	long.OriginNodes = append(long.OriginNodes, "me")
	var xs []k8ssync.ModelCacheNode
	for _, n := range long.OriginNodes {
		xs = append(xs, node(n, "Pending", time.Minute))
	}
	if pl := fan("me", xs...).Plan(long, "r1", mine, now, now); slices.Contains(pl.First, "me") || pl.Origin {
		t.Fatalf("first %v origin %v: an entry past the cap counted", pl.First, pl.Origin)
	}
}

// TestFanOutPlanPassesOverAGoneOriginNode: a recorded origin node whose
// daemon is gone while its status still looks fresh (written hourly at
// least) is found through its peer port: the waiting node asks it with
// the peers, no connection sets it aside for "network", and the next
// plan passes it over, so this node fetches its share from the origin
// now, not after --peer-wait.
func TestFanOutPlanPassesOverAGoneOriginNode(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now: connection refused
	fetcher := testFetcher(t)
	now := time.Now()
	var o1, me k8ssync.ModelCacheNode
	o1.Name, o1.Status.PeerAddress, o1.Status.Heartbeat = "o1", gone, metav1.NewTime(now.Add(-time.Minute))
	o1.Status.Artifacts = []k8ssync.ArtifactStatus{{Name: "llama", Phase: "Pending"}}
	me.Name, me.Status.PeerAddress, me.Status.Heartbeat = "me", "http://127.0.0.1:1", metav1.NewTime(now)
	pc := DefaultConfig()
	pc.OriginConcurrency, pc.Wait = 2, time.Hour
	f := &Fleet{cfg: pc, cluster: true, self: "me", fetcher: fetcher, changed: make(chan struct{}), listed: map[string]time.Time{}}
	f.SetNodes([]k8ssync.ModelCacheNode{o1, me})
	ds := api.Desire{Name: "llama", OriginNodes: []string{"o1"}}
	const digest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"

	pl := f.Plan(ds, "r1", digest, now, now)
	if pl.Origin || !slices.Equal(pl.First, []string{"o1"}) || !slices.Contains(pl.Peers, gone) {
		t.Fatalf("before asking it: first %v origin %v peers %v; want o1 the origin node, asked as a peer, and no origin here", pl.First, pl.Origin, pl.Peers)
	}
	if _, err := fetcher.Fetch(context.Background(), p2p.Blob{Digest: digest, Size: 1}, pl.Peers, discardPartial{}, nil); err == nil {
		t.Fatal("a fetch from a peer port that takes no connection succeeded")
	}
	if avoided, why := fetcher.Avoided(gone); !avoided || why != p2p.AvoidNetwork {
		t.Fatalf("o1 avoided %v (%s); want set aside for %s", avoided, why, p2p.AvoidNetwork)
	}
	pl = f.Plan(ds, "r1", digest, now, now)
	if slices.Contains(pl.First, "o1") {
		t.Fatalf("first %v: o1's peer port took no connection, yet it stays an origin node", pl.First)
	}
	if !slices.Equal(pl.First, []string{"me"}) {
		t.Fatalf("first %v: want this node alone, ranked among the nodes that want it", pl.First)
	}
}

// discardPartial is a p2p.Partial that keeps nothing.
type discardPartial struct{}

func (discardPartial) ReadFrom(r io.Reader) (int64, error) { return io.Copy(io.Discard, r) }
func (discardPartial) Offset() int64                       { return 0 }
func (discardPartial) Close() error                        { return nil }
func (discardPartial) Abort()                              {}
func (discardPartial) Commit(context.Context, int64, string) (string, error) {
	return "", errors.New("discardPartial keeps nothing")
}

// TestPlanAsksItsTreeParentFirst: however many nodes are downloading,
// a waiting node asks its parent in the blob's tree first, holding the
// ask there (a holder further down does not cut the hold short), the
// chain up to the blob's owner (a recorded origin node) among its first
// few, and no more than MaxPeersAsked peers in all.
func TestPlanAsksItsTreeParentFirst(t *testing.T) {
	now := time.Now()
	var nodes []k8ssync.ModelCacheNode
	add := func(name, phase string) {
		var n k8ssync.ModelCacheNode
		n.Name, n.Status.PeerAddress, n.Status.Heartbeat = name, "http://"+name+":7435", metav1.NewTime(now)
		n.Status.Artifacts = []k8ssync.ArtifactStatus{{Name: "llama", Phase: phase, Revision: "r1"}}
		nodes = append(nodes, n)
	}
	for i := range 40 {
		add("d"+strconv.Itoa(i), "Downloading")
	}
	add("ready", "Ready")
	add("o1", "Downloading")
	add("o2", "Pending")
	all := append(slices.Clone(nodes), k8ssync.ModelCacheNode{})
	pc := DefaultConfig()
	pc.Wait = time.Hour
	ds := api.Desire{Name: "llama", OriginNodes: []string{"o1", "o2"}}
	for i := range 20 {
		d := "sha256:b" + strconv.Itoa(i)
		owner := rendezvous("llama\x00"+d, []string{"o1", "o2"})[0]
		for _, self := range []string{"me", "d0", "d7", "d31", "ready"} {
			f := &Fleet{cfg: pc, cluster: true, self: self, changed: make(chan struct{}), listed: map[string]time.Time{}}
			all[len(all)-1].Name = "me"
			all[len(all)-1].Status = k8ssync.ModelCacheNodeStatus{PeerAddress: "http://me:7435", Heartbeat: metav1.NewTime(now),
				Artifacts: []k8ssync.ArtifactStatus{{Name: "llama", Phase: "Pending"}}}
			f.SetNodes(all)
			pl := f.Plan(ds, "r1", d, now, now)
			if self == "ready" {
				continue
			}
			parents := treeParents("llama\x00"+d, owner, self, []string{"me", "ready", "o1", "o2", "d0", "d1", "d2", "d3", "d4", "d5", "d6", "d7", "d8", "d9",
				"d10", "d11", "d12", "d13", "d14", "d15", "d16", "d17", "d18", "d19", "d20", "d21", "d22", "d23", "d24", "d25", "d26", "d27", "d28", "d29",
				"d30", "d31", "d32", "d33", "d34", "d35", "d36", "d37", "d38", "d39"})
			if len(parents) == 0 || pl.Origin || len(pl.Peers) > MaxPeersAsked || pl.Peers[0] != "http://"+parents[0]+":7435" ||
				!slices.Contains(pl.Peers[:3], "http://"+owner+":7435") {
				t.Fatalf("blob %s, node %s: peers %v origin %v; want its parent %v first, the owner %s among the first 3, at most %d, no origin",
					d, self, pl.Peers, pl.Origin, parents, owner, MaxPeersAsked)
			}
			if !pl.Hold.After(now) {
				t.Fatalf("blob %s, node %s: hold %v: the ask at its parent is held", d, self, pl.Hold)
			}
		}
	}
}

// TestTreeParents: every node's chain of parents ends at the root; a
// parent always ranks before its child by the blob's hash (so nodes
// that see different sets of nodes never wait on each other); the root
// has one child, no node more than two; the chain is no longer than
// treeChain plus a row.
func TestTreeParents(t *testing.T) {
	for _, n := range []int{1, 2, 10, 33, 100, 1000} {
		var nodes []string
		for i := range n {
			nodes = append(nodes, "n"+strconv.Itoa(i))
		}
		key := "llama\x00sha256:b" + strconv.Itoa(n)
		rank := map[string]int{}
		for i, x := range rendezvous(key, nodes) {
			rank[x] = i
		}
		children := map[string]int{}
		row := (n - 1 + treeChain - 1) / treeChain
		for _, self := range nodes[1:] {
			ps := treeParents(key, "n0", self, nodes)
			if len(ps) == 0 || ps[len(ps)-1] != "n0" || len(ps) > treeChain+row {
				t.Fatalf("n=%d: %s's parents %v: want a chain to the root n0, at most %d long", n, self, ps, treeChain+row)
			}
			children[ps[0]]++
			for i, p := range ps[:len(ps)-1] {
				child := self
				if i > 0 {
					child = ps[i-1]
				}
				if rank[p] >= rank[child] {
					t.Fatalf("n=%d: %s's parent %s ranks after it", n, child, p)
				}
			}
			// Seen by a node that knows only some of the others: its
			// parent still ranks before it.
			some := slices.DeleteFunc(slices.Clone(nodes), func(x string) bool { return x != self && rank[x]%3 == 0 })
			if ps := treeParents(key, "n0", self, some); len(ps) > 1 && rank[ps[0]] >= rank[self] {
				t.Fatalf("n=%d: seen partly, %s's parent %s ranks after it", n, self, ps[0])
			}
		}
		if treeParents(key, "n0", "n0", nodes) != nil {
			t.Fatal("the root has parents")
		}
		for p, c := range children {
			if c > 2 || (p == "n0" && c != 1) {
				t.Fatalf("n=%d: %s has %d children: want 1 for the root, at most 2", n, p, c)
			}
		}
	}
}

// TestPlanPassesOverAnOriginNodeThatLied: an origin node whose bytes
// failed the check (set aside for digest) loses its share to the other
// origin nodes at once, as a gone one does; one that is only busy keeps
// it.
func TestPlanPassesOverAnOriginNodeThatLied(t *testing.T) {
	fetcher := testFetcher(t)
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "60")
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}))
	defer busy.Close()
	now := time.Now()
	var o1 k8ssync.ModelCacheNode
	o1.Name, o1.Status.PeerAddress, o1.Status.Heartbeat = "o1", busy.URL, metav1.NewTime(now)
	pc := DefaultConfig()
	pc.Wait = time.Hour
	f := &Fleet{cfg: pc, cluster: true, self: "me", fetcher: fetcher, changed: make(chan struct{}), listed: map[string]time.Time{}}
	f.SetNodes([]k8ssync.ModelCacheNode{o1})
	ds := api.Desire{Name: "llama", OriginNodes: []string{"o1", "me"}}
	var digest string // a blob o1 owns
	for i := 0; digest == ""; i++ {
		if d := "sha256:b" + strconv.Itoa(i); rendezvous("llama\x00"+d, ds.OriginNodes)[0] == "o1" {
			digest = d
		}
	}
	if pl := f.Plan(ds, "r1", digest, now, now); pl.Origin || !slices.Equal(pl.First, []string{"o1", "me"}) {
		t.Fatalf("first %v origin %v: want o1's share left to o1", pl.First, pl.Origin)
	}
	blob := p2p.Blob{Digest: "sha256:1111111111111111111111111111111111111111111111111111111111111111", Size: 1}
	if _, err := fetcher.Fetch(context.Background(), blob, []string{busy.URL}, discardPartial{}, nil); err == nil {
		t.Fatal("a fetch from a busy peer succeeded")
	}
	if avoided, why := fetcher.Avoided(busy.URL); !avoided || why != p2p.AvoidBusy {
		t.Fatalf("o1 avoided %v (%s), want busy", avoided, why)
	}
	if pl := f.Plan(ds, "r1", digest, now, now); pl.Origin || !slices.Equal(pl.First, []string{"o1", "me"}) {
		t.Fatalf("o1 busy: first %v origin %v: want o1's share left to o1", pl.First, pl.Origin)
	}
	fetcher.Distrust(p2p.Result{Spans: []p2p.Span{{Source: busy.URL, Bytes: 1}}}, errors.New("digest mismatch"))
	if pl := f.Plan(ds, "r1", digest, now, now); !pl.Origin || !slices.Equal(pl.First, []string{"me"}) {
		t.Fatalf("first %v origin %v: o1's bytes failed the check, yet it keeps its share", pl.First, pl.Origin)
	}
}

// TestPlanStaticFleetRanksItsOriginNodes: the nodes of a static fleet
// that start a pull at once agree on who goes to the origin for each
// blob (the first --origin-concurrency of the list by rendezvous hashing,
// the blob's owner among them): one node, not all; the others ask it
// first, and go to the origin themselves once Settle has passed.
func TestPlanStaticFleetRanksItsOriginNodes(t *testing.T) {
	tok := tokenFile(t)
	list := []string{"http://10.0.0.1:7435", "http://10.0.0.2:7435", "http://10.0.0.3:7435", "http://10.0.0.4:7435"}
	var fleet []*Fleet
	for _, self := range list {
		pc := DefaultConfig()
		pc.Addr, pc.Advertise, pc.StaticTokenFile, pc.Peers = ":0", self, tok, list
		pc.OriginConcurrency, pc.Settle = 1, time.Minute
		f, err := New(pc, Options{})
		if err != nil {
			t.Fatal(err)
		}
		fleet = append(fleet, f)
	}
	now := time.Now()
	ds := api.Desire{Name: "llama"}
	first := rendezvous("llama", list)[0]
	for i := range 10 {
		d := "sha256:b" + strconv.Itoa(i)
		for _, f := range fleet {
			pl := f.Plan(ds, "", d, now, now)
			if pl.Origin != (f.Self() == first) {
				t.Fatalf("blob %s, node %s: origin %v; want the origin for %s alone", d, f.Self(), pl.Origin, first)
			}
			if f.Self() != first && (len(pl.Peers) == 0 || pl.Peers[0] != first) {
				t.Fatalf("blob %s, node %s: peers %v, want %s first", d, f.Self(), pl.Peers, first)
			}
			if !f.Plan(ds, "", d, now, now.Add(time.Minute)).Origin {
				t.Fatalf("blob %s, node %s: no origin once Settle has passed", d, f.Self())
			}
		}
	}
}

// TestPlanHoldsNoAskPastSettle: a first node whose own status has not
// settled yet holds no ask at a peer past the moment its plan may send
// it to the origin (otherwise the first nodes hold asks at each other,
// and none fetches until the asks end); no ask is held while a peer holds
// the revision Ready; a node that is not among the first may be held
// until it goes to the origin itself.
func TestPlanHoldsNoAskPastSettle(t *testing.T) {
	now := time.Now()
	node := func(name, addr string) k8ssync.ModelCacheNode {
		var n k8ssync.ModelCacheNode
		n.Name, n.Status.PeerAddress, n.Status.Heartbeat = name, addr, metav1.NewTime(now)
		n.Status.Artifacts = []k8ssync.ArtifactStatus{{Name: "llama", Phase: "Downloading"}}
		return n
	}
	nodes := []k8ssync.ModelCacheNode{node("a", "http://10.0.0.1:7435"), node("b", "http://10.0.0.2:7435")}
	pc := DefaultConfig()
	pc.OriginConcurrency, pc.Wait, pc.Settle = 3, time.Hour, time.Minute
	f := &Fleet{cfg: pc, cluster: true, self: "me", changed: make(chan struct{}), listed: map[string]time.Time{}}
	f.SetNodes(nodes)
	ds := api.Desire{Name: "llama"}
	if pl := f.Plan(ds, "r1", "sha256:b1", now, now); pl.Origin || !slices.Contains(pl.First, "me") || !pl.Hold.Equal(now) {
		t.Fatalf("first node, its status not listing the artifact: origin %v, first %v, hold %v; want no origin, first, no hold", pl.Origin, pl.First, pl.Hold.Sub(now))
	}
	f.SetNodes(append(nodes, node("me", "http://10.0.0.9:7435")))
	if pl := f.Plan(ds, "r1", "sha256:b1", now, now); pl.Origin || !pl.Hold.Equal(now.Add(time.Minute)) {
		t.Fatalf("first node, listed now: origin %v, hold %v; want no origin, held until Settle has passed", pl.Origin, pl.Hold.Sub(now))
	}
	if pl := f.Plan(ds, "r1", "sha256:b1", now, now.Add(time.Minute)); !pl.Hold.Equal(now.Add(time.Hour)) {
		t.Fatalf("first node, settled: hold %v, want --peer-wait", pl.Hold.Sub(now))
	}
	// A peer that holds the revision Ready answers at once: no ask is
	// held, even by a settled node that is no first node.
	holder := node("holder", "http://10.0.0.5:7435")
	holder.Status.Artifacts[0].Phase, holder.Status.Artifacts[0].Revision = "Ready", "r1"
	f.SetNodes(append(nodes, node("me", "http://10.0.0.9:7435"), holder))
	if pl := f.Plan(ds, "r1", "sha256:b1", now, now.Add(time.Minute)); !pl.Hold.Equal(now.Add(time.Minute)) || !slices.Contains(pl.Peers, "http://10.0.0.5:7435") {
		t.Fatalf("with a Ready holder: hold %v, peers %v; want no hold, the holder asked", pl.Hold.Sub(now), pl.Peers)
	}
	// The last of three by the hash is no first node of one.
	all := append(nodes, node("me", "http://10.0.0.9:7435"))
	pc.OriginConcurrency = 1
	last := rendezvous("llama", []string{"a", "b", "me"})[2]
	other := &Fleet{cfg: pc, cluster: true, self: last, changed: make(chan struct{}), listed: map[string]time.Time{}}
	other.SetNodes(all)
	if pl := other.Plan(ds, "r1", "sha256:b1", now, now); slices.Contains(pl.First, last) || !pl.Hold.Equal(now.Add(time.Hour)) {
		t.Fatalf("not a first node (first %v): hold %v, want --peer-wait", pl.First, pl.Hold.Sub(now))
	}
}
