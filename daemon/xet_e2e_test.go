package daemon

import (
	"context"
	"testing"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers/hf/xet/xettest"
)

// TestHFXetEndToEnd: the daemon pulls an hf:// model over Xet from the
// test hub's CAS, then a revision with 10% of its tensors changed: the
// second fetches only chunks the store lacks (the store's chunk index,
// fetchers/hf/xet), every file is whole and verified, and inspect says
// the files came over Xet.
func TestHFXetEndToEnd(t *testing.T) {
	h, hub := startWithHub(t)
	cas := hub.EnableXet()
	const tensor = 256 << 10
	v1 := xettest.Model(21, 6<<20, tensor)
	v2 := xettest.Mutate(v1, 22, 0.10, tensor)
	hub.Commit("acme/xet", map[string][]byte{"model.safetensors": v1, "config.json": []byte(`{"model_type":"llama"}`)}, "v1")
	hub.Commit("acme/xet", map[string][]byte{"model.safetensors": v2, "config.json": []byte(`{"model_type":"llama"}`)}, "v2")
	if _, err := h.pull(api.PullRequest{Name: "x", URI: "hf://acme/xet@v1"}); err != nil {
		t.Fatal(err)
	}
	if h.read("x", "model.safetensors") != string(v1) {
		t.Fatal("rev 1 differs")
	}
	sent := cas.Sent.Load()
	if _, err := h.pull(api.PullRequest{Name: "x", URI: "hf://acme/xet@v2"}); err != nil {
		t.Fatal(err)
	}
	if h.read("x", "model.safetensors") != string(v2) {
		t.Fatal("rev 2 differs")
	}
	ratio := float64(cas.Sent.Load()-sent) / float64(len(v2))
	t.Logf("rev 2: %.3f of its bytes fetched from the CAS; bridge GETs %d", ratio, hub.ResolveGets.Load())
	if ratio > 0.15 {
		t.Errorf("rev 2 fetched %.3f of its size from the CAS, want <= 0.15 (the store's chunks reused)", ratio)
	}
	a, err := h.c.Get(context.Background(), "x")
	if err != nil {
		t.Fatal(err)
	}
	var files []api.File
	for _, v := range a.Versions {
		if v.Revision == a.Revision {
			files = v.Files
		}
	}
	if len(files) == 0 {
		t.Fatalf("inspect lists no files of the current version: %+v", a.Versions)
	}
	for _, f := range files {
		if want := map[string]string{"model.safetensors": api.TransportXet, "config.json": api.TransportResolve}[f.Path]; f.Transport != want {
			t.Errorf("%s: transport %q, want %q", f.Path, f.Transport, want)
		}
	}
}

// TestHFXetFanOutOrigin: a node of a static fleet takes a blob the peers
// lack from the origin through fan-out; over Xet, the commit there too
// teaches the store where the file's chunks sit, so the next revision
// fetches only what changed.
func TestHFXetFanOutOrigin(t *testing.T) {
	hub := newFanHub(t)
	cas := hub.EnableXet()
	hs, _ := fanFleet(t, 1, 1, nil)
	const tensor = 256 << 10
	v1 := xettest.Model(23, 6<<20, tensor)
	v2 := xettest.Mutate(v1, 24, 0.10, tensor)
	hub.Commit("acme/xetfan", map[string][]byte{"model.safetensors": v1}, "v1")
	hub.Commit("acme/xetfan", map[string][]byte{"model.safetensors": v2}, "v2")
	for _, rev := range []string{"v1", "v2"} {
		sent := cas.Sent.Load()
		if _, err := hs[0].pull(api.PullRequest{Name: "x", URI: "hf://acme/xetfan@" + rev}); err != nil {
			t.Fatal(err)
		}
		want := map[string][]byte{"v1": v1, "v2": v2}[rev]
		hs[0].checkModel("x", map[string][]byte{"model.safetensors": want})
		ratio := float64(cas.Sent.Load()-sent) / float64(len(want))
		t.Logf("%s: %.3f of its bytes fetched from the CAS", rev, ratio)
		if rev == "v2" && ratio > 0.15 {
			t.Errorf("rev 2 through fan-out's origin fetched %.3f of its size from the CAS, want <= 0.15", ratio)
		}
	}
}
