package daemon

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
)

func hubModel(shards int, seed byte) map[string][]byte {
	files := map[string][]byte{
		"config.json":              []byte(`{"architectures":["LlamaForCausalLM"],"model_type":"llama","torch_dtype":"bfloat16","max_position_embeddings":4096}`),
		"tokenizer/tokenizer.json": []byte(`{"version":"1.0"}`),
	}
	for i := 0; i < shards; i++ {
		files["model-0000"+string(rune('1'+i))+".safetensors"] = safetensors(64<<10+i, seed+byte(i))
	}
	return files
}

// safetensors builds a valid file: one BF16 tensor of n/2 elements.
func safetensors(n int, seed byte) []byte {
	elems := n / 2
	hdr := []byte(`{"w":{"dtype":"BF16","shape":[` + itoa(elems) + `],"data_offsets":[0,` + itoa(elems*2) + `]},"__metadata__":{"format":"pt"}}`)
	out := make([]byte, 8, 8+len(hdr)+elems*2)
	for i := 0; i < 8; i++ {
		out[i] = byte(uint64(len(hdr)) >> (8 * i))
	}
	out = append(out, hdr...)
	return append(out, data(elems*2, seed)...)
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	s := ""
	for ; n > 0; n /= 10 {
		s = string(rune('0'+n%10)) + s
	}
	return s
}

func startWithHub(t *testing.T) (*harness, *hubtest.Hub) {
	hub := hubtest.New()
	t.Cleanup(hub.Close)
	t.Setenv("HF_ENDPOINT", hub.URL())
	t.Setenv("HF_TOKEN", "")
	t.Setenv("HF_HOME", t.TempDir())
	return start(t, testConfig(t)), hub
}

func TestHFPullViewAndMetadata(t *testing.T) {
	h, hub := startWithHub(t)
	files := hubModel(2, 1)
	sha := hub.Commit("acme/llama-tiny", files, "main", "v1.0")
	a, err := h.pull(api.PullRequest{Name: "llama", URI: "hf://acme/llama-tiny@v1.0"})
	if err != nil {
		t.Fatal(err)
	}
	if a.Revision != sha {
		t.Fatalf("revision %s, want the commit %s that v1.0 names", a.Revision, sha)
	}
	for p, b := range files {
		if h.read("llama", p) != string(b) {
			t.Fatalf("%s differs", p)
		}
	}
	// The HF cache view: refs, snapshot symlinks into ../../blobs, blobs by etag.
	base := filepath.Join(h.cfg.Root, "hf", "models--acme--llama-tiny")
	if ref, _ := os.ReadFile(filepath.Join(base, "refs", "v1.0")); string(ref) != sha {
		t.Fatalf("refs/v1.0 = %q, want %s (no newline)", ref, sha)
	}
	link, err := os.Readlink(filepath.Join(base, "snapshots", sha, "tokenizer", "tokenizer.json"))
	if err != nil || link != "../../../blobs/"+hubtest.GitOID(files["tokenizer/tokenizer.json"]) {
		t.Fatalf("nested snapshot link %q %v", link, err)
	}
	for p, b := range files {
		got, err := os.ReadFile(filepath.Join(base, "snapshots", sha, p))
		if err != nil || string(got) != string(b) {
			t.Fatalf("view %s: %v", p, err)
		}
	}
	if hub.CDNSawAuth.Load() {
		t.Fatal("a token crossed to the CDN origin")
	}
	// Metadata from config.json and the safetensors headers.
	full, _ := h.c.Get(context.Background(), "llama")
	v, _ := h.d.store.Get("llama")
	md := v.Versions[0].Metadata
	if md == nil || md.ModelType != "llama" || md.MaxPositionEmbeddings != 4096 || md.SafetensorsFiles != 2 || md.Parameters != int64((64<<10)/2+(64<<10+1)/2) || md.ParametersByDtype["BF16"] != md.Parameters {
		t.Fatalf("metadata %+v", md)
	}
	if full.Metadata == nil || full.Metadata.Parameters != md.Parameters {
		t.Fatalf("the API does not show the metadata: %+v", full.Metadata)
	}

	// A new revision that changes one shard fetches that shard only.
	files2 := map[string][]byte{}
	for p, b := range files {
		files2[p] = b
	}
	files2["model-00002.safetensors"] = safetensors(64<<10+1, 99)
	sha2 := hub.Commit("acme/llama-tiny", files2, "main")
	before := hub.Sent.Load()
	a, err = h.pull(api.PullRequest{Name: "llama", URI: "hf://acme/llama-tiny"})
	if err != nil || a.Revision != sha2 {
		t.Fatalf("update: %+v %v", a, err)
	}
	var small int64
	for p, b := range files2 {
		if !strings.HasSuffix(p, ".safetensors") {
			small += int64(len(b)) // non-LFS files have no sha256 to skip by
		}
	}
	if got, want := hub.Sent.Load()-before, int64(len(files2["model-00002.safetensors"]))+small; got != want {
		t.Fatalf("update fetched %d bytes, want the changed shard and the small files: %d", got, want)
	}
	// Evicting the artifact takes its snapshots, blobs and refs out of the view.
	if _, err := h.c.Evict(context.Background(), "llama", "", true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(base); !os.IsNotExist(err) {
		t.Fatalf("view left after evict: %v", err)
	}
}

func TestHFHostileHub(t *testing.T) {
	h, hub := startWithHub(t)
	files := hubModel(1, 2)
	cases := []struct {
		name, want string
		edit       func(repo, sha string)
	}{
		{"dotdot path", "escapes", func(repo, sha string) {
			hub.EditTree(repo, sha, func(es []hubtest.Entry) []hubtest.Entry {
				return append(es, hubtest.Entry{Type: "file", OID: hubtest.GitOID([]byte("x")), Size: 1, Path: "../../etc/evil"})
			})
		}},
		{"absolute path", "absolute", func(repo, sha string) {
			hub.EditTree(repo, sha, func(es []hubtest.Entry) []hubtest.Entry {
				return append(es, hubtest.Entry{Type: "file", OID: hubtest.GitOID([]byte("x")), Size: 1, Path: "/etc/evil"})
			})
		}},
		{"wrong sha256", "digest mismatch", func(repo, sha string) {
			b := append([]byte(nil), files["model-00001.safetensors"]...)
			b[100] ^= 1
			hub.SetFile(repo, sha, "model-00001.safetensors", b)
		}},
		{"wrong git sha1", "git blob sha1", func(repo, sha string) {
			b := append([]byte(nil), files["config.json"]...)
			b[len(b)-2] = '7' // same size, other bytes
			hub.SetFile(repo, sha, "config.json", b)
		}},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			repo := "acme/hostile-" + itoa(i)
			fs := map[string][]byte{}
			for p, b := range files {
				fs[p] = append([]byte(nil), b...)
			}
			sha := hub.Commit(repo, fs, "main")
			c.edit(repo, sha)
			name := "hostile-" + itoa(i)
			_, err := h.pull(api.PullRequest{Name: name, URI: "hf://" + repo})
			if !errors.Is(err, api.ErrFailed) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v; want Failed containing %q", err, c.want)
			}
			for _, p := range []string{filepath.Join(h.cfg.Root, "models", name), filepath.Join(h.cfg.Root, "private", "models", name), filepath.Join(h.cfg.Root, "hf", "models--acme--hostile-"+itoa(i)), filepath.Join(filepath.Dir(h.cfg.Root), "etc")} {
				if _, err := os.Lstat(p); err == nil {
					t.Fatalf("%s exists after a refused pull", p)
				}
			}
		})
	}
}

func TestHFErrorsSayWhatToDo(t *testing.T) {
	h, hub := startWithHub(t)
	hub.Commit("acme/there", hubModel(1, 3), "main")
	for _, c := range []struct{ uri, want string }{
		{"hf://acme/missing", "repository not found"},
		{"hf://acme/there@nope", "revision not found"},
		{"hf://bad//repo", "write hf://<org>/<repo>"},
	} {
		_, err := h.pull(api.PullRequest{Name: "e", URI: c.uri})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.uri, err, c.want)
		}
		h.c.Evict(context.Background(), "e", "", true)
	}
	hub.Token = "secret"
	_, err := h.pull(api.PullRequest{Name: "gated", URI: "hf://acme/there"})
	if err == nil || !strings.Contains(err.Error(), "gated or private") || !strings.Contains(err.Error(), "HF_TOKEN") {
		t.Fatalf("gated repo without a token: %v", err)
	}
}

func TestHFRetriesAStormOf429(t *testing.T) {
	h, hub := startWithHub(t)
	hub.Commit("acme/busy", hubModel(1, 4), "main")
	var n atomic.Int64
	hub.Hook = func(w http.ResponseWriter, r *http.Request) bool {
		if n.Add(1) <= 4 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
			return true
		}
		return false
	}
	if _, err := h.pull(api.PullRequest{Name: "busy", URI: "hf://acme/busy"}); err != nil {
		t.Fatalf("after a 429 storm: %v", err)
	}
	if n.Load() <= 4 {
		t.Fatal("the storm was not exercised")
	}
}

func TestHFTokenStaysOnTheHub(t *testing.T) {
	hub := hubtest.New()
	t.Cleanup(hub.Close)
	hub.Token = "secret"
	t.Setenv("HF_ENDPOINT", hub.URL())
	t.Setenv("HF_TOKEN", "secret")
	h := start(t, testConfig(t))
	hub.Commit("acme/private", hubModel(2, 5), "main")
	if _, err := h.pull(api.PullRequest{Name: "p", URI: "hf://acme/private"}); err != nil {
		t.Fatal(err)
	}
	if hub.CDNSawAuth.Load() {
		t.Fatal("the token was sent to the CDN on a cross-origin redirect")
	}
}

func TestHFTruncationResumesAndEntryNotFound(t *testing.T) {
	h, hub := startWithHub(t)
	files := hubModel(1, 8)
	hub.Commit("acme/cut", files, "main")
	var cut atomic.Bool
	hub.Hook = func(w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodGet || !strings.HasPrefix(r.URL.Path, "/lfs/") || r.Header.Get("Range") != "" || cut.Swap(true) {
			return false
		}
		b := files["model-00001.safetensors"]
		w.Header().Set("Content-Length", itoa(len(b)))
		w.WriteHeader(http.StatusOK)
		w.Write(b[:len(b)/2])
		w.(http.Flusher).Flush()
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
		return true
	}
	if _, err := h.pull(api.PullRequest{Name: "cut", URI: "hf://acme/cut"}); err != nil {
		t.Fatalf("pull after a truncated LFS body: %v", err)
	}
	if h.read("cut", "model-00001.safetensors") != string(files["model-00001.safetensors"]) {
		t.Fatal("content differs after the resume")
	}

	hub.Commit("acme/gone", hubModel(1, 9), "main")
	hub.Hook = func(w http.ResponseWriter, r *http.Request) bool {
		if strings.HasSuffix(r.URL.Path, "/config.json") && strings.Contains(r.URL.Path, "/resolve/") {
			w.Header().Set("X-Error-Code", "EntryNotFound")
			w.WriteHeader(http.StatusNotFound)
			return true
		}
		return false
	}
	_, err := h.pull(api.PullRequest{Name: "gone", URI: "hf://acme/gone"})
	if err == nil || !strings.Contains(err.Error(), "config.json not in this revision") {
		t.Fatalf("EntryNotFound: %v", err)
	}
}
