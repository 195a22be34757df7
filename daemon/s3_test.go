package daemon

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers/s3/s3test"
)

// TestS3PullAndCrossSourceDedup pulls a model from a real S3-compatible
// server; the same weights pulled over HTTP afterwards are stored once.
func TestS3PullAndCrossSourceDedup(t *testing.T) {
	srv := s3test.Start(t)
	srv.Bucket(t, "weights")
	w := data(3<<20, 70)
	srv.Put(t, "weights", "llama/w.safetensors", w, true)
	srv.Put(t, "weights", "llama/config.json", []byte(`{"model_type":"llama"}`), false)
	h := start(t, testConfig(t))
	a, err := h.pull(api.PullRequest{Name: "s3m", URI: "s3://weights/llama"})
	if err != nil || a.Phase != api.PhaseReady || !strings.HasPrefix(a.Revision, "s3-") {
		t.Fatalf("s3 pull: %+v %v", a, err)
	}
	if h.read("s3m", "w.safetensors") != string(w) || h.read("s3m", "config.json") != `{"model_type":"llama"}` {
		t.Fatal("s3 content differs")
	}
	// The daemon signs with the server's keys (its environment): what it
	// fetches so is private unless pulled --public (tenancy.go).
	if m := treeMode(t, h, "s3m"); m != 0o700 {
		t.Errorf("an s3 pull signed with the daemon's keys: tree %o, want 0700", m)
	}
	hs := newFileServer(t, map[string][]byte{"w.safetensors": w})
	sent := hs.sent.Load()
	if _, err := h.pull(api.PullRequest{Name: "httpm", URI: hs.URL + "/w.safetensors#sha256=" + sha(w)}); err != nil {
		t.Fatal(err)
	}
	if hs.sent.Load() != sent {
		t.Fatal("the same weights were fetched again over HTTP")
	}
	u, _ := h.c.Usage(context.Background())
	if u.Blobs != 2 {
		t.Fatalf("usage %+v: want the shared weights once plus config.json", u)
	}
	_, err = h.pull(api.PullRequest{Name: "nob", URI: "s3://nosuchbucket/x"})
	if !errors.Is(err, api.ErrFailed) || !strings.Contains(err.Error(), "no such bucket") {
		t.Fatalf("missing bucket: %v", err)
	}
}
