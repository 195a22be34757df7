package daemon

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/cachestore/storetest"
	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
	"github.com/modelcache/modelcache/internal/testenv"
)

type harness struct {
	t      testing.TB
	d      *Daemon
	c      *api.Client
	cfg    Config
	cancel context.CancelFunc
	done   chan error
}

func testConfig(t testing.TB) Config {
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.Root = filepath.Join(dir, "root")
	cfg.Socket = filepath.Join(dir, "s.sock")
	cfg.MetricsAddr = "127.0.0.1:0"
	cfg.ModelsDir = filepath.Join(dir, "models.d")
	cfg.SocketGroup = ""
	cfg.RetryInitial = 50 * time.Millisecond
	cfg.RetryMax = 200 * time.Millisecond
	cfg.IdleTimeout = 2 * time.Second
	return cfg
}

func start(t testing.TB, cfg Config) *harness {
	t.Helper()
	return startWith(t, cfg, fetchers.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond, Attempts: 6, MaxRetryAfter: 5 * time.Second})
}

func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	if err := <-h.done; err != nil {
		h.t.Errorf("Run: %v", err)
	}
	h.cancel = nil
}

func (h *harness) pull(req api.PullRequest) (*api.Artifact, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	return h.c.Pull(ctx, req, true, nil)
}

func (h *harness) waitPhase(name string, p api.Phase) *api.Artifact {
	h.t.Helper()
	return h.waitPhaseWithin(name, p, 30*time.Second)
}

// waitPhaseWithin is waitPhase for a pull that takes longer (a benchmark's).
// It looks at the artifact after each change the daemon signals, not on
// a timer.
func (h *harness) waitPhaseWithin(name string, p api.Phase, within time.Duration) *api.Artifact {
	h.t.Helper()
	var a *api.Artifact
	testenv.Await(h.t, name+" reaches "+string(p), within, h.d.Changed, func() error {
		var err error
		if a, err = h.c.Get(context.Background(), name); err != nil {
			return err
		}
		if a.Phase != p {
			return fmt.Errorf("%s: %s", a.Phase, a.Message)
		}
		return nil
	})
	return a
}

// passAndSettle makes one full pass of the reconciler now, as its timer
// or a kick would, and waits for the pulls that pass started to finish
// (the test's context cancels them at its end). A test proves that
// nothing is pulled again with it: a pass that would pull has pulled by
// the time it returns.
func (h *harness) passAndSettle(t *testing.T) {
	t.Helper()
	var started []chan struct{}
	h.d.mu.Lock()
	before := map[string]chan struct{}{}
	for name, st := range h.d.arts {
		if st.cancel != nil {
			before[name] = st.done
		}
	}
	h.d.mu.Unlock()
	h.d.reconcile(t.Context())
	h.d.mu.Lock()
	for name, st := range h.d.arts {
		if st.cancel != nil && before[name] != st.done {
			started = append(started, st.done)
		}
	}
	h.d.mu.Unlock()
	for _, done := range started {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("a pull the reconcile pass started did not finish in 30s")
		}
	}
}

func (h *harness) read(name, path string) string {
	b, err := os.ReadFile(filepath.Join(h.d.store.TreePath(cachestore.KindModel, name, "current"), path))
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(b)
}

// lstatTree is os.Lstat of name's artifact directory, public (models/)
// or private (private/models/): nil when either is there.
func lstatTree(root, name string) (os.FileInfo, error) {
	fi, err := os.Lstat(filepath.Join(root, "models", name))
	if err != nil {
		fi, err = os.Lstat(filepath.Join(root, "private", "models", name))
	}
	return fi, err
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func data(n int, seed byte) []byte { return storetest.Data(n, seed) }

// fileServer serves named blobs and counts the bytes it sends.
type fileServer struct {
	*httptest.Server
	mu    sync.Mutex
	files map[string][]byte
	sent  atomic.Int64
	gets  atomic.Int64
	hook  func(w http.ResponseWriter, r *http.Request) bool // true: handled
}

func newFileServer(t testing.TB, files map[string][]byte) *fileServer {
	fs := &fileServer{files: files}
	fs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fs.hook != nil && fs.hook(w, r) {
			return
		}
		fs.mu.Lock()
		b, ok := fs.files[strings.TrimPrefix(r.URL.Path, "/")]
		fs.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		if r.Method == http.MethodGet {
			fs.gets.Add(1)
		}
		http.ServeContent(&hubtest.CountingWriter{ResponseWriter: w, N: &fs.sent}, r, "", time.Time{}, bytes.NewReader(b))
	}))
	t.Cleanup(fs.Close)
	return fs
}

func TestPullHTTPDedupAcrossArtifacts(t *testing.T) {
	w := data(3<<20+11, 1)
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	h := start(t, testConfig(t))
	uri := srv.URL + "/w.bin#sha256=" + sha(w)
	a, err := h.pull(api.PullRequest{Name: "one", URI: uri})
	if err != nil || a.Phase != api.PhaseReady {
		t.Fatalf("pull: %+v %v", a, err)
	}
	if a.Revision != sha(w) {
		t.Fatalf("revision %s, want the pinned sha256 %s", a.Revision, sha(w))
	}
	if got := h.read("one", "w.bin"); got != string(w) {
		t.Fatal("served bytes differ")
	}
	sent := srv.sent.Load()
	a, err = h.pull(api.PullRequest{Name: "two", URI: uri})
	if err != nil || a.Phase != api.PhaseReady {
		t.Fatalf("second pull: %+v %v", a, err)
	}
	if d := srv.sent.Load() - sent; d != 0 {
		t.Fatalf("second artifact with the same file fetched %d bytes, want 0", d)
	}
	u, _ := h.c.Usage(context.Background())
	if u.Blobs != 1 || u.StoreBytes != int64(len(w)) {
		t.Fatalf("usage %+v: want one shared blob", u)
	}
}

func TestWrongBytesNothingVisible(t *testing.T) {
	good, evil := data(100000, 2), data(100000, 3)
	srv := newFileServer(t, map[string][]byte{"w.bin": evil})
	h := start(t, testConfig(t))
	_, err := h.pull(api.PullRequest{Name: "evil", URI: srv.URL + "/w.bin#sha256=" + sha(good)})
	if !errors.Is(err, api.ErrFailed) || !strings.Contains(err.Error(), "digest mismatch") {
		t.Fatalf("wrong bytes: %v, want Failed with a digest mismatch", err)
	}
	if _, err := lstatTree(h.cfg.Root, "evil"); err == nil {
		t.Fatal("a tree appeared for bytes that failed verification")
	}
	if h.d.store.HasBlob("sha256:" + sha(evil)) {
		t.Fatal("unverified bytes were kept as a blob")
	}
	// Another download of the same bytes cannot match the digest the user
	// gave: Failed for good, naming both digests, never retried. The
	// mistake leaves nothing behind, unless --keep asked to keep it.
	if !strings.Contains(err.Error(), sha(good)) || !strings.Contains(err.Error(), sha(evil)) || !strings.Contains(err.Error(), "nothing was kept") {
		t.Fatalf("error %q: want both digests named, and that nothing was kept", err)
	}
	if a, err := h.c.Get(context.Background(), "evil"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("after a first pull failed for good: %+v %v; want no entry", a, err)
	}
	gets := srv.gets.Load()
	_, err = h.pull(api.PullRequest{Name: "evil", URI: srv.URL + "/w.bin#sha256=" + sha(good), Keep: true})
	if err == nil || strings.Contains(err.Error(), "nothing was kept") {
		t.Fatalf("with --keep: %v; want the failure, the desire kept", err)
	}
	a, _ := h.c.Get(context.Background(), "evil")
	if a.Phase != api.PhaseFailed || a.Reason != api.ReasonDigestMismatch || a.NextRetry != nil || a.Attempts != 1 {
		t.Fatalf("artifact %+v: want Failed (DigestMismatch) after one attempt, no next retry", a)
	}
	if !strings.Contains(a.Message, sha(good)) || !strings.Contains(a.Message, sha(evil)) {
		t.Fatalf("message %q: want both digests named", a.Message)
	}
	if n := srv.gets.Load() - gets; n != 1 {
		t.Fatalf("%d GETs for the kept pull, want 1 (a mismatch is not retried)", n)
	}
}

func TestTruncatedStreamResumes(t *testing.T) {
	w := data(5<<20, 4)
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	var cut atomic.Bool
	var mu sync.Mutex
	var ranges []string
	srv.hook = func(rw http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodGet {
			mu.Lock()
			ranges = append(ranges, r.Header.Get("Range"))
			mu.Unlock()
		}
		if r.Method != http.MethodGet || cut.Swap(true) {
			return false
		}
		// First GET: announce everything, send 2 MiB + a bit, drop the connection.
		rw.Header().Set("Content-Length", fmt.Sprint(len(w)))
		rw.WriteHeader(200)
		rw.Write(w[:2<<20+777])
		srv.sent.Add(2<<20 + 777)
		rw.(http.Flusher).Flush()
		conn, _, _ := rw.(http.Hijacker).Hijack()
		conn.Close()
		return true
	}
	h := start(t, testConfig(t))
	a, err := h.pull(api.PullRequest{Name: "t", URI: srv.URL + "/w.bin#sha256=" + sha(w)})
	if err != nil || a.Phase != api.PhaseReady {
		t.Fatalf("pull after truncation: %+v %v", a, err)
	}
	if h.read("t", "w.bin") != string(w) {
		t.Fatal("content differs after resume")
	}
	// The resume asks for the rest from where the cut left the ingest (at
	// most one 4 KiB block back) and the server sends exactly that: a
	// fetch from byte 0 again fails here.
	const cutAt = 2<<20 + 777
	mu.Lock()
	defer mu.Unlock()
	if len(ranges) != 2 {
		t.Fatalf("GET ranges %q: want the cut request and one resume", ranges)
	}
	var from int64
	if _, err := fmt.Sscanf(ranges[1], "bytes=%d-", &from); err != nil || from <= cutAt-4096 || from > cutAt {
		t.Fatalf("resume asked Range %q: want bytes=N- with %d < N <= %d", ranges[1], cutAt-4096, cutAt)
	}
	if over := srv.sent.Load() - int64(len(w)); over != cutAt-from {
		t.Fatalf("re-fetched %d bytes; a resume from %d repeats exactly %d", over, from, cutAt-from)
	}
}

func TestTooManyRequestsHonoursRetryAfter(t *testing.T) {
	w := data(1000, 5)
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	var first time.Time
	var mu sync.Mutex
	var gaps []time.Duration
	srv.hook = func(rw http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodGet {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		if first.IsZero() {
			first = time.Now()
			rw.Header().Set("Retry-After", "1")
			rw.WriteHeader(http.StatusTooManyRequests)
			return true
		}
		gaps = append(gaps, time.Since(first))
		return false
	}
	h := start(t, testConfig(t))
	if _, err := h.pull(api.PullRequest{Name: "r", URI: srv.URL + "/w.bin#sha256=" + sha(w)}); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	// The daemon's own backoff here is 10-50ms: a gap of a second can only come from Retry-After.
	if len(gaps) == 0 || gaps[0] < 900*time.Millisecond {
		t.Fatalf("retry after %v; the server asked for 1s", gaps)
	}
}

func TestFolderChecksum(t *testing.T) {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "config.json"), []byte(`{"x":1}`), 0o644)
	os.WriteFile(filepath.Join(src, "w.bin"), data(5000, 6), 0o644)
	h := start(t, testConfig(t))
	wrong := "sha256:" + strings.Repeat("0", 64)
	_, err := h.pull(api.PullRequest{Name: "m", URI: "file://" + src, Digest: wrong})
	if !errors.Is(err, api.ErrFailed) || !strings.Contains(err.Error(), "expected "+wrong) {
		t.Fatalf("wrong folder checksum: %v", err)
	}
	if _, err := lstatTree(h.cfg.Root, "m"); err == nil {
		t.Fatal("a tree became visible despite a folder checksum mismatch")
	}
	m := cachestore.Manifest{
		{Path: "config.json", Digest: "sha256:" + sha([]byte(`{"x":1}`)), Size: 7},
		{Path: "w.bin", Digest: "sha256:" + sha(data(5000, 6)), Size: 5000},
	}
	m.Validate()
	a, err := h.pull(api.PullRequest{Name: "m", URI: "file://" + src, Digest: m.Digest()})
	if err != nil || a.ManifestDigest != m.Digest() {
		t.Fatalf("right folder checksum: %+v %v", a, err)
	}
}

func TestNewRevisionFetchedWhileOldServed(t *testing.T) {
	v1, v2 := data(4000, 7), data(6000, 8)
	gate := make(chan struct{})
	srv := newFileServer(t, map[string][]byte{"v1/w.bin": v1, "v2/w.bin": v2})
	srv.hook = func(rw http.ResponseWriter, r *http.Request) bool {
		if strings.HasPrefix(r.URL.Path, "/v2/") && r.Method == http.MethodGet {
			<-gate
		}
		return false
	}
	h := start(t, testConfig(t))
	if _, err := h.pull(api.PullRequest{Name: "m", URI: srv.URL + "/v1/w.bin#sha256=" + sha(v1)}); err != nil {
		t.Fatal(err)
	}
	// Another path under the same name: a replacement says so (issue 21).
	if _, err := h.c.Pull(context.Background(), api.PullRequest{Name: "m", URI: srv.URL + "/v2/w.bin#sha256=" + sha(v2), Replace: true}, false, nil); err != nil {
		t.Fatal(err)
	}
	h.waitPhase("m", api.PhaseDownloading)
	if got := h.read("m", "w.bin"); got != string(v1) {
		t.Fatalf("while v2 downloads, current must still serve v1: %q", got[:min(len(got), 40)])
	}
	close(gate)
	a, err := h.c.Wait(context.Background(), "m", 30*time.Second, nil)
	if err != nil || a.Revision != sha(v2) || len(a.Versions) != 2 {
		t.Fatalf("after v2: %+v %v", a, err)
	}
	if got := h.read("m", "w.bin"); got != string(v2) {
		t.Fatal("current did not swap to v2")
	}
}

func TestModelsDirDesires(t *testing.T) {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "w.bin"), []byte("file-declared"), 0o644)
	traversable(t, src) // models.d reads as --file-identity, nobody by default
	cfg := testConfig(t)
	os.MkdirAll(cfg.ModelsDir, 0o755)
	h := start(t, cfg)
	yml := filepath.Join(cfg.ModelsDir, "m.yaml")
	os.WriteFile(yml, []byte("name: fromfile\nuri: file://"+src+"\npin: true\n"), 0o644)
	a := h.waitPhase("fromfile", api.PhaseReady)
	if !a.Pinned || a.Desire == nil || a.Desire.Origin != "file:"+yml {
		t.Fatalf("file desire: %+v", a)
	}
	if _, err := h.c.Pull(context.Background(), api.PullRequest{Name: "fromfile", URI: "file:///elsewhere"}, false, nil); !errors.Is(err, api.ErrConflict) {
		t.Fatalf("pull over a file desire: %v, want conflict", err)
	}
	if _, err := h.c.Evict(context.Background(), "fromfile", "", true); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), yml) {
		t.Fatalf("evict of a file desire: %v, want a conflict naming the file", err)
	}
	os.WriteFile(filepath.Join(cfg.ModelsDir, "bad.yaml"), []byte("name: Bad Name\nuri: nope\n"), 0o644)
	os.WriteFile(yml, []byte("name: fromfile\nuri: file://"+src+"\nstate: absent\n"), 0o644)
	testenv.Eventually(t, "the absent desire evicts the artifact", 10*time.Second, func() error {
		// Unpinned by the new file content? No: pins live on the version; absent must still evict it.
		h.c.Unpin(context.Background(), "fromfile")
		if _, err := lstatTree(cfg.Root, "fromfile"); err == nil {
			return errors.New("its tree is still there")
		}
		return nil
	})
	s, _ := h.c.Status(context.Background())
	if len(s.ModelsDirError) != 1 || !strings.Contains(s.ModelsDirError[0], "bad.yaml") {
		t.Fatalf("status should name the bad file: %q", s.ModelsDirError)
	}
}

func TestVerifyRepairsAndReportsUnreachable(t *testing.T) {
	w := data(200000, 9)
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	h := start(t, testConfig(t))
	if _, err := h.pull(api.PullRequest{Name: "m", URI: srv.URL + "/w.bin#sha256=" + sha(w)}); err != nil {
		t.Fatal(err)
	}
	flip := func() {
		p, _ := h.d.store.BlobPath("sha256:" + sha(w))
		os.Chmod(p, 0o644)
		f, _ := os.OpenFile(p, os.O_WRONLY, 0)
		f.WriteAt([]byte{w[1234] ^ 1}, 1234)
		f.Close()
	}
	flip()
	r, err := h.c.Verify(context.Background())
	if err != nil || len(r.Corrupt) != 1 || len(r.Refetching) != 1 {
		t.Fatalf("verify: %+v %v", r, err)
	}
	h.waitPhase("m", api.PhaseReady)
	if h.read("m", "w.bin") != string(w) {
		t.Fatal("repaired content differs")
	}
	// Source gone: the version is marked Failed with the reason.
	srv.Close()
	flip()
	if _, err := h.c.Verify(context.Background(), "m"); err != nil {
		t.Fatal(err)
	}
	a := h.waitPhase("m", api.PhaseFailed)
	if !strings.Contains(a.Message, "connect") && !strings.Contains(a.Message, "refused") {
		t.Fatalf("failed artifact should say why: %q", a.Message)
	}
	got, _ := h.d.store.Get("m")
	if got.Versions[0].State != cachestore.StateFailed || !strings.Contains(got.Versions[0].Message, "re-fetch failed") {
		t.Fatalf("index version %+v", got.Versions[0])
	}
}

func TestRestartKeepsDesiresAndServes(t *testing.T) {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "a.txt"), []byte("alpha"), 0o644)
	cfg := testConfig(t)
	h := start(t, cfg)
	if _, err := h.pull(api.PullRequest{Name: "m", URI: "file://" + src, Pin: true}); err != nil {
		t.Fatal(err)
	}
	h.stop()
	os.RemoveAll(src) // the source is gone: the cache must still serve
	h2 := start(t, cfg)
	a := h2.waitPhase("m", api.PhaseReady)
	if !a.Pinned || a.Desire == nil || h2.read("m", "a.txt") != "alpha" {
		t.Fatalf("after restart: %+v", a)
	}
}

func TestBadRequests(t *testing.T) {
	h := start(t, testConfig(t))
	for _, req := range []api.PullRequest{
		{Name: "../etc", URI: "file:///tmp"},
		{Name: "ok", URI: "gopher://x/y"},
		{Name: "ok", URI: "file:///tmp", Digest: "md5:1"},
		{Name: "ok", URI: "file:///tmp", State: "maybe"},
		{Name: "ok", URI: "file:///tmp", Include: []string{"[x"}},
	} {
		if _, err := h.c.Pull(context.Background(), req, false, nil); !errors.Is(err, api.ErrInvalid) {
			t.Errorf("pull %+v: %v, want invalid_argument", req, err)
		}
	}
	if _, err := h.c.Get(context.Background(), "nothing"); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("get unknown: %v", err)
	}
	// Raw garbage on the socket gets a JSON error with a code.
	conn, err := net.Dial("unix", h.cfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "POST /v1/pull HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n{\"name\":1")
	buf := make([]byte, 512)
	n, _ := conn.Read(buf)
	if !strings.Contains(string(buf[:n]), "400") || !strings.Contains(string(buf[:n]), `"code":"invalid_argument"`) {
		t.Fatalf("garbage body answered %q", buf[:n])
	}
}

// TestPullOfAnotherSourceNeedsReplace: a pull that names another source
// under an existing name is refused, naming both, until it says
// --replace; the same source again (a retry, a rotated credential) is not
// a replacement.
func TestPullOfAnotherSourceNeedsReplace(t *testing.T) {
	one, two := data(1<<10, 61), data(1<<10, 62)
	srv := newFileServer(t, map[string][]byte{"one.bin": one, "two.bin": two})
	h := start(t, testConfig(t))
	if _, err := h.pull(api.PullRequest{Name: "m", URI: srv.URL + "/one.bin?token=first"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.pull(api.PullRequest{Name: "m", URI: srv.URL + "/one.bin?token=rotated#sha256=" + sha(one)}); err != nil {
		t.Fatalf("the same source with another credential and a digest: %v", err)
	}
	_, err := h.pull(api.PullRequest{Name: "m", URI: srv.URL + "/two.bin"})
	if !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "one.bin") || !strings.Contains(err.Error(), "two.bin") || !strings.Contains(err.Error(), "--replace") {
		t.Fatalf("another source under the same name: %v; want a conflict naming both and --replace", err)
	}
	if h.read("m", "one.bin") != string(one) {
		t.Fatal("a refused replacement changed what is served")
	}
	if _, err := h.pull(api.PullRequest{Name: "m", URI: srv.URL + "/two.bin", Replace: true}); err != nil {
		t.Fatalf("--replace: %v", err)
	}
	if h.read("m", "two.bin") != string(two) {
		t.Fatal("--replace did not serve the new source")
	}
}

func TestSourceOf(t *testing.T) {
	for _, tc := range []struct{ a, b string }{
		{"hf://org/repo", "hf://org/repo@main"},
		{"hf://org/repo@v1.0", "hf://org/repo@0123abcd"},
		{"oci://reg:5000/ns/img:v1", "oci://reg:5000/ns/img@sha256:abcd"},
		{"ngc://org/team/model:1.0", "ngc://org/team/model"},
		{"https://h/w.bin", "https://h/w.bin#sha256=ab"},
	} {
		if sourceOf(tc.a) != sourceOf(tc.b) {
			t.Errorf("%s and %s are one source: %s != %s", tc.a, tc.b, sourceOf(tc.a), sourceOf(tc.b))
		}
	}
	for _, tc := range []struct{ a, b string }{
		{"hf://org/repo", "hf://org/other"},
		{"oci://reg:5000/ns/img:v1", "oci://reg:5001/ns/img:v1"},
		{"https://h/v1/w.bin", "https://h/v2/w.bin"},
		{"s3://b/p1/", "s3://b/p2/"},
	} {
		if sourceOf(tc.a) == sourceOf(tc.b) {
			t.Errorf("%s and %s are two sources", tc.a, tc.b)
		}
	}
}
