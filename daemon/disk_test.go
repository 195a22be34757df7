package daemon

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/internal/testenv"
)

// startWith is start with the daemon's retry policy inside a pull set to b.
func startWith(t testing.TB, cfg Config, b fetchers.Backoff) *harness {
	t.Helper()
	d, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	d.backoff = b
	ctx, cancel := context.WithCancel(context.Background())
	h := &harness{t: t, d: d, c: &api.Client{Socket: cfg.Socket}, cfg: cfg, cancel: cancel, done: make(chan error, 1)}
	go func() { h.done <- d.Run(ctx) }()
	testenv.Eventually(t, "daemon healthy", 5*time.Second, func() error { return h.c.Health(context.Background()) })
	t.Cleanup(h.stop)
	return h
}

// ingests lists the partial downloads under the root.
func (h *harness) ingests() []string {
	ents, err := os.ReadDir(filepath.Join(h.cfg.Root, "ingest"))
	if err != nil {
		h.t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		ref, _ := os.ReadFile(filepath.Join(h.cfg.Root, "ingest", e.Name(), "ref"))
		out = append(out, string(ref))
	}
	return out
}

// TestFullDiskRecovers: a source that sends an endless body without a
// length, on a small filesystem, fails the pull at the budget admission
// gave it (before the disk is full), leaves no partial download behind,
// keeps the Ready model, and the next pull succeeds without anyone
// stepping in.
func TestFullDiskRecovers(t *testing.T) {
	mnt := testenv.Tmpfs(t, "24m")
	small, next := data(1<<20, 60), data(4<<20, 61)
	srv := newFileServer(t, map[string][]byte{"small.bin": small, "next.bin": next})
	chunk := data(256<<10, 62)
	srv.hook = func(rw http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/endless.bin" {
			return false
		}
		if r.Method == http.MethodHead {
			rw.WriteHeader(http.StatusMethodNotAllowed)
			return true
		}
		for r.Context().Err() == nil { // chunked, no Content-Length, never ends
			if _, err := rw.Write(chunk); err != nil {
				break
			}
			rw.(http.Flusher).Flush()
		}
		return true
	}
	cfg := testConfig(t)
	cfg.Root = filepath.Join(mnt, "root")
	cfg.RetryInitial, cfg.RetryMax = time.Hour, time.Hour // one attempt of each pull here
	h := start(t, cfg)
	if _, err := h.pull(api.PullRequest{Name: "small", URI: srv.URL + "/small.bin#sha256=" + sha(small)}); err != nil {
		t.Fatal(err)
	}
	_, err := h.pull(api.PullRequest{Name: "endless", URI: srv.URL + "/endless.bin"})
	if !errors.Is(err, api.ErrFailed) || !strings.Contains(err.Error(), "admitted for") || !strings.Contains(err.Error(), api.ReasonInsufficientCapacity) {
		t.Fatalf("endless body: %v, want Failed naming the budget it was admitted for", err)
	}
	if ing := h.ingests(); len(ing) != 0 {
		t.Fatalf("partial downloads left after a pull that failed for good: %q", ing)
	}
	a, err := h.c.Get(context.Background(), "small")
	if err != nil || a.Phase != api.PhaseReady || h.read("small", "small.bin") != string(small) {
		t.Fatalf("the Ready model: %+v %v", a, err)
	}
	if a, err := h.pull(api.PullRequest{Name: "next", URI: srv.URL + "/next.bin#sha256=" + sha(next)}); err != nil || a.Phase != api.PhaseReady {
		t.Fatalf("the next pull after the endless one: %+v %v", a, err)
	}
	if h.read("next", "next.bin") != string(next) {
		t.Fatal("next.bin differs")
	}
}

// cutServer serves files; of name (its size announced) it cuts the first
// GET at cut bytes and answers every resume with 503: the pull fails for
// a reason worth retrying and its partial data stays for a resume.
func cutServer(t *testing.T, files map[string][]byte, name string, cut int) *fileServer {
	srv := newFileServer(t, files)
	body := files[name]
	srv.hook = func(rw http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/"+name || r.Method != http.MethodGet {
			return false
		}
		if r.Header.Get("Range") != "" {
			rw.WriteHeader(http.StatusServiceUnavailable)
			return true
		}
		rw.Header().Set("Content-Length", fmt.Sprint(len(body)))
		rw.WriteHeader(http.StatusOK)
		rw.Write(body[:cut])
		rw.(http.Flusher).Flush()
		conn, _, _ := rw.(http.Hijacker).Hijack()
		conn.Close()
		return true
	}
	return srv
}

// TestPartialReclaimedForAPull: a partial download kept for a resume
// counts as reclaimable space: a pull that fits only without it removes
// it (not a model) and succeeds.
func TestPartialReclaimedForAPull(t *testing.T) {
	mnt := testenv.Tmpfs(t, "16m")
	keep, big, cut := data(2<<20, 63), data(9<<20, 64), data(6<<20, 65)
	srv := cutServer(t, map[string][]byte{"cut.bin": cut, "keep.bin": keep, "big.bin": big}, "cut.bin", 4<<20)
	cfg := testConfig(t)
	cfg.Root = filepath.Join(mnt, "root")
	cfg.RetryInitial, cfg.RetryMax = time.Hour, time.Hour
	h := start(t, cfg)
	if _, err := h.pull(api.PullRequest{Name: "keep", URI: srv.URL + "/keep.bin#sha256=" + sha(keep)}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.pull(api.PullRequest{Name: "cut", URI: srv.URL + "/cut.bin#sha256=" + sha(cut)}); !errors.Is(err, api.ErrFailed) {
		t.Fatalf("cut source: %v, want Failed", err)
	}
	if ing := h.ingests(); len(ing) != 1 {
		t.Fatalf("partial downloads %q: want the cut one kept for a resume", ing)
	}
	// 16 MiB at most 85% used: about 7.6 MiB of room with the 4 MiB partial, 11.6 without.
	if a, err := h.pull(api.PullRequest{Name: "big", URI: srv.URL + "/big.bin#sha256=" + sha(big)}); err != nil || a.Phase != api.PhaseReady {
		t.Fatalf("a pull that fits once the partial download goes: %+v %v", a, err)
	}
	if ing := h.ingests(); len(ing) != 0 {
		t.Fatalf("partial downloads %q after the pull that needed their space", ing)
	}
	if a, err := h.c.Get(context.Background(), "keep"); err != nil || a.Phase != api.PhaseReady || h.read("keep", "keep.bin") != string(keep) {
		t.Fatalf("the Ready model: %+v %v", a, err)
	}
}

// TestAbandonedPartialsRemoved: a partial download stays while its
// artifact is desired, goes with the desire (evict), and modelctl gc
// removes those of artifacts nobody desires (dry run: only counted).
func TestAbandonedPartialsRemoved(t *testing.T) {
	cut := data(3<<20, 66)
	srv := cutServer(t, map[string][]byte{"cut.bin": cut}, "cut.bin", 2<<20)
	cfg := testConfig(t)
	cfg.RetryInitial, cfg.RetryMax = time.Hour, time.Hour
	h := start(t, cfg)
	ctx := context.Background()
	if _, err := h.pull(api.PullRequest{Name: "cut", URI: srv.URL + "/cut.bin#sha256=" + sha(cut)}); !errors.Is(err, api.ErrFailed) {
		t.Fatalf("cut source: %v, want Failed", err)
	}
	if r, err := h.c.GC(ctx, false); err != nil || r.IngestsRemoved != 0 || len(h.ingests()) != 1 {
		t.Fatalf("gc removed the partial download of a desired artifact: %+v %v %q", r, err, h.ingests())
	}
	if _, err := h.c.Evict(ctx, "cut", "", false); err != nil {
		t.Fatal(err)
	}
	if ing := h.ingests(); len(ing) != 0 {
		t.Fatalf("partial downloads %q after the artifact was evicted", ing)
	}

	// Left by a pull of an artifact nobody desires now (its desire went
	// while the daemon was down), and an archive member of a dead attempt.
	for _, in := range []cachestore.WriterOpts{{Ref: "src:https://h/x#w.bin", Owner: "gone"}, {Ref: layerRefPrefix + "sha256:ab:w.bin"}} {
		in.Size = -1
		w, err := h.d.store.Writer(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(make([]byte, 5000))
		w.Close()
	}
	r, err := h.c.GC(ctx, true)
	if err != nil || r.IngestsRemoved != 2 || r.IngestBytesFreed != 10000 || len(h.ingests()) != 2 {
		t.Fatalf("gc --dry-run: %+v %v; left %q", r, err, h.ingests())
	}
	r, err = h.c.GC(ctx, false)
	if err != nil || r.IngestsRemoved != 2 || len(h.ingests()) != 0 {
		t.Fatalf("gc: %+v %v; left %q", r, err, h.ingests())
	}
}

// dripHook answers GETs of the named paths (from the offset a Range asks
// for) with a byte every 100 ms: never idle for the 2 s idle timeout, far
// below any floor.
func dripHook(body []byte, paths ...string) func(rw http.ResponseWriter, r *http.Request) bool {
	return func(rw http.ResponseWriter, r *http.Request) bool {
		drip := false
		for _, p := range paths {
			drip = drip || r.URL.Path == p
		}
		if !drip || r.Method != http.MethodGet {
			return false
		}
		from := 0
		if _, err := fmt.Sscanf(r.Header.Get("Range"), "bytes=%d-", &from); err == nil && from < len(body) {
			rw.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", from, len(body)-1, len(body)))
			rw.Header().Set("Content-Length", fmt.Sprint(len(body)-from))
			rw.WriteHeader(http.StatusPartialContent)
		} else {
			from = 0
			rw.Header().Set("Content-Length", fmt.Sprint(len(body)))
			rw.WriteHeader(http.StatusOK)
		}
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for i := from; i < len(body); i++ {
			if _, err := rw.Write(body[i : i+1]); err != nil {
				return true
			}
			rw.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return true
			case <-t.C:
			}
		}
		return true
	}
}

// TestSlowDripCannotHoldSlots: two sources that drip one byte at a time
// take both pull slots; a normal pull behind them still becomes Ready,
// and the drips fail with the rate that was too slow.
func TestSlowDripCannotHoldSlots(t *testing.T) {
	w, normal := data(300<<10, 67), data(200<<10, 68)
	srv := newFileServer(t, map[string][]byte{"d1.bin": w, "d2.bin": w, "normal.bin": normal})
	srv.hook = dripHook(w, "/d1.bin", "/d2.bin")
	cfg := testConfig(t)
	cfg.MaxConcurrentPulls = 2
	cfg.ProgressFloor, cfg.ProgressWindow = 64<<10, time.Second
	cfg.RetryInitial, cfg.RetryMax = time.Hour, time.Hour
	h := start(t, cfg)
	ctx := context.Background()
	for _, n := range []string{"d1", "d2"} {
		if _, err := h.c.Pull(ctx, api.PullRequest{Name: n, URI: srv.URL + "/" + n + ".bin"}, false, nil); err != nil {
			t.Fatal(err)
		}
		h.waitPhase(n, api.PhaseDownloading)
	}
	if a, err := h.pull(api.PullRequest{Name: "normal", URI: srv.URL + "/normal.bin#sha256=" + sha(normal)}); err != nil || a.Phase != api.PhaseReady {
		t.Fatalf("a normal pull behind two drips: %+v %v", a, err)
	}
	for _, n := range []string{"d1", "d2"} {
		wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		_, err := h.c.Wait(wctx, n, 60*time.Second, nil)
		cancel()
		if !errors.Is(err, api.ErrFailed) || !strings.Contains(err.Error(), "too slow") || !strings.Contains(err.Error(), "B/s), below the floor of 65536 bytes per 1s (64.0 KiB/s)") {
			t.Fatalf("%s: %v, want Failed naming the rate below the floor", n, err)
		}
	}
}

// TestWaitingPullsGiveBackSlots: pulls that keep waiting to retry (a
// source answering 503 with Retry-After, retried without end) give their
// slots up while they wait: a pull queued behind them gets one.
func TestWaitingPullsGiveBackSlots(t *testing.T) {
	w, normal := data(100<<10, 69), data(100<<10, 70)
	srv := newFileServer(t, map[string][]byte{"busy1.bin": w, "busy2.bin": w, "normal.bin": normal})
	srv.hook = func(rw http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodGet || !strings.HasPrefix(r.URL.Path, "/busy") {
			return false
		}
		rw.Header().Set("Retry-After", "1")
		rw.WriteHeader(http.StatusServiceUnavailable)
		return true
	}
	cfg := testConfig(t)
	cfg.MaxConcurrentPulls = 2
	h := startWith(t, cfg, fetchers.Backoff{Initial: 10 * time.Millisecond, Max: 50 * time.Millisecond, MaxRetryAfter: 5 * time.Second}) // no attempt limit
	ctx := context.Background()
	for _, n := range []string{"busy1", "busy2"} {
		if _, err := h.c.Pull(ctx, api.PullRequest{Name: n, URI: srv.URL + "/" + n + ".bin#sha256=" + sha(w)}, false, nil); err != nil {
			t.Fatal(err)
		}
		h.waitPhase(n, api.PhaseDownloading)
	}
	if a, err := h.pull(api.PullRequest{Name: "normal", URI: srv.URL + "/normal.bin#sha256=" + sha(normal)}); err != nil || a.Phase != api.PhaseReady {
		t.Fatalf("a pull behind two that wait to retry: %+v %v", a, err)
	}
	for _, n := range []string{"busy1", "busy2"} {
		if a, _ := h.c.Get(ctx, n); a.Phase != api.PhaseDownloading {
			t.Fatalf("%s: %s %q, want still retrying", n, a.Phase, a.Message)
		}
	}
}

// manyEntryTar is a tar of n regular files models/f<i> of 8 distinct
// bytes each. One header comes from archive/tar and is patched per entry
// (name, body, checksum): archive/tar under the race detector takes many
// seconds for a hundred thousand headers.
func manyEntryTar(n int) []byte {
	var tmpl bytes.Buffer
	tw := tar.NewWriter(&tmpl)
	tw.WriteHeader(&tar.Header{Name: "models/f000000", Typeflag: tar.TypeReg, Mode: 0o644, Size: 8})
	tw.Write([]byte("00000000"))
	tw.Flush() // pads the body to its block: header and body are 1024 bytes

	var base int64 // the checksum of the template, its own field counted as spaces
	for i, c := range tmpl.Bytes()[:512] {
		if i >= 148 && i < 156 {
			c = ' '
		}
		base += int64(c)
	}
	digits := func(dst []byte, v int) (sum int64) {
		for k := len(dst) - 1; k >= 0; k-- {
			dst[k] = byte('0' + v%10)
			sum += int64(v % 10)
			v /= 10
		}
		return sum
	}
	out := make([]byte, 0, n*1024+1024)
	for i := 0; i < n; i++ {
		out = append(out, tmpl.Bytes()...)
		e := out[len(out)-1024:]
		sum := base + digits(e[len("models/f"):len("models/f")+6], i)
		digits(e[512:520], i)
		copy(e[148:156], fmt.Sprintf("%06o\x00 ", sum))
	}
	return append(out, make([]byte, 1024)...) // the end-of-archive blocks
}

// TestHugeArchiveRefusedUpFront: a small layer with more entries than the
// archive limit is refused before any member is written (one blob commit:
// the layer's own, gone again afterwards), once (a permanent failure: one
// GET), naming the limit.
func TestHugeArchiveRefusedUpFront(t *testing.T) {
	const entries = 120000
	var z bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&z, gzip.BestSpeed)
	zw.Write(manyEntryTar(entries))
	zw.Close()
	layer := static.NewLayer(z.Bytes(), types.OCILayer)
	ld, _ := layer.Digest()

	reg := registry.New()
	var gets atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+ld.String()) {
			gets.Add(1)
		}
		reg.ServeHTTP(w, r)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	push(t, host, "models/huge:1", modelcar(t, layer))

	var commits atomic.Int64
	members := make(chan struct{})
	var once sync.Once
	cfg := testConfig(t)
	cfg.InsecureRegistries = []string{host}
	cfg.RetryInitial, cfg.RetryMax = time.Hour, time.Hour
	cfg.Hook = func(p string) {
		if p == "blob.after-rename" && commits.Add(1) > 1 {
			once.Do(func() { close(members) })
		}
	}
	h := start(t, cfg)
	done := make(chan error, 1)
	go func() {
		_, err := h.pull(api.PullRequest{Name: "huge", URI: "oci://" + host + "/models/huge:1"})
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-members:
		t.Fatal("members of a layer past the entry limit were committed before the limit was checked")
	}
	if !errors.Is(err, api.ErrFailed) || !strings.Contains(err.Error(), "more than 100000 entries") {
		t.Fatalf("a layer of %d entries: %v, want Failed naming the entry limit", entries, err)
	}
	if n := gets.Load(); n != 1 {
		t.Fatalf("the refused layer was fetched %d times, want once (a permanent failure)", n)
	}
	if _, n, _ := h.d.store.BlobStats(); n != 0 {
		t.Fatalf("%d blobs left after the refused layer, want none", n)
	}
	if ing := h.ingests(); len(ing) != 0 {
		t.Fatalf("partial downloads left: %q", ing)
	}
}

// TestSmallMembersCommitInBatches: a layer of many small files is not
// committed one fsync at a time: its members share a few syncs, and every
// member arrives intact.
func TestSmallMembersCommitInBatches(t *testing.T) {
	const entries = 1500
	var z bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&z, gzip.BestSpeed)
	zw.Write(manyEntryTar(entries))
	zw.Close()
	layer := static.NewLayer(z.Bytes(), types.OCILayer)
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	push(t, host, "models/many:1", modelcar(t, layer))

	var fsyncs, batches atomic.Int64
	cfg := testConfig(t)
	cfg.InsecureRegistries = []string{host}
	cfg.Hook = func(p string) {
		switch p {
		case "ingest.fsync":
			fsyncs.Add(1)
		case "batch.sync":
			batches.Add(1)
		}
	}
	h := start(t, cfg)
	if _, err := h.pull(api.PullRequest{Name: "many", URI: "oci://" + host + "/models/many:1"}); err != nil {
		t.Fatal(err)
	}
	a, err := h.c.Get(context.Background(), "many")
	if err != nil || len(a.Versions) == 0 || len(a.Versions[0].Files) != entries {
		t.Fatalf("the model: %v files, %v", len(a.Versions[0].Files), err)
	}
	for _, f := range []string{"f000000", "f000777", fmt.Sprintf("f%06d", entries-1)} {
		if got := h.read("many", f); len(got) != 8 || strings.HasPrefix(got, "<") {
			t.Fatalf("%s: %q", f, got)
		}
	}
	// The layer blob itself is one fsync; its members share the batches.
	if n, b := fsyncs.Load(), batches.Load(); n > 2 || b < 1 || b > entries/100 {
		t.Fatalf("%d members: %d fsyncs of their own and %d batch syncs; want them batched", entries, n, b)
	}
	t.Logf("%d members: %d member fsyncs, %d batch syncs", entries, fsyncs.Load(), batches.Load())
}
