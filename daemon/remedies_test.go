package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/api"
)

// TestRequestRefusalsAndFailuresSayItOnce: a malformed #sha256= is refused
// with the request (invalid argument, no desire kept) and an uppercase
// one is taken; globs that match nothing fail for good at once, not
// retried for ever; a failure names its source once; evict --revision
// takes the prefix inspect shows.
func TestRequestRefusalsAndFailuresSayItOnce(t *testing.T) {
	w := data(64<<10, 80)
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	h := start(t, testConfig(t))
	ctx := context.Background()

	if _, err := h.pull(api.PullRequest{Name: "short", URI: srv.URL + "/w.bin#sha256=1234"}); !errors.Is(err, api.ErrInvalid) || !strings.Contains(err.Error(), "#sha256=<64 hex>") {
		t.Fatalf("#sha256=1234: %v; want an invalid argument naming the form", err)
	}
	if _, err := h.c.Get(ctx, "short"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("a refused request kept a desire: %v", err)
	}
	if a, err := h.pull(api.PullRequest{Name: "upper", URI: srv.URL + "/w.bin#SHA256=" + strings.ToUpper(sha(w))}); err != nil || a.Phase != api.PhaseReady {
		t.Fatalf("#SHA256=<HEX>: %+v %v", a, err)
	}

	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "model.safetensors"), w, 0o644)
	_, err := h.pull(api.PullRequest{Name: "globs", URI: "file://" + src, Include: []string{"*.gguf"}, Keep: true})
	if !errors.Is(err, api.ErrFailed) || !strings.Contains(err.Error(), "leave none of the source's 1 files") || !strings.Contains(err.Error(), "model.safetensors") {
		t.Fatalf("--include matching nothing: %v", err)
	}
	if a, _ := h.c.Get(ctx, "globs"); a.Reason != api.ReasonSourceNotFound || a.NextRetry != nil {
		t.Fatalf("--include matching nothing: reason %q, next retry %v; want SourceNotFound, not retried", a.Reason, a.NextRetry)
	}

	missing := "file://" + filepath.Join(src, "nope")
	_, err = h.pull(api.PullRequest{Name: "missing", URI: missing})
	if err == nil || strings.Count(err.Error(), missing) != 1 {
		t.Fatalf("a missing source: %v; want its URI named once", err)
	}

	a, err := h.c.Get(ctx, "upper")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.Evict(ctx, "upper", "zzz", false); !errors.Is(err, api.ErrNotFound) || !strings.Contains(err.Error(), a.Revision) {
		t.Fatalf("evict --revision zzz: %v; want not found, listing %s", err, a.Revision)
	}
	res, err := h.c.Evict(ctx, "upper", a.Revision[:12], false)
	if err != nil || len(res.Revisions) != 1 || res.Revisions[0] != a.Revision {
		t.Fatalf("evict --revision %s (the prefix inspect shows): %+v %v", a.Revision[:12], res, err)
	}
}
