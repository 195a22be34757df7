package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
	"github.com/modelcache/modelcache/fetchers/ngc/ngctest"
)

const ngcKey = "ngc-daemon-test-key-8c1f5e"

// startWithNGC starts an NGC registry, an hf hub, and a daemon that
// reaches both through the endpoint overrides, logging at debug level
// into the returned buffer. The daemon's environment carries no NGC key.
func startWithNGC(t *testing.T, prep ...func(*Config, *ngctest.Server)) (*harness, *ngctest.Server, *hubtest.Hub, *syncBuffer) {
	reg := ngctest.New()
	t.Cleanup(reg.Close)
	hub := hubtest.New()
	t.Cleanup(hub.Close)
	t.Setenv("NGC_API_ENDPOINT", reg.API.URL)
	t.Setenv("NGC_AUTH_ENDPOINT", reg.Auth.URL)
	t.Setenv("NGC_API_KEY", "")
	t.Setenv("NGC_CLI_API_KEY", "")
	t.Setenv("NGC_API_KEY_FILE", "")
	t.Setenv("HF_ENDPOINT", hub.URL())
	t.Setenv("HF_TOKEN", "")
	t.Setenv("HF_HOME", t.TempDir())
	logs := &syncBuffer{}
	cfg := testConfig(t)
	cfg.Logger = slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	for _, p := range prep {
		p(&cfg, reg)
	}
	return start(t, cfg), reg, hub, logs
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// TestNGCPullPinnedAndDedupWithHF: ngc://org/team/model:version pulls
// end to end (paginated listing, downloads redirected to storage without
// the token); the same safetensors from the hf hub is one blob, fetched
// once when NGC publishes its sha256 and hashed to the same blob when it
// publishes only the size; a version-less URI pins the latest version.
func TestNGCPullPinnedAndDedupWithHF(t *testing.T) {
	h, reg, hub, _ := startWithNGC(t)
	shared := safetensors(64<<10, 7)
	hub.Commit("acme/llama-tiny", map[string][]byte{"model.safetensors": shared, "config.json": []byte(`{"model_type":"llama"}`)}, "main")
	ngcFiles := map[string][]byte{"model.safetensors": shared, "config.json": []byte(`{"model_type":"llama"}`), "tok/tokenizer.json": []byte(`{}`)}
	reg.AddVersion("nvidia/nemo/llama-tiny", "1.0", ngcFiles, true, true)
	reg.AddVersion("nvidia/llama-nosha", "2.0", map[string][]byte{"model.safetensors": shared}, true, false)

	if _, err := h.pull(api.PullRequest{Name: "from-hf", URI: "hf://acme/llama-tiny"}); err != nil {
		t.Fatal(err)
	}
	a, err := h.pull(api.PullRequest{Name: "from-ngc", URI: "ngc://nvidia/nemo/llama-tiny:1.0"})
	if err != nil {
		t.Fatal(err)
	}
	if a.Revision != "1.0" {
		t.Fatalf("revision %q, want the NGC version 1.0", a.Revision)
	}
	for p, b := range ngcFiles {
		if h.read("from-ngc", p) != string(b) {
			t.Fatalf("%s differs", p)
		}
	}
	if got, want := reg.Sent.Load(), int64(len(ngcFiles["tok/tokenizer.json"])); got != want {
		t.Fatalf("storage sent %d bytes; want only the file hf:// lacks (%d): the shard and config.json are blobs already", got, want)
	}
	root := h.cfg.Root
	want := inode(t, filepath.Join(root, "models", "from-hf", "current", "model.safetensors"))
	if inode(t, filepath.Join(root, "models", "from-ngc", "current", "model.safetensors")) != want {
		t.Fatal("the same bytes from hf:// and ngc:// are two blobs")
	}
	if reg.StorageSawAuth.Load() {
		t.Fatal("a token reached the storage origin")
	}

	// Size only: fetched, hashed, and the same blob again; the version-less
	// URI resolves to the latest version once.
	a, err = h.pull(api.PullRequest{Name: "nosha", URI: "ngc://nvidia/llama-nosha"})
	if err != nil || a.Revision != "2.0" {
		t.Fatalf("latest: %+v %v", a, err)
	}
	if inode(t, filepath.Join(root, "models", "nosha", "current", "model.safetensors")) != want {
		t.Fatal("a size-only NGC file did not land on the existing blob")
	}
	// inspect says, per file, which were checked by size only.
	for name, streamed := range map[string]bool{"nosha": true, "from-ngc": false} {
		full, err := h.c.Get(context.Background(), name)
		if err != nil || len(full.Versions) == 0 || len(full.Versions[0].Files) == 0 {
			t.Fatalf("%s: %+v %v", name, full, err)
		}
		for _, fl := range full.Versions[0].Files {
			if fl.Streamed != streamed {
				t.Fatalf("%s: file %s streamed=%v; want %v (NGC listed %s)", name, fl.Path, fl.Streamed, streamed, map[bool]string{true: "its size only", false: "its sha256"}[streamed])
			}
		}
	}
	reg.AddVersion("nvidia/llama-nosha", "3.0", map[string][]byte{"model.safetensors": safetensors(64<<10, 8)}, true, false)
	if full, err := h.c.Get(context.Background(), "nosha"); err != nil || full.Revision != "2.0" {
		t.Fatalf("a new latest version moved a pinned artifact: %+v %v", full, err)
	}
}

// TestNGCResumeAndWrongDigest: a body cut mid-file resumes with Range;
// a file whose bytes do not match the listed sha256, or the listed size,
// is refused with nothing under models/.
func TestNGCResumeAndWrongDigest(t *testing.T) {
	h, reg, _, _ := startWithNGC(t)
	big := data(3<<20+123, 9)
	reg.AddVersion("org/cut", "1", map[string][]byte{"w.bin": big}, true, true)
	var cut sync.Once
	reg.Hook = func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasPrefix(r.URL.Path, "/blob/") || r.Header.Get("Range") != "" {
			return false
		}
		done := false
		cut.Do(func() {
			done = true
			w.Header().Set("Content-Length", itoa(len(big)))
			w.WriteHeader(http.StatusOK)
			w.Write(big[:1<<20])
			w.(http.Flusher).Flush()
			reg.ExpireURLs() // the presigned URL expires during the pull
			conn, _, _ := http.NewResponseController(w).Hijack()
			conn.Close()
		})
		return done
	}
	if _, err := h.pull(api.PullRequest{Name: "cut", URI: "ngc://org/cut:1"}); err != nil {
		t.Fatal(err)
	}
	if h.read("cut", "w.bin") != string(big) {
		t.Fatal("resumed file differs")
	}
	if reg.RangeGets.Load() == 0 {
		t.Fatal("the cut file was not resumed with a Range request")
	}
	if reg.ExpiredGets.Load() == 0 || reg.ManifestRequests.Load() < 2 {
		t.Fatalf("%d requests on the expired URL, %d manifest answers: want the resume to meet the expired URL and ask the URL manifest again", reg.ExpiredGets.Load(), reg.ManifestRequests.Load())
	}
	reg.Hook = nil

	for _, c := range []struct {
		name, want string
		edit       func(b []byte) []byte
	}{
		{"wrong-digest", "digest mismatch", func(b []byte) []byte { b[1000] ^= 1; return b }},
		{"wrong-size", "size", func(b []byte) []byte { return b[:len(b)-10] }},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := "org/" + c.name
			b := data(2<<20, byte(len(c.name)))
			reg.AddVersion(path, "1", map[string][]byte{"w.bin": b}, true, c.name == "wrong-digest")
			reg.SetFile(path, "1", "w.bin", c.edit(append([]byte(nil), b...)))
			_, err := h.pull(api.PullRequest{Name: c.name, URI: "ngc://" + path + ":1", Keep: true})
			if !errors.Is(err, api.ErrFailed) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v; want Failed with %q", err, c.want)
			}
			if _, err := lstatTree(h.cfg.Root, c.name); err == nil {
				t.Fatal("a refused file became visible")
			}
			if c.name != "wrong-digest" {
				return
			}
			// Right size, wrong bytes, against the listing's sha256_base64:
			// failed for good, both digests named, not retried.
			a, _ := h.c.Get(context.Background(), c.name)
			if a.Phase != api.PhaseFailed || a.Reason != api.ReasonDigestMismatch || a.NextRetry != nil || a.Attempts != 1 {
				t.Fatalf("artifact %+v: want Failed (DigestMismatch) after one attempt, no next retry", a)
			}
			if !strings.Contains(a.Message, ngctest.Sum(b)) || !strings.Contains(a.Message, ngctest.Sum(c.edit(append([]byte(nil), b...)))) {
				t.Fatalf("message %q: want the listed and the streamed digest named", a.Message)
			}
		})
	}
}

// TestNGCLegacyV1AndRefusedManifest: a legacy V1 version (no sizes, no
// checksums in its listing) pulls, each file marked as checked by nothing
// published; where NGC refuses the URL manifest the deprecated per-file
// path serves the files and the daemon's log says so.
func TestNGCLegacyV1AndRefusedManifest(t *testing.T) {
	h, reg, _, logs := startWithNGC(t)
	files := map[string][]byte{"model.safetensors": safetensors(16<<10, 5), "config.json": []byte(`{"model_type":"llama"}`), "tok/t.json": []byte(`{}`)}
	reg.AddVersion("nvidia/legacy", "0.9", files, true, false)
	reg.SetLegacy("nvidia/legacy", "0.9")
	if _, err := h.pull(api.PullRequest{Name: "legacy", URI: "ngc://nvidia/legacy:0.9"}); err != nil {
		t.Fatal(err)
	}
	for p, b := range files {
		if h.read("legacy", p) != string(b) {
			t.Fatalf("%s differs", p)
		}
	}
	full, err := h.c.Get(context.Background(), "legacy")
	if err != nil || len(full.Versions) == 0 || len(full.Versions[0].Files) != 3 || !full.Versions[0].Files[0].Streamed {
		t.Fatalf("%+v %v; want 3 files, checked by size only", full, err)
	}

	reg.RefuseManifest = true
	reg.AddVersion("nvidia/old-api", "1", map[string][]byte{"tok/t.json": []byte(`{"v":1}`)}, true, true) // not in the store yet
	if _, err := h.pull(api.PullRequest{Name: "old-api", URI: "ngc://nvidia/old-api:1"}); err != nil {
		t.Fatal(err)
	}
	if h.read("old-api", "tok/t.json") != `{"v":1}` || reg.PerFileRequests.Load() == 0 {
		t.Fatalf("%d per-file downloads; want the files through the deprecated path", reg.PerFileRequests.Load())
	}
	if !strings.Contains(logs.String(), "refused the URL manifest") || !strings.Contains(logs.String(), "only its size is checked") {
		t.Fatal("the log says neither that the manifest was refused nor which files are checked by size only")
	}
}

// TestNGCShortListingNotRetried: a listing that holds fewer files than the
// version counts fails for good (SourceInconsistent), with no retry.
func TestNGCShortListingNotRetried(t *testing.T) {
	h, reg, _, _ := startWithNGC(t)
	reg.AddVersion("org/short", "1", map[string][]byte{"a": []byte("a"), "b": []byte("b"), "c": []byte("c")}, true, true)
	reg.Hook = func(w http.ResponseWriter, r *http.Request) bool { // page 1 (of 2) comes back empty
		if strings.HasSuffix(r.URL.Path, "/versions/1/files") && r.URL.Query().Get("page-number") == "1" {
			w.Write([]byte(`{"modelFiles":[],"paginationInfo":{"index":1,"size":0,"totalPages":2,"totalResults":3}}`))
			return true
		}
		return false
	}
	_, err := h.pull(api.PullRequest{Name: "short", URI: "ngc://org/short:1", Keep: true})
	if !errors.Is(err, api.ErrFailed) || !strings.Contains(err.Error(), "the file listing holds 2 files but the version says 3") {
		t.Fatalf("%v; want Failed naming both counts", err)
	}
	a, _ := h.c.Get(context.Background(), "short")
	if a.Reason != api.ReasonSourceInconsistent || a.NextRetry != nil || a.Attempts != 1 {
		t.Fatalf("artifact %+v: want Failed (SourceInconsistent) after one attempt, no next retry", a)
	}
}

// TestNGCPrivateModelKeyNeverShown: a private model fails without a key
// (the error says how to give one) and pulls with NGC_API_KEY from a
// models.d credentialsFile; the key is in no log line, status, list,
// metric or the index.
func TestNGCPrivateModelKeyNeverShown(t *testing.T) {
	creds := filepath.Join(t.TempDir(), "ngc.env")
	os.WriteFile(creds, []byte("NGC_API_KEY="+ngcKey+"\n"), 0o600)
	files := map[string][]byte{"model.safetensors": safetensors(32<<10, 3), "config.json": []byte(`{}`)}
	h, reg, _, logs := startWithNGC(t, func(cfg *Config, reg *ngctest.Server) {
		reg.AddVersion("acme/research/secret", "4", files, false, true)
		reg.Keys[ngcKey] = []string{"group/ngc:acme", "group/ngc:acme/research"}
		os.MkdirAll(cfg.ModelsDir, 0o755)
		os.WriteFile(filepath.Join(cfg.ModelsDir, "secret.yaml"), []byte("name: secret\nuri: ngc://acme/research/secret:4\ncredentialsFile: "+creds+"\n"), 0o644)
	})

	_, err := h.pull(api.PullRequest{Name: "nokey", URI: "ngc://acme/research/secret:4"})
	if !errors.Is(err, api.ErrFailed) || !strings.Contains(err.Error(), "no NGC API key is set") || !strings.Contains(err.Error(), `NGC_API_KEY`) || !strings.Contains(err.Error(), `org "acme"`) {
		t.Fatalf("without a key: %v; want the error to name NGC_API_KEY and the model's org", err)
	}
	h.waitPhase("secret", api.PhaseReady)
	for p, b := range files {
		if h.read("secret", p) != string(b) {
			t.Fatalf("%s differs", p)
		}
	}
	if reg.StorageSawAuth.Load() {
		t.Fatal("a token reached the storage origin")
	}

	// Everything the daemon shows or keeps.
	var seen []string
	st, _ := h.c.Status(context.Background())
	list, _ := h.c.List(context.Background())
	for _, v := range []any{st, list} {
		b, _ := json.Marshal(v)
		seen = append(seen, string(b))
	}
	if resp, err := http.Get("http://" + h.d.MetricsAddr() + "/metrics"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		seen = append(seen, string(b))
	}
	h.stop() // the index is read after bbolt let go of it
	idx, err := os.ReadFile(filepath.Join(h.cfg.Root, "index.db"))
	if err != nil {
		t.Fatal(err)
	}
	seen = append(seen, string(idx), logs.String(), err2s(err))
	for i, s := range seen {
		if strings.Contains(s, ngcKey) || strings.Contains(s, "ngctest-token-") {
			t.Fatalf("output %d holds the NGC key or a token", i)
		}
	}
	if !strings.Contains(logs.String(), "secret") {
		t.Fatal("the log is empty; the check above saw nothing")
	}
}

func err2s(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
