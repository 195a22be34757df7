package daemon

import (
	"context"
	"errors"
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
	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
	"github.com/modelcache/modelcache/internal/testenv"
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
// as k8ssync's watch of ModelCacheNodes hands them over; extra are
// statuses of nodes without a daemon here, handed over with them.
func asCluster(t testing.TB, hs []*harness, extra ...k8ssync.ModelCacheNode) {
	var mu sync.Mutex
	publish := func() {
		mu.Lock()
		defer mu.Unlock()
		var nodes []k8ssync.ModelCacheNode
		for i, h := range hs {
			var n k8ssync.ModelCacheNode
			n.Name = "node-" + strconv.Itoa(i)
			n.Status.PeerAddress = "http://" + h.d.fanout.Listening()
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
		for _, n := range extra { // nodes with no daemon here: their statuses as given, fresh
			n.Status.Heartbeat = metav1.Now()
			nodes = append(nodes, n)
		}
		for _, h := range hs {
			clusterNode{h.d}.SetPeerNodes(nodes)
		}
	}
	for i, h := range hs {
		h.d.fanout.AsCluster("node-" + strconv.Itoa(i))
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

// TestFanOutNoPeerFailsAPull: in a cluster, a node that may not use the
// origin yet (not a recorded origin node) meets a holder that flips bytes,
// origin nodes that answer and never send or whose daemon is gone, and a
// holder that answers 503 for ever: it sets each aside and takes the
// model from the honest origin node, never from the origin, and no pull
// fails. The honest origin node takes the shares of the origin nodes it
// found gone or lying, so the origin sends each shard once.
func TestFanOutNoPeerFailsAPull(t *testing.T) {
	hub := newFanHub(t)
	files, lfs := fanModel(10)
	rev := hub.Commit("acme/fan", files, "main")
	small := int64(len(files["config.json"]) + len(files["tokenizer.json"]))
	origins := []string{"node-0", "flipper", "silent", "gone"}
	bySum := map[string][]byte{}
	owned := map[string]bool{} // the origin nodes that own a shard
	for p, b := range files {
		bySum["sha256:"+sha(b)] = b
		if strings.HasSuffix(p, ".safetensors") {
			owned[k8ssync.Rendezvous("fan\x00sha256:"+sha(b), origins)[0]] = true
		}
	}
	if !owned["flipper"] || !owned["silent"] || !owned["gone"] {
		t.Fatalf("shards owned by %v: the model must give each hostile origin node a share to move", owned)
	}
	var flipped, silent, busy atomic.Int64
	serve := func(count *atomic.Int64, h func(w http.ResponseWriter, r *http.Request, b []byte)) string {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b, ok := bySum[strings.TrimPrefix(r.URL.Path, p2p.BlobPath)]
			if !ok {
				http.NotFound(w, r)
				return
			}
			count.Add(1)
			h(w, r, b)
		}))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	flipper := serve(&flipped, func(w http.ResponseWriter, _ *http.Request, b []byte) {
		bad := slices.Clone(b)
		bad[len(bad)/2] ^= 0xff
		w.Header().Set("Content-Length", strconv.Itoa(len(bad)))
		w.Write(bad)
	})
	quit := make(chan struct{})
	mute := serve(&silent, func(w http.ResponseWriter, r *http.Request, b []byte) {
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		select { // answers, and never sends
		case <-r.Context().Done():
		case <-quit:
		}
	})
	t.Cleanup(func() { close(quit) }) // before the servers close (cleanups run last first)
	full := serve(&busy, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "busy", http.StatusServiceUnavailable)
	})
	gone := "http://" + freeAddrs(t, 1)[0] // nothing listens there

	hs, tok := fanFleet(t, 2, 1, func(c *Config) { c.Peer.Wait = time.Hour })
	for _, h := range hs {
		// A peer that sends nothing for a second is stalled.
		f, err := p2p.NewFetcher(p2p.NewTokenFile(tok), p2p.WithHTTP(fetchers.WithIdleTimeout(time.Second)), p2p.WithFetcherMetrics(h.d.metrics.peer))
		if err != nil {
			t.Fatal(err)
		}
		h.d.fanout.SetFetcher(f)
	}
	status := func(name, addr, phase string) k8ssync.ModelCacheNode {
		var n k8ssync.ModelCacheNode
		n.Name, n.Status.PeerAddress = name, addr
		n.Status.Artifacts = []k8ssync.ArtifactStatus{{Name: "fan", Phase: phase, Revision: rev}}
		return n
	}
	asCluster(t, hs, status("flipper", flipper, "Ready"), status("silent", mute, "Downloading"),
		status("busy", full, "Ready"), status("gone", gone, "Downloading"))
	want := map[string]api.Desire{"fan": {Name: "fan", URI: "hf://acme/fan@" + rev, Revision: rev, Ref: "main",
		OriginNodes: origins}}
	// node-1 first: nothing honest holds the model yet, so it meets every
	// hostile peer before node-0 starts.
	if err := (clusterNode{hs[1].d}).SetClusterDesires(want, nil); err != nil {
		t.Fatal(err)
	}
	tick := func() <-chan struct{} {
		c := make(chan struct{})
		time.AfterFunc(20*time.Millisecond, func() { close(c) })
		return c
	}
	testenv.Await(t, "node-1 asks the flipper", 30*time.Second, tick, func() error {
		if flipped.Load() == 0 {
			return errors.New("not asked yet")
		}
		return nil
	})
	if err := (clusterNode{hs[0].d}).SetClusterDesires(want, nil); err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		h.waitPhase("fan", api.PhaseReady)
		h.checkModel("fan", files)
	}
	m := hs[1].d.metrics.peer
	if got := testutil.ToFloat64(m.Fetched("origin")); got != 0 {
		t.Errorf("node-1 fetched %v shard bytes from the origin, want none (not an origin node, --peer-wait 1h)", got)
	}
	for _, why := range []string{p2p.AvoidDigest, p2p.AvoidStall, p2p.AvoidNetwork, p2p.AvoidBusy} {
		if testutil.ToFloat64(m.Avoided(why)) == 0 {
			t.Errorf("node-1 set aside no peer for %s", why)
		}
	}
	if silent.Load() == 0 || busy.Load() == 0 {
		t.Errorf("asked: silent %d, busy %d times; want each asked", silent.Load(), busy.Load())
	}
	if got := hub.Sent.Load(); got != lfs+2*small {
		t.Fatalf("origin sent %d bytes, want %d: the shards once (node-0 took the shares of the origin nodes it set aside), the small files twice", got, lfs+2*small)
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
	u := "http://" + h.d.fanout.Listening() + p2p.BlobPath + "sha256:" + sha(shard)
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
	hs[0].d.fanout.SetFetcher(f)
	if _, err := hs[0].pull(api.PullRequest{Name: "fan", URI: "hf://acme/fan"}); err != nil {
		t.Fatal(err)
	}
	hs[0].checkModel("fan", files)
	if v := testutil.ToFloat64(hs[0].d.metrics.fetchErrors.WithLabelValues("hf")); v != 0 {
		t.Fatalf("%v failed attempts against a slow origin the daemon's floor allows", v)
	}
}
