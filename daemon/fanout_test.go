package daemon

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
	"github.com/modelcache/modelcache/k8ssync"
	p2p "github.com/modelcache/modelcache/peer"
)

// fanModel is a model of four LFS shards (served by the hub's CDN, each
// with its sha256) and two small files (no digest: always the origin's).
func fanModel(seed byte) (files map[string][]byte, lfs int64) {
	files = map[string][]byte{
		"config.json":    []byte(`{"architectures":["LlamaForCausalLM"],"model_type":"llama"}`),
		"tokenizer.json": []byte(`{"version":"1.0"}`),
	}
	for i := range 4 {
		b := safetensors(256<<10+i, seed+byte(i))
		files["model-0000"+strconv.Itoa(i+1)+"-of-00004.safetensors"] = b
		lfs += int64(len(b))
	}
	return files, lfs
}

// freeAddrs reserves n loopback ports for peer ports that must know each
// other before any listens.
func freeAddrs(t testing.TB, n int) []string {
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, l.Addr().String())
		l.Close()
	}
	return out
}

// fanFleet starts n daemons that are each other's static peers, sharing
// one token file, against hub.
func fanFleet(t testing.TB, n, originConcurrency int, tune func(*Config), extra ...string) ([]*harness, string) {
	t.Setenv("HF_TOKEN", "")
	t.Setenv("HF_HOME", t.TempDir())
	tok := filepath.Join(t.TempDir(), "peer-token")
	if err := os.WriteFile(tok, []byte("s3cret-fleet-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addrs := freeAddrs(t, n)
	var hs []*harness
	for i := range n {
		cfg := testConfig(t)
		cfg.MetricsAddr = ""
		pc := DefaultPeerConfig()
		pc.Addr, pc.Advertise, pc.StaticTokenFile = addrs[i], "http://"+addrs[i], tok
		pc.Peers = append(slices.Clone(addrs), extra...)
		pc.OriginConcurrency, pc.Poll, pc.Settle = originConcurrency, 20*time.Millisecond, 300*time.Millisecond
		cfg.Peer = &pc
		if tune != nil {
			tune(&cfg)
		}
		hs = append(hs, start(t, cfg))
	}
	return hs, tok
}

func newFanHub(t testing.TB) *hubtest.Hub {
	hub := hubtest.New()
	t.Cleanup(hub.Close)
	t.Setenv("HF_ENDPOINT", hub.URL())
	return hub
}

func (h *harness) checkModel(name string, files map[string][]byte) {
	h.t.Helper()
	for p, b := range files {
		if h.read(name, p) != string(b) {
			h.t.Fatalf("%s of %s differs from the origin's", p, name)
		}
	}
}

// TestFanOutPeersBeforeOrigin: node A fetches a model from the origin;
// B and C then fetch its shards from A (or each other), not the origin:
// the origin sends the shards once, not three times. The pull's stats say
// which files came from peers, and the metrics count bytes by source.
func TestFanOutPeersBeforeOrigin(t *testing.T) {
	hub := newFanHub(t)
	hs, _ := fanFleet(t, 3, 1, nil)
	files, lfs := fanModel(1)
	hub.Commit("acme/fan", files, "main")
	small := int64(len(files["config.json"]) + len(files["tokenizer.json"]))
	req := api.PullRequest{Name: "fan", URI: "hf://acme/fan"}

	if _, err := hs[0].pull(req); err != nil {
		t.Fatal(err)
	}
	if got := hub.Sent.Load(); got != lfs+small {
		t.Fatalf("node A: origin sent %d bytes, want the model's %d", got, lfs+small)
	}
	for _, h := range hs[1:] {
		a, err := h.pull(req)
		if err != nil {
			t.Fatal(err)
		}
		h.checkModel("fan", files)
		if lp := a.LastPull; lp == nil || lp.BytesFromPeers != lfs || len(lp.FilesFromPeers) != 4 {
			t.Fatalf("last pull %+v: want all %d shard bytes, 4 files, from peers", lp, lfs)
		}
		if got := testutil.ToFloat64(h.d.metrics.peer.Fetched("peer")); got != float64(lfs) {
			t.Fatalf("modelcache_peer_fetched_bytes_total{source=peer} = %v, want %d", got, lfs)
		}
	}
	// The small files have no digest to check a peer's bytes against:
	// they come from the origin, each time.
	if got := hub.Sent.Load(); got != lfs+3*small {
		t.Fatalf("origin sent %d bytes for 3 nodes, want %d (the shards once, the small files thrice)", got, lfs+3*small)
	}
	var served float64
	for _, h := range hs {
		served += testutil.ToFloat64(h.d.metrics.peer.Uploads())
	}
	if served != 8 {
		t.Fatalf("peer uploads %v, want 8 (4 shards to each of B and C)", served)
	}
	// Each version's files say which peers sent their bytes (none: the
	// origin), and C's still say so after its daemon restarts.
	checkFiles := func(h *harness, who string, fromPeers bool) {
		t.Helper()
		a, err := h.c.Get(context.Background(), "fan")
		if err != nil || len(a.Versions) != 1 {
			t.Fatalf("%s: inspect fan: %+v %v", who, a, err)
		}
		for _, f := range a.Versions[0].Files {
			shard := strings.HasSuffix(f.Path, ".safetensors")
			if got := len(f.Peers) > 0; got != (shard && fromPeers) {
				t.Errorf("%s: %s from peers %v; want peers only for the shards of a node that took them from peers", who, f.Path, f.Peers)
			}
			for _, pe := range f.Peers {
				if !strings.HasPrefix(pe, "http://127.0.0.1:") {
					t.Errorf("%s: %s: peer %q is no peer's base URL", who, f.Path, pe)
				}
			}
		}
	}
	checkFiles(hs[0], "node A", false)
	checkFiles(hs[1], "node B", true)
	hs[2].stop()
	checkFiles(start(t, hs[2].cfg), "node C after a restart", true)
}

// asCluster makes the fleet's daemons peers as in a cluster: each is a
// node named node-<i> whose status (built from its artifacts as k8ssync
// builds it, with its peer address) every daemon sees after each change,
// as k8ssync's watch of ModelCacheNodes hands them over.
func asCluster(t testing.TB, hs []*harness) {
	var mu sync.Mutex
	publish := func() {
		mu.Lock()
		defer mu.Unlock()
		var nodes []k8ssync.ModelCacheNode
		for i, h := range hs {
			var n k8ssync.ModelCacheNode
			n.Name = "node-" + strconv.Itoa(i)
			n.Status.PeerAddress = "http://" + h.d.fanout.listening()
			n.Status.Heartbeat = metav1.Now()
			arts, err := clusterNode{h.d}.Artifacts()
			if err != nil {
				t.Error(err)
				return
			}
			for _, a := range arts {
				n.Status.Artifacts = append(n.Status.Artifacts, k8ssync.ArtifactStatus{Name: a.Name, Phase: string(a.Phase), Revision: a.Revision, Digest: a.ManifestDigest})
			}
			nodes = append(nodes, n)
		}
		for _, h := range hs {
			clusterNode{h.d}.SetPeerNodes(nodes)
		}
	}
	for i, h := range hs {
		h.d.fanout.cluster, h.d.fanout.self = true, "node-"+strconv.Itoa(i)
	}
	// The publishers stop, and are waited for, before the daemons close
	// (cleanups run last registered first; the fleet's came before): a
	// publish must never read a closed store.
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, h := range hs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				changed := h.d.Changed()
				publish()
				select {
				case <-ctx.Done():
					return
				case <-changed:
				}
			}
		}()
	}
}

// TestFanOutOriginConcurrency: three nodes of a cluster get the cluster's
// desire at once with --origin-concurrency 2: two of them fetch the
// shards from the origin, each its share, the third waits for their
// blobs and takes them from peers, and every node ends with the model.
// The origin sends each shard once.
func TestFanOutOriginConcurrency(t *testing.T) {
	hub := newFanHub(t)
	hs, _ := fanFleet(t, 3, 2, nil)
	asCluster(t, hs)
	files, lfs := fanModel(2)
	rev := hub.Commit("acme/fan", files, "main")
	small := int64(len(files["config.json"]) + len(files["tokenizer.json"]))
	want := map[string]api.Desire{"fan": {Name: "fan", URI: "hf://acme/fan@" + rev, Revision: rev, Ref: "main"}}
	for _, h := range hs {
		if err := (clusterNode{h.d}).SetClusterDesires(want, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, h := range hs {
		h.waitPhase("fan", api.PhaseReady)
		h.checkModel("fan", files)
	}
	if got := hub.Sent.Load(); got != lfs+3*small {
		t.Fatalf("origin sent %d bytes, want %d: the shards once (the first two nodes share them), the small files thrice", got, lfs+3*small)
	}
	var fromOrigin int
	for _, h := range hs {
		if testutil.ToFloat64(h.d.metrics.peer.Fetched("origin")) > 0 {
			fromOrigin++
		}
	}
	if fromOrigin < 1 || fromOrigin > 2 {
		t.Fatalf("%d nodes fetched shards from the origin, want 1 or 2 (--origin-concurrency 2)", fromOrigin)
	}
	// A socket pull's digests are its requester's: in a cluster it never
	// asks the peers (they may hold blobs the requester may not read).
	other, _ := fanModel(5)
	hub.Commit("acme/other", other, "main")
	before := testutil.ToFloat64(hs[1].d.metrics.peer.Fetched("origin")) + testutil.ToFloat64(hs[1].d.metrics.peer.Fetched("peer"))
	if _, err := hs[1].pull(api.PullRequest{Name: "other", URI: "hf://acme/other"}); err != nil {
		t.Fatal(err)
	}
	if after := testutil.ToFloat64(hs[1].d.metrics.peer.Fetched("origin")) + testutil.ToFloat64(hs[1].d.metrics.peer.Fetched("peer")); after != before {
		t.Fatalf("a socket pull in a cluster went through the peer fetcher (%v → %v bytes)", before, after)
	}
}

// TestFanOutHostilePeer: a peer that answers every blob with flipped
// bytes of the right length costs one retry from the origin and is set
// aside; no wrong byte is committed and the pull succeeds.
func TestFanOutHostilePeer(t *testing.T) {
	hub := newFanHub(t)
	files, lfs := fanModel(3)
	hub.Commit("acme/fan", files, "main")
	bySum := map[string][]byte{}
	for _, b := range files {
		bySum["sha256:"+sha(b)] = b
	}
	var asked sync.Map
	liar := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d := strings.TrimPrefix(r.URL.Path, p2p.BlobPath)
		asked.Store(d, true)
		b, ok := bySum[d]
		if !ok {
			http.NotFound(w, r)
			return
		}
		bad := slices.Clone(b)
		bad[len(bad)/2] ^= 0xff
		w.Header().Set("Content-Length", strconv.Itoa(len(bad)))
		w.Write(bad)
	}))
	t.Cleanup(liar.Close)
	// One file at a time: the liar is asked once, then set aside.
	hs, _ := fanFleet(t, 1, 2, func(c *Config) { c.FilesPerPull = 1 }, liar.URL)
	h := hs[0]
	a, err := h.pull(api.PullRequest{Name: "fan", URI: "hf://acme/fan"})
	if err != nil {
		t.Fatal(err)
	}
	h.checkModel("fan", files)
	if got := testutil.ToFloat64(h.d.metrics.peer.Avoided(p2p.AvoidDigest)); got != 1 {
		t.Fatalf("peers set aside for wrong bytes: %v, want 1", got)
	}
	if a.LastPull.BytesFromPeers == 0 {
		t.Fatal("the liar's bytes are not counted as received from a peer")
	}
	n := 0
	asked.Range(func(any, any) bool { n++; return true })
	if n != 1 {
		t.Fatalf("the liar was asked for %d blobs, want 1 (set aside after its first)", n)
	}
	if v := testutil.ToFloat64(h.d.metrics.verifications.WithLabelValues("mismatch")); v != 1 {
		t.Fatalf("verifications{mismatch} = %v, want 1", v)
	}
	if got := hub.Sent.Load(); got < lfs {
		t.Fatalf("origin sent %d bytes, want at least the shards' %d", got, lfs)
	}
}

// TestFanOutPeerPortRefusesWithoutToken: the peer port answers 401 to a
// request without the fleet's token or with another, and serves a
// committed blob to one with it.
func TestFanOutPeerPortRefusesWithoutToken(t *testing.T) {
	hub := newFanHub(t)
	files, _ := fanModel(4)
	hub.Commit("acme/fan", files, "main")
	hs, _ := fanFleet(t, 1, 1, nil)
	h := hs[0]
	if _, err := h.pull(api.PullRequest{Name: "fan", URI: "hf://acme/fan"}); err != nil {
		t.Fatal(err)
	}
	shard := files["model-00001-of-00004.safetensors"]
	u := "http://" + h.d.fanout.listening() + p2p.BlobPath + "sha256:" + sha(shard)
	for _, c := range []struct {
		auth string
		want int
	}{{"", http.StatusUnauthorized}, {"Bearer not-the-token", http.StatusUnauthorized}, {"Bearer s3cret-fleet-token", http.StatusOK}} {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, u, nil)
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Fatalf("Authorization %q: %s, want %d", c.auth, resp.Status, c.want)
		}
		if c.want == http.StatusOK && resp.ContentLength != int64(len(shard)) {
			t.Fatalf("served %d bytes of a %d-byte blob", resp.ContentLength, len(shard))
		}
	}
	if got := testutil.ToFloat64(h.d.metrics.peer.Refusals(p2p.RefusedUnauthorized)); got != 2 {
		t.Fatalf("refusals{unauthorized} = %v, want 2", got)
	}
}

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
	pc := DefaultPeerConfig()
	pc.OriginConcurrency, pc.Wait = 2, time.Hour
	pc.Settle = time.Minute
	f := &fanout{cfg: pc, cluster: true, self: "me", changed: make(chan struct{}), listed: map[string]time.Time{}}
	f.setNodes(nodes)
	ds := api.Desire{Name: "llama"}
	if pl := f.plan(ds, "r1", "sha256:b1", now, now); pl.origin {
		t.Fatal("the origin before this node's own status lists the artifact")
	}
	f.setNodes(append(nodes, me))
	if pl := f.plan(ds, "r1", "sha256:b1", now, now); pl.origin {
		t.Fatal("the origin before this node's status has listed the artifact for the settle time")
	}
	pl := f.plan(ds, "r1", "sha256:b1", now, now.Add(time.Minute))
	if want := []string{"http://10.0.0.1:7435", "http://10.0.0.3:7435"}; !slices.Equal(pl.peers, want) {
		t.Fatalf("peers %v, want %v (the holder, then the node downloading)", pl.peers, want)
	}
	want := rendezvous("llama", []string{"me", "fetching", "pending"})[:2]
	if !slices.Equal(pl.first, want) {
		t.Fatalf("origin first %v, want %v", pl.first, want)
	}
	if owner := rendezvous("llama\x00sha256:b1", want)[0]; pl.origin != (owner == "me") {
		t.Fatalf("origin %v, want %v: of the first nodes, %s fetches this blob", pl.origin, owner == "me", owner)
	}
	if !f.plan(ds, "r1", "sha256:b1", now.Add(-time.Hour), now).origin {
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
	pc := DefaultPeerConfig()
	pc.OriginConcurrency, pc.Wait, pc.Settle = 2, time.Hour, time.Minute
	fan := func(self string, nodes ...k8ssync.ModelCacheNode) *fanout {
		f := &fanout{cfg: pc, cluster: true, self: self, changed: make(chan struct{}), listed: map[string]time.Time{}}
		f.setNodes(nodes)
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
	pl := f.plan(ds, "r1", mine, now, now)
	if !slices.Equal(pl.first, []string{"o1", "me"}) || !pl.origin {
		t.Fatalf("first %v origin %v: want the recorded origin nodes, and the origin at once for this node's blob", pl.first, pl.origin)
	}
	if f.plan(ds, "r1", theirs, now, now).origin {
		t.Fatal("the origin for a blob another origin node owns")
	}
	// The same answer in any order of the record and of the statuses.
	rev := api.Desire{Name: "llama", OriginNodes: []string{"me", "o1", "me"}}
	g := fan("me", node("late", "Pending", time.Minute), node("o1", "Downloading", time.Minute))
	if g.plan(rev, "r1", theirs, now, now).origin || !g.plan(rev, "r1", mine, now, now).origin {
		t.Fatal("the owner of a blob depends on the order of the record or of the statuses")
	}

	// Not an origin node: no origin before --peer-wait, however long its
	// own status has listed the artifact and whatever it ranks.
	other := fan("late", node("o1", "Downloading", time.Minute), node("me", "Downloading", time.Minute), node("late", "Pending", time.Minute))
	for _, d := range []string{mine, theirs} {
		other.plan(ds, "r1", d, now, now)
		if pl := other.plan(ds, "r1", d, now, now.Add(time.Hour-time.Second)); pl.origin || !slices.Equal(pl.first, []string{"o1", "me"}) {
			t.Fatalf("a node that is not an origin node: origin %v, first %v", pl.origin, pl.first)
		}
	}
	if !other.plan(ds, "r1", mine, now, now.Add(time.Hour)).origin {
		t.Fatal("after --peer-wait every node may go to the origin")
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
		pl := fan("me", o1...).plan(ds, "r1", theirs, now, now)
		if !pl.origin || !slices.Equal(pl.first, []string{"me"}) {
			t.Fatalf("o1 %s: first %v origin %v, want this node alone, at once", name, pl.first, pl.origin)
		}
	}
	gone := fan("me", node("o1", "Downloading", time.Minute))
	gone.setNodes(nil)
	if pl := gone.plan(ds, "r1", theirs, now, now); !pl.origin || !slices.Equal(pl.first, []string{"me"}) {
		t.Fatalf("o1 gone: first %v origin %v, want this node alone, at once", pl.first, pl.origin)
	}
	// One whose status has not reached this node yet (the elected daemon
	// saw it live) keeps its share.
	var bare k8ssync.ModelCacheNode
	bare.Name = "o1"
	for name, f := range map[string]*fanout{"not seen yet": fan("me"), "seen without a status": fan("me", bare)} {
		if pl := f.plan(ds, "r1", theirs, now, now); pl.origin || !slices.Equal(pl.first, []string{"o1", "me"}) {
			t.Fatalf("o1 %s: first %v origin %v, want both recorded nodes and no origin for o1's blob", name, pl.first, pl.origin)
		}
	}

	// No recorded origin node left: the nodes that want it are ranked,
	// after the settle time, as without a record.
	dead := api.Desire{Name: "llama", OriginNodes: []string{"o1"}}
	h := fan("me", node("o1", "Failed", time.Minute), node("me", "Pending", time.Minute), node("p", "Pending", time.Minute))
	want := rendezvous("llama", []string{"me", "p"})
	d := digestOwnedBy(want, "me")
	if pl := h.plan(dead, "r1", d, now, now); pl.origin || !slices.Equal(pl.first, want) {
		t.Fatalf("first %v origin %v: want %v ranked, and no origin before the settle time", pl.first, pl.origin, want)
	}
	if !h.plan(dead, "r1", d, now, now.Add(time.Minute)).origin {
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
	if pl := fan("me", xs...).plan(long, "r1", mine, now, now); slices.Contains(pl.first, "me") || pl.origin {
		t.Fatalf("first %v origin %v: an entry past the cap counted", pl.first, pl.origin)
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
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	fetcher, err := p2p.NewFetcher(p2p.NewTokenFile(tok))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	var o1, me k8ssync.ModelCacheNode
	o1.Name, o1.Status.PeerAddress, o1.Status.Heartbeat = "o1", gone, metav1.NewTime(now.Add(-time.Minute))
	o1.Status.Artifacts = []k8ssync.ArtifactStatus{{Name: "llama", Phase: "Pending"}}
	me.Name, me.Status.PeerAddress, me.Status.Heartbeat = "me", "http://127.0.0.1:1", metav1.NewTime(now)
	pc := DefaultPeerConfig()
	pc.OriginConcurrency, pc.Wait = 2, time.Hour
	f := &fanout{cfg: pc, cluster: true, self: "me", fetcher: fetcher, changed: make(chan struct{}), listed: map[string]time.Time{}}
	f.setNodes([]k8ssync.ModelCacheNode{o1, me})
	ds := api.Desire{Name: "llama", OriginNodes: []string{"o1"}}
	const digest = "sha256:1111111111111111111111111111111111111111111111111111111111111111"

	pl := f.plan(ds, "r1", digest, now, now)
	if pl.origin || !slices.Equal(pl.first, []string{"o1"}) || !slices.Contains(pl.peers, gone) {
		t.Fatalf("before asking it: first %v origin %v peers %v; want o1 the origin node, asked as a peer, and no origin here", pl.first, pl.origin, pl.peers)
	}
	if _, err := fetcher.Fetch(context.Background(), p2p.Blob{Digest: digest, Size: 1}, pl.peers, discardPartial{}, nil); err == nil {
		t.Fatal("a fetch from a peer port that takes no connection succeeded")
	}
	if avoided, why := fetcher.Avoided(gone); !avoided || why != p2p.AvoidNetwork {
		t.Fatalf("o1 avoided %v (%s); want set aside for %s", avoided, why, p2p.AvoidNetwork)
	}
	pl = f.plan(ds, "r1", digest, now, now)
	if slices.Contains(pl.first, "o1") {
		t.Fatalf("first %v: o1's peer port took no connection, yet it stays an origin node", pl.first)
	}
	if !slices.Equal(pl.first, []string{"me"}) {
		t.Fatalf("first %v: want this node alone, ranked among the nodes that want it", pl.first)
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

// TestPeerConfigValidate: each bad peer setting is refused with an error
// that names its flag.
func TestPeerConfigValidate(t *testing.T) {
	good := func() PeerConfig {
		p := DefaultPeerConfig()
		p.Addr, p.Advertise, p.ServiceAccount = ":7435", "http://10.0.0.7:7435", "modelcache-system/modelcached"
		return p
	}
	static := func() PeerConfig {
		p := good()
		p.StaticTokenFile, p.Peers = "/etc/modelcached/peer-token", []string{"10.0.0.7:7435", "http://10.0.0.8:7435"}
		return p
	}
	for _, c := range []struct {
		name    string
		p       PeerConfig
		cluster bool
		want    string // "" = valid
	}{
		{"cluster", good(), true, ""},
		{"static", static(), false, ""},
		{"no addr", func() PeerConfig { p := good(); p.Addr = ""; return p }(), true, "--peer-addr"},
		{"addr without port", func() PeerConfig { p := good(); p.Addr = "10.0.0.7"; return p }(), true, "--peer-addr"},
		{"outside kubernetes without a token", good(), false, "--peer-static-token-file"},
		{"peers without the shared token", func() PeerConfig { p := good(); p.Peers = []string{"10.0.0.8:7435"}; return p }(), true, "--peers needs --peer-static-token-file"},
		{"peer with a path", func() PeerConfig { p := static(); p.Peers = []string{"http://10.0.0.8:7435/x"}; return p }(), false, "--peers"},
		{"peer with credentials", func() PeerConfig { p := static(); p.Peers = []string{"http://u:p@10.0.0.8:7435"}; return p }(), false, "--peers"},
		{"peer without a port", func() PeerConfig { p := static(); p.Peers = []string{"10.0.0.8"}; return p }(), false, "--peers"},
		{"static without self", func() PeerConfig { p := static(); p.Advertise = ""; return p }(), false, "--peer-advertise"},
		{"relative static token", func() PeerConfig { p := static(); p.StaticTokenFile = "token"; return p }(), false, "--peer-static-token-file"},
		{"no service account", func() PeerConfig { p := good(); p.ServiceAccount = "modelcached"; return p }(), true, "--peer-service-account"},
		{"no advertised address", func() PeerConfig { p := good(); p.Advertise = ""; return p }(), true, "POD_IP"},
		{"bad advertise", func() PeerConfig { p := good(); p.Advertise = "ftp://x:1"; return p }(), true, "--peer-advertise"},
		{"relative token", func() PeerConfig { p := good(); p.TokenFile = "token"; return p }(), true, "--peer-token-file"},
		{"no uploads", func() PeerConfig { p := good(); p.MaxUploads = 0; return p }(), true, "--peer-max-uploads"},
		{"negative rate", func() PeerConfig { p := good(); p.UploadRate = -1; return p }(), true, "--peer-upload-rate"},
		{"no origin concurrency", func() PeerConfig { p := good(); p.OriginConcurrency = 0; return p }(), true, "--origin-concurrency"},
		{"no wait", func() PeerConfig { p := good(); p.Wait = 0; return p }(), true, "--peer-wait"},
	} {
		err := c.p.validate(c.cluster)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want an error naming %s", c.name, err, c.want)
		}
	}
}

// TestFanOutSlowOriginKeepsItsOwnFloor: an origin slower than the peer
// fetcher's floor for peers but above the daemon's --progress-floor is
// not dropped as stalled: through the peer path, as without it, the
// origin is held to the daemon's floor only.
func TestFanOutSlowOriginKeepsItsOwnFloor(t *testing.T) {
	hub := newFanHub(t)
	files, _ := fanModel(6)
	hub.Commit("acme/fan", files, "main")
	var sent atomic.Int64
	throttle(hub, files, 1<<20, &sent) // 1 MiB/s in all: under 8 MiB per 10 s
	hs, tok := fanFleet(t, 1, 1, func(c *Config) { c.FilesPerPull = 1 })
	// A peer floor of 10 MiB/s (the default, 8 MiB per 10 s, would take
	// a transfer longer than 10 s to show).
	f, err := p2p.NewFetcher(p2p.NewTokenFile(tok), p2p.WithProgressFloor(1<<20, 100*time.Millisecond), p2p.WithFetcherMetrics(hs[0].d.metrics.peer))
	if err != nil {
		t.Fatal(err)
	}
	hs[0].d.fanout.fetcher = f
	if _, err := hs[0].pull(api.PullRequest{Name: "fan", URI: "hf://acme/fan"}); err != nil {
		t.Fatal(err)
	}
	hs[0].checkModel("fan", files)
	if v := testutil.ToFloat64(hs[0].d.metrics.fetchErrors.WithLabelValues("hf")); v != 0 {
		t.Fatalf("%v failed attempts against a slow origin the daemon's floor allows", v)
	}
}
