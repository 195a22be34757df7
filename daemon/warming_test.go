package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/warm"
)

// warmGate holds every warm at its first chunk until it opens (the
// daemon's hook "warm.chunk"): a warm that started is then running, and
// stays so, until the test lets it go.
type warmGate struct {
	entered chan struct{} // a warm reached a chunk
	release chan struct{}
	once    sync.Once
}

func newWarmGate(cfg *Config) *warmGate {
	g := &warmGate{entered: make(chan struct{}, 64), release: make(chan struct{})}
	cfg.Hook = func(p string) {
		if p != "warm.chunk" {
			return
		}
		select {
		case g.entered <- struct{}{}:
		default:
		}
		<-g.release
	}
	return g
}

// open lets every warm run, now and later. Call it (or register it with
// t.Cleanup after the daemon starts) before the daemon stops: Close waits
// for the warms.
func (g *warmGate) open() { g.once.Do(func() { close(g.release) }) }

// warmModel pulls a model of a config and two 4 MiB weight files as
// name, drops its pages from the page cache and returns its revision.
func warmModel(t *testing.T, h *harness, name string) string {
	t.Helper()
	src := t.TempDir()
	for i, f := range []struct {
		path string
		n    int
	}{{"config.json", 300}, {"weights-1.bin", 4 << 20}, {"weights-2.bin", 4 << 20}} {
		if err := os.WriteFile(filepath.Join(src, f.path), data(f.n, byte(i+len(name))), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.pull(api.PullRequest{Name: name, URI: "file://" + src}); err != nil {
		t.Fatal(err)
	}
	a, err := h.c.Get(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	dropPages(t, h.d.store.TreePath(cachestore.KindModel, name, a.Revision))
	return a.Revision
}

// dropPages writes back and drops the page cache of every file under
// dir (fsync, FADV_DONTNEED), and skips the test where the filesystem
// keeps them (tmpfs; under CI=true it fails: warming would go untested).
func dropPages(t *testing.T, dir string) {
	t.Helper()
	if err := testenv.DropPageCache(dir); err != nil {
		t.Fatal(err)
	}
	if n, total, err := warm.Resident(dir); err != nil || n > total/10 {
		testenv.Missing(t, fmt.Sprintf("a disk-backed TMPDIR (%s keeps %d of %d bytes in memory after FADV_DONTNEED: %v; tmpfs?)", dir, n, total, err),
			"point TMPDIR at a directory on a disk filesystem")
	}
}

// residency is inspect's residency of name.
func residency(t *testing.T, h *harness, name string) (*api.Residency, error) {
	a, err := h.c.Get(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	if a.Resident == nil {
		return nil, errors.New("inspect shows no residency")
	}
	return a.Resident, nil
}

// fullyResident checks that the revision of name is resident in the page
// cache, all but the few pages the kernel may take back meanwhile.
func fullyResident(t *testing.T, h *harness, name string) func() error {
	return func() error {
		r, err := residency(t, h, name)
		if err != nil {
			return err
		}
		// The kernel may reclaim pages at any time: a loaded .ci/run saw
		// 7.8 of 8.0 MiB resident after the warm (2.5 %). Resident means
		// all but 5 %; a warm that did not run leaves far less.
		if r.Total == 0 || r.Bytes < r.Total-r.Total/20 {
			return errors.New(api.FormatBytes(r.Bytes) + " of " + api.FormatBytes(r.Total) + " resident")
		}
		return nil
	}
}

// warmCounter is the value of a modelcache_warm* series of the daemon's
// registry (label: the outcome, or "" for an unlabelled one).
func warmCounter(t *testing.T, d *Daemon, name, outcome string) float64 {
	t.Helper()
	mfs, err := d.metrics.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if outcome == "" || (len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == outcome) {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no series %s{outcome=%q}", name, outcome)
	return 0
}

// TestWarmCSIPublish: a published volume's revision becomes resident
// (inspect says so, the metrics count it); a volume with warm: "false"
// starts no warm; unpublishing a volume cancels the warm it started.
func TestWarmCSIPublish(t *testing.T) {
	cfg := csiConfig(t)
	gate := newWarmGate(&cfg)
	r := startCSI(t, cfg)
	t.Cleanup(gate.open) // before the daemon stops
	rev := warmModel(t, r.harness, "m")
	if res, _ := residency(t, r.harness, "m"); res == nil || res.Bytes == res.Total {
		t.Fatalf("inspect before publishing: %+v, want the dropped tree's residency", res)
	}

	// warm: "false": no warm starts (one would be held at its first
	// chunk, running, by the gate).
	off := r.target("uid-off", "model")
	if err := r.publish("vol-off", off, map[string]string{"modelCache": "m", "warm": "false"}); err != nil {
		t.Fatal(err)
	}
	if run := r.d.warming.w.Running("m@" + rev); run != nil {
		t.Fatalf("a volume with warm: \"false\" started a warm: %+v", run.Progress())
	}
	r.unpublishGone("vol-off", off)

	// Unpublish cancels the warm the volume started.
	first := r.target("uid-1", "model")
	if err := r.publish("vol-1", first, map[string]string{"modelCache": "m"}); err != nil {
		t.Fatal(err)
	}
	run := r.d.warming.w.Running("m@" + rev)
	if run == nil {
		t.Fatal("publish started no warm")
	}
	<-gate.entered
	r.unpublishGone("vol-1", first)
	gate.open()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if res, err := run.Wait(ctx); err != nil || res.Reason != warm.Cancelled {
		t.Fatalf("the warm of an unpublished volume ended %q (%v), want cancelled", res.Reason, err)
	}
	if n := warmCounter(t, r.d, "modelcache_warms_total", "cancelled"); n != 1 {
		t.Fatalf("modelcache_warms_total{outcome=cancelled} %v, want 1", n)
	}

	// Published again, the revision becomes resident.
	second := r.target("uid-2", "model")
	if err := r.publish("vol-2", second, map[string]string{"modelCache": "m"}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the published revision resident", 30*time.Second, fullyResident(t, r.harness, "m"))
	testenv.Eventually(t, "the warm counted done", 10*time.Second, func() error {
		if warmCounter(t, r.d, "modelcache_warms_total", "done") != 1 {
			return errors.New("not yet")
		}
		return nil
	})
	if b := warmCounter(t, r.d, "modelcache_warm_bytes_total", ""); b < 4<<20 {
		t.Fatalf("modelcache_warm_bytes_total %v, want the bytes the warms read", b)
	}
	r.unpublishGone("vol-2", second)
}

// TestWarmRouteSaysWhy: modelctl warm --wait's route returns when the
// revision is resident or the budget is spent, saying which.
func TestWarmRouteSaysWhy(t *testing.T) {
	for _, tc := range []struct {
		limit        int64
		reason, says string
	}{
		{0, api.WarmDone, "resident"},
		{1 << 20, api.WarmBudget, "budget spent"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.WarmLimit = tc.limit
			h := start(t, cfg)
			rev := warmModel(t, h, "m")
			var lines int
			res, err := h.c.Warm(context.Background(), "m", true, func(api.WarmResult) { lines++ })
			if err != nil {
				t.Fatal(err)
			}
			if res.Reason != tc.reason || !strings.Contains(res.Message, tc.says) || res.Revision != rev || lines == 0 {
				t.Fatalf("warm --wait: %+v after %d lines; want %s, saying %q", res, lines, tc.reason, tc.says)
			}
			if tc.limit > 0 && (res.WarmedBytes > tc.limit || res.BudgetBytes != tc.limit) {
				t.Fatalf("warm read %d bytes on a budget of %d, want at most the limit %d", res.WarmedBytes, res.BudgetBytes, tc.limit)
			}
			if tc.limit == 0 {
				if err := fullyResident(t, h, "m")(); err != nil {
					t.Fatalf("after a warm that said done: %v", err)
				}
			}
		})
	}
}

// TestWarmRefusals: a revision that is not Ready is refused, an unknown
// name is not found, warming off says so, a caller over its rate is
// answered 429 with the reason, and a local user outside the socket's
// group may not start a warm at all.
func TestWarmRefusals(t *testing.T) {
	cfg := testConfig(t)
	cfg.SocketGroup = "4242" // a numeric group: its members may mutate
	h := start(t, cfg)
	ctx := context.Background()
	rev := warmModel(t, h, "m")

	if _, err := h.c.Warm(ctx, "nosuch", false, nil); !errors.Is(err, api.ErrNotFound) {
		t.Errorf("warm of an unknown name: %v, want not found", err)
	}

	// A plain local user: forbidden, and nothing starts.
	call := func(uid uint32, groups ...uint32) *httptest.ResponseRecorder {
		req := httptest.NewRequest("POST", "/v1/artifacts/m/warm", nil)
		p := &peer{Groups: groups}
		p.Uid, p.Gid = uid, uid
		rec := httptest.NewRecorder()
		h.d.routes().ServeHTTP(rec, req.WithContext(context.WithValue(req.Context(), credKey{}, p)))
		return rec
	}
	if rec := call(nobody); rec.Code != http.StatusForbidden || !strings.Contains(rec.Body.String(), api.CodeForbidden) {
		t.Fatalf("a user outside the socket group: %d %s, want 403 forbidden", rec.Code, rec.Body)
	}
	if run := h.d.warming.w.Running("m@" + rev); run != nil {
		t.Fatal("a forbidden request started a warm")
	}
	if rec := call(nobody, 4242); rec.Code != http.StatusOK {
		t.Fatalf("a member of the socket group: %d %s, want the warm started", rec.Code, rec.Body)
	}
	if run := h.d.warming.w.Running("m@" + rev); run != nil {
		run.Wait(ctx) // its end frees the key: root's warms below each start one
	}

	// Root is not rate limited: it may fill the page cache anyway.
	for i := 0; i < 5; i++ {
		if _, err := h.c.Warm(ctx, "m", true, nil); err != nil {
			t.Fatalf("root's warm %d in a row: %v", i+1, err)
		}
	}
	// Another caller: bursts of 4 starts (the member's first was above;
	// joining a running warm is free: each of these ends before the next).
	var rec *httptest.ResponseRecorder
	for i := 0; i < 4; i++ {
		rec = call(nobody, 4242)
		if run := h.d.warming.w.Running("m@" + rev); run != nil {
			run.Wait(ctx)
		}
		if rec.Code != http.StatusOK {
			break
		}
	}
	if rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), api.CodeRateLimited) || !strings.Contains(rec.Body.String(), "at most 4 warms in a burst") {
		t.Fatalf("the member's fifth warm in a row: %d %s, want 429 rate_limited naming the limit", rec.Code, rec.Body)
	}
	if n := warmCounter(t, h.d, "modelcache_warms_total", "refused"); n != 1 {
		t.Fatalf("modelcache_warms_total{outcome=refused} %v, want 1", n)
	}

	// Not Ready: refused with a conflict that says why.
	if err := h.d.store.SetState("m", rev, cachestore.StateMissing, "a blob went missing"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.d.warming.start(ctx, "m", rev, "test"); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "not Ready") {
		t.Fatalf("warm of a revision that is not Ready: %v, want a conflict saying so", err)
	}
}

// TestWarmOff: with --warm=false the route says warming is off and a
// lease warms nothing.
func TestWarmOff(t *testing.T) {
	cfg := testConfig(t)
	cfg.Warm = false
	h := start(t, cfg)
	warmModel(t, h, "m")
	if _, err := h.c.Warm(context.Background(), "m", false, nil); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "--warm=false") {
		t.Fatalf("warm on a node with --warm=false: %v, want a conflict naming the flag", err)
	}
	if _, err := h.c.Lease(context.Background(), "m", "job", time.Minute); err != nil {
		t.Fatal(err)
	}
	h.d.warming.mu.Lock()
	n := len(h.d.warming.holds)
	h.d.warming.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d warm holds on a node with --warm=false", n)
	}
}

// TestWarmLeaseWaitEvict: a lease warms until it is released; wait
// returning Ready starts a warm; evicting the revision cancels its warms.
func TestWarmLeaseWaitEvict(t *testing.T) {
	cfg := testConfig(t)
	gate := newWarmGate(&cfg)
	h := start(t, cfg)
	t.Cleanup(gate.open)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rev := warmModel(t, h, "m")
	key := "m@" + rev
	ended := func(run *warm.Run, want warm.Reason, what string) {
		t.Helper()
		if res, err := run.Wait(ctx); err != nil || res.Reason != want {
			t.Fatalf("%s: the warm ended %q (%v), want %s", what, res.Reason, err, want)
		}
	}

	// Lease: the warm runs for the lease, and ends with its release.
	if _, err := h.c.Lease(ctx, "m", "job", time.Minute); err != nil {
		t.Fatal(err)
	}
	run := h.d.warming.w.Running(key)
	if run == nil {
		t.Fatal("a lease started no warm")
	}
	<-gate.entered
	if err := h.c.Release(ctx, "m", "job"); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the released lease's warm let go", 10*time.Second, func() error {
		if h.d.warming.w.Running(key) != nil {
			return errors.New("still running")
		}
		return nil
	})

	// Wait returning Ready starts a warm (and does not wait for it).
	if _, err := h.c.Wait(ctx, "m", 0, nil); err != nil {
		t.Fatal(err)
	}
	waited := h.d.warming.w.Running(key)
	if waited == nil || waited == run {
		t.Fatal("wait returning Ready started no warm")
	}
	<-gate.entered // planned: the tree is open

	// Evicting the revision cancels it.
	if _, err := h.c.Evict(ctx, "m", "", true); err != nil {
		t.Fatal(err)
	}
	gate.open()
	ended(run, warm.Cancelled, "a released lease")
	ended(waited, warm.Cancelled, "an evicted revision")
}

// TestWarmSettingsValidated: a share outside (0, 1] or a negative limit
// is refused, naming the flag and what it takes.
func TestWarmSettingsValidated(t *testing.T) {
	for _, tc := range []struct {
		share float64
		limit int64
		want  string
	}{
		{0, 0, "--warm-share 0: want a share of MemAvailable in (0, 1]"},
		{1.5, 0, "--warm-share 1.5"},
		{-0.1, 0, "--warm-share -0.1"},
		{0.5, -1, "--warm-limit -1: want bytes >= 0"},
	} {
		cfg := testConfig(t)
		cfg.WarmShare, cfg.WarmLimit = tc.share, tc.limit
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("share %v limit %d: %v, want %q", tc.share, tc.limit, err, tc.want)
		}
	}
	cfg := testConfig(t)
	cfg.WarmShare, cfg.WarmLimit = 1, 8<<30
	if err := cfg.Validate(); err != nil {
		t.Errorf("share 1, limit 8Gi: %v", err)
	}
}
