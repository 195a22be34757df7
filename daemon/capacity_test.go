package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/capacity"
	"github.com/modelcache/modelcache/internal/testenv"
)

// TestAdmissionRejectsWhatCannotFit: over the quota with nothing
// evictable, a pull fails at once with the numbers, before one byte is
// fetched, and other artifacts stay.
func TestAdmissionRejectsWhatCannotFit(t *testing.T) {
	small, big := data(512<<10, 50), data(2<<20, 51)
	srv := newFileServer(t, map[string][]byte{"small.bin": small, "big.bin": big})
	cfg := testConfig(t)
	cfg.Capacity = capacity.Policy{QuotaBytes: 1 << 20, HighPercent: 85, LowPercent: 80, MinAge: time.Hour}
	h := start(t, cfg)
	if _, err := h.pull(api.PullRequest{Name: "small", URI: srv.URL + "/small.bin#sha256=" + sha(small)}); err != nil {
		t.Fatal(err)
	}
	gets := srv.gets.Load()
	_, err := h.pull(api.PullRequest{Name: "big", URI: srv.URL + "/big.bin#sha256=" + sha(big)})
	if !errors.Is(err, api.ErrFailed) {
		t.Fatalf("pull over quota: %v", err)
	}
	for _, want := range []string{"InsufficientCapacity", "needs 2.0 MiB", "free on the filesystem", "evictable now 0 B"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}
	if srv.gets.Load() != gets {
		t.Fatal("a refused pull still downloaded bytes")
	}
	a, _ := h.c.Get(context.Background(), "big")
	if a.Phase != api.PhaseFailed || a.Reason != api.ReasonInsufficientCapacity {
		t.Fatalf("artifact %+v: want Failed with reason InsufficientCapacity", a)
	}
	if h.read("small", "small.bin") != string(small) {
		t.Fatal("the other artifact was touched")
	}
}

// TestReservationsStopDoubleAdmission: two pulls that each fit alone but
// not together: the second is refused while the first downloads.
func TestReservationsStopDoubleAdmission(t *testing.T) {
	one, two := data(3<<20, 52), data(3<<20, 53)
	srv := newFileServer(t, map[string][]byte{"one.bin": one, "two.bin": two})
	gate := make(chan struct{})
	var once sync.Once
	srv.hook = func(rw http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodGet && r.URL.Path == "/one.bin" {
			<-gate
		}
		return false
	}
	defer once.Do(func() { close(gate) })
	cfg := testConfig(t)
	cfg.MaxConcurrentPulls = 2
	cfg.Capacity = capacity.Policy{QuotaBytes: 5 << 20, HighPercent: 85, LowPercent: 80}
	h := start(t, cfg)
	// one is declared (--keep): as an ad-hoc entry two's retry would,
	// rightly, evict it once Ready (issue 16) and hold a reservation of its own.
	h.c.Pull(context.Background(), api.PullRequest{Name: "one", URI: srv.URL + "/one.bin#sha256=" + sha(one), Keep: true}, false, nil)
	h.waitPhase("one", api.PhaseDownloading)
	testenv.Eventually(t, "one's reservation", 30*time.Second, func() error {
		if h.d.space.reserved() == 0 {
			return errors.New("nothing reserved")
		}
		return nil
	})
	_, err := h.pull(api.PullRequest{Name: "two", URI: srv.URL + "/two.bin#sha256=" + sha(two)})
	if err == nil || !strings.Contains(err.Error(), "reserved by pulls in flight") || !strings.Contains(err.Error(), "3.0 MiB reserved") {
		t.Fatalf("second pull into reserved space: %v", err)
	}
	once.Do(func() { close(gate) })
	if _, err := h.c.Wait(context.Background(), "one", 30*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	if r := h.d.space.reserved(); r != 0 {
		a1, _ := h.c.Get(context.Background(), "one")
		a2, _ := h.c.Get(context.Background(), "two")
		t.Fatalf("reservation left after the pull: %d; one %s %s; two %s %s", r, a1.Phase, a1.Message, a2.Phase, a2.Message)
	}
}

// TestLeaseBlocksEvictAndShowsInList: a leased artifact is listed as in
// use and cannot be evicted even with --force; after release it can.
func TestLeaseBlocksEvictAndShowsInList(t *testing.T) {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "w.bin"), []byte("weights"), 0o644)
	h := start(t, testConfig(t))
	if _, err := h.pull(api.PullRequest{Name: "m", URI: "file://" + src}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.Lease(context.Background(), "m", "job-7", 0); !errors.Is(err, api.ErrInvalid) {
		t.Fatalf("lease with no ttl: %v", err)
	}
	l, err := h.c.Lease(context.Background(), "m", "job-7", time.Minute)
	if err != nil || l.Revision == "" {
		t.Fatalf("lease: %+v %v", l, err)
	}
	list, _ := h.c.List(context.Background())
	if len(list) != 1 || len(list[0].InUse) != 1 || list[0].InUse[0].ID != "job-7" || list[0].InUse[0].Kind != "lease" {
		t.Fatalf("list does not show the lease: %+v", list)
	}
	_, err = h.c.Evict(context.Background(), "m", "", true)
	if !errors.Is(err, api.ErrInUse) || !strings.Contains(err.Error(), "lease job-7") {
		t.Fatalf("evict of a leased artifact with --force: %v", err)
	}
	if err := h.c.Release(context.Background(), "m", "job-7"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.Evict(context.Background(), "m", "", false); err != nil {
		t.Fatalf("evict after release: %v", err)
	}
}

// TestOpenFileBlocksEvict: this test process holds a model file open; the
// /proc scan sees it and evict refuses.
func TestOpenFileBlocksEvict(t *testing.T) {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "w.bin"), []byte("weights"), 0o644)
	h := start(t, testConfig(t))
	if _, err := h.pull(api.PullRequest{Name: "m", URI: "file://" + src}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(h.cfg.Root, "models/m/current/w.bin"))
	if err != nil {
		t.Fatal(err)
	}
	// The daemon runs in this process and ignores its own pid; scan as if it were another.
	h.d.space.scanRun.Lock()
	h.d.space.scanner.Self = -1
	h.d.space.scanRun.Unlock()
	_, err = h.c.Evict(context.Background(), "m", "", true)
	if !errors.Is(err, api.ErrInUse) || !strings.Contains(err.Error(), "process pid") {
		t.Fatalf("evict of an open model: %v", err)
	}
	f.Close()
	if _, err := h.c.Evict(context.Background(), "m", "", false); err != nil {
		t.Fatalf("evict after close: %v", err)
	}
}

// TestGCDryRun lists what GC would remove without removing it.
func TestGCDryRun(t *testing.T) {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "w.bin"), []byte("weights"), 0o644)
	h := start(t, testConfig(t))
	if _, err := h.pull(api.PullRequest{Name: "m", URI: "file://" + src}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.d.store.Evict(context.Background(), "m", "", false); err != nil {
		t.Fatal(err)
	}
	d := "sha256:" + sha([]byte("weights"))
	r, err := h.c.GC(context.Background(), true)
	if err != nil || !r.DryRun || r.BytesFreed != 7 || len(r.Removed) != 1 || r.Removed[0] != d {
		t.Fatalf("dry run: %+v %v", r, err)
	}
	if !h.d.store.HasBlob(d) {
		t.Fatal("a dry run removed the blob")
	}
	if r, _ := h.c.GC(context.Background(), false); r.BlobsRemoved != 1 || h.d.store.HasBlob(d) {
		t.Fatalf("real gc: %+v", r)
	}
}

// TestOldRevisionPrunedOnceUnused: with keepRevisions 0 and no min age,
// the previous revision goes after the swap; the current one stays.
func TestOldRevisionPrunedOnceUnused(t *testing.T) {
	v1, v2 := data(4000, 54), data(5000, 55)
	srv := newFileServer(t, map[string][]byte{"v1/w.bin": v1, "v2/w.bin": v2})
	cfg := testConfig(t)
	cfg.Capacity = capacity.Policy{HighPercent: 85, LowPercent: 80}
	h := start(t, cfg)
	if _, err := h.pull(api.PullRequest{Name: "m", URI: srv.URL + "/v1/w.bin#sha256=" + sha(v1)}); err != nil {
		t.Fatal(err)
	}
	// Another path under the same name: a replacement says so (issue 21).
	if _, err := h.pull(api.PullRequest{Name: "m", URI: srv.URL + "/v2/w.bin#sha256=" + sha(v2), Replace: true}); err != nil {
		t.Fatal(err)
	}
	// The pass evicts the version, then collects its blob: wait for both.
	testenv.Eventually(t, "the old revision pruned and its blob collected", 10*time.Second, func() error {
		a, _ := h.c.Get(context.Background(), "m")
		pruned := len(a.Versions) == 1 && a.Versions[0].Revision == sha(v2)
		if !pruned || h.d.store.HasBlob("sha256:"+sha(v1)) {
			return fmt.Errorf("pruned %v, versions %+v", pruned, a.Versions)
		}
		return nil
	})
	if !h.d.store.HasBlob("sha256:" + sha(v2)) {
		t.Fatal("the current revision's blob was collected")
	}
}

// TestAdmissionScansBeforeEvicting: a pull that needs room chooses its
// victims against a /proc scan made for that decision, not the capacity
// loop's last one: a model opened just before the pull stays, the next
// least recently used one goes.
func TestAdmissionScansBeforeEvicting(t *testing.T) {
	cfg := testConfig(t)
	cfg.CapacityInterval = time.Hour // the loop's scans happen only when a pull ends
	cfg.Capacity = capacity.Policy{QuotaBytes: 5 << 20, HighPercent: 85, LowPercent: 80}
	h := start(t, cfg)
	h.d.space.scanRun.Lock()
	h.d.space.scanner.Self = -1 // the daemon runs in this process: scan it as if it were another
	h.d.space.scanRun.Unlock()
	for i, name := range []string{"a", "b"} {
		src := t.TempDir()
		os.WriteFile(filepath.Join(src, "w.bin"), data(2<<20, byte(60+i)), 0o644)
		if _, err := h.pull(api.PullRequest{Name: name, URI: "file://" + src}); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Open(filepath.Join(h.cfg.Root, "models/a/current/w.bin")) // a, the older, is now in use
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "w.bin"), data(2<<20, 62), 0o644)
	c, err := h.pull(api.PullRequest{Name: "c", URI: "file://" + src})
	if err != nil {
		t.Fatal(err)
	}
	// The pull says what it evicted to make room.
	if l := c.LastPull; l == nil || len(l.Evicted) != 1 || l.Evicted[0].Name != "b" || l.Evicted[0].Bytes != 2<<20 {
		t.Fatalf("c's pull reports evictions %+v; want b (2 MiB)", c.LastPull)
	}
	if a, err := h.c.Get(context.Background(), "a"); err != nil || a.Phase != api.PhaseReady {
		t.Fatalf("a, open when c was admitted: %+v %v; want it kept", a, err)
	}
	if _, err := h.d.store.Summary("b"); !errors.Is(err, cachestore.ErrNotFound) {
		t.Fatalf("b: %v; want it evicted to make room for c", err)
	}
}

// TestRePullCountsOnlyWhatTheStoreLacks: pulling a Ready, pinned file://
// model again under a quota that could not hold it twice is a no-op that
// says so and reads nothing; after one of its files changed, admission
// counts only that file's bytes and the pull reads only it.
func TestRePullCountsOnlyWhatTheStoreLacks(t *testing.T) {
	cfg := testConfig(t)
	cfg.Capacity = capacity.Policy{QuotaBytes: 3 << 20, HighPercent: 85, LowPercent: 80}
	h := start(t, cfg)
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "big.bin"), data(3<<19, 70), 0o644)     // 1.5 MiB
	os.WriteFile(filepath.Join(src, "small.bin"), data(200<<10, 71), 0o644) // 200 KiB
	req := api.PullRequest{Name: "m", URI: "file://" + src, Pin: true}
	first, err := h.pull(req)
	if err != nil {
		t.Fatal(err)
	}
	again, err := h.pull(req)
	if err != nil {
		t.Fatalf("re-pull of a Ready model: %v", err)
	}
	if l := again.LastPull; l == nil || !l.Unchanged || l.BytesFetched != 0 || again.Revision != first.Revision {
		t.Fatalf("re-pull: %+v (revision %s, was %s); want unchanged, nothing read", again.LastPull, again.Revision, first.Revision)
	}
	// small.bin changes (new content, same size): only it is read, and
	// admission does not count big.bin, which would not fit twice.
	os.WriteFile(filepath.Join(src, "small.bin"), data(200<<10, 72), 0o644)
	changed, err := h.pull(req)
	if err != nil {
		t.Fatalf("re-pull after one file changed: %v", err)
	}
	if l := changed.LastPull; l == nil || l.Unchanged || l.BytesFetched != 200<<10 || l.BytesReused != 3<<19 || changed.Revision == first.Revision {
		t.Fatalf("re-pull after a change: %+v, revision %s; want 200 KiB read, 1.5 MiB reused, a new revision", changed.LastPull, changed.Revision)
	}
	if h.read("m", "small.bin") != string(data(200<<10, 72)) {
		t.Fatal("the new version does not hold the changed file")
	}
}
