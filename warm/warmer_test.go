package warm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"

	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/warm/warmtest"
)

// withChunkHook calls f before each chunk of every warm.
func withChunkHook(f func(r *Run, i int)) Option {
	return func(c *config) error { c.onChunk = f; return nil }
}

// newWarmer makes a Warmer that does not yield to other I/O (the machine
// running the tests does its own), unless opts say otherwise.
func newWarmer(t *testing.T, opts ...Option) *Warmer {
	t.Helper()
	w, err := New(append([]Option{WithYield(0)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	return w
}

func residentOf(t *testing.T, dir string) (int64, int64) {
	t.Helper()
	r, total, err := Resident(dir)
	if err != nil {
		t.Fatal(err)
	}
	return r, total
}

// The warm runs to its end, at idle I/O priority, and leaves the whole
// tree resident; with 1 MiB chunks and a 32 MiB lookahead the kernel's
// readahead of its own reads (read_ahead_kb up to 15 MiB) is not taken
// for a reader.
func TestWarmMakesTheTreeResident(t *testing.T) {
	dir := diskDir(t)
	warmtest.Model(t, dir, 3, 16)
	drop(t, dir)
	m := NewMetrics()
	var prio struct {
		sync.Once
		class int
		err   error
	}
	w := newWarmer(t, WithChunk(1<<20), WithLookahead(32<<20), WithMetrics(m), withChunkHook(func(*Run, int) {
		prio.Do(func() { prio.class, prio.err = threadIOPrio() })
	}))
	res, err := w.Warm(context.Background(), Request{Key: "m@1", Dir: dir, Caller: "test"})
	if err != nil {
		t.Fatal(err)
	}
	_, total := residentOf(t, dir)
	if res.Reason != Done || res.Err != nil || res.Total != total || res.Warmed+res.Resident != total || res.Warmed < total-total/50 {
		t.Errorf("Result = %+v; want done, %d bytes in all, all but the 2 %% the plan or the drop left read", res, total)
	}
	// The kernel may reclaim a few pages at any time (other work on the
	// machine): resident means all but that, the same 2 %.
	if r, _ := residentOf(t, dir); r < total-total/50 {
		t.Errorf("after the warm %d of %d bytes are resident", r, total)
	}
	if prio.err != nil || prio.class != ioprioClassIdle {
		t.Errorf("the warming thread's I/O class = %d (%v), want idle (%d)", prio.class, prio.err, ioprioClassIdle)
	}
	if got := testutil.ToFloat64(m.Bytes); got != float64(res.Warmed) {
		t.Errorf("modelcache_warm_bytes_total = %v, want %d", got, res.Warmed)
	}
	if got := testutil.ToFloat64(m.Warms.WithLabelValues("done")); got != 1 {
		t.Errorf("modelcache_warms_total{outcome=done} = %v, want 1", got)
	}
	if testutil.ToFloat64(m.Seconds) <= 0 {
		t.Error("modelcache_warm_seconds_total did not grow")
	}

	// A second warm finds it resident and reads only what the kernel
	// dropped since (at most the same 2 %), not the tree again.
	again, err := w.Warm(context.Background(), Request{Key: "m@1", Dir: dir, Caller: "test"})
	if err != nil || again.Reason != Done || again.Warmed+again.Resident != total || again.Warmed > total/50 {
		t.Errorf("a warm of a resident tree = %+v, %v; want done, %d bytes in all, at most %d of them read", again, err, total, total/50)
	}
}

func TestWarmStopsAtTheBudget(t *testing.T) {
	dir := diskDir(t)
	warmtest.Model(t, dir, 2, 16)
	drop(t, dir)
	const budget = 5<<20 + 12345
	w := newWarmer(t, WithChunk(1<<20), WithLimit(budget))
	res, err := w.Warm(context.Background(), Request{Key: "m@1", Dir: dir, Caller: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Reason != BudgetSpent || res.Budget != budget || res.Warmed > budget || res.Warmed < budget-(1<<20) {
		t.Errorf("Result = %+v; want budget spent, at most %d bytes warmed and no less than a chunk below", res, budget)
	}
	if r, total := residentOf(t, dir); r >= total-(4<<20) {
		t.Errorf("%d of %d bytes resident after a warm with a budget of %d", r, total, budget)
	}
}

// All running warms share the budget: a second revision warmed while the
// first holds all of it gets none.
func TestWarmsShareTheBudget(t *testing.T) {
	a, b := diskDir(t), diskDir(t)
	warmtest.Model(t, a, 1, 8)
	warmtest.Model(t, b, 1, 8)
	drop(t, a)
	drop(t, b)
	items, err := Plan(a)
	if err != nil {
		t.Fatal(err)
	}
	limit := Total(items) + 3<<20
	reached, gate := make(chan struct{}), make(chan struct{})
	w := newWarmer(t, WithChunk(1<<20), WithLimit(limit), withChunkHook(func(r *Run, i int) {
		if r.Key() == "a" && i == 0 {
			close(reached)
			<-gate
		}
	}))
	first, _, err := w.Start(context.Background(), Request{Key: "a", Dir: a, Caller: "test"})
	if err != nil {
		t.Fatal(err)
	}
	<-reached // the first warm holds its budget
	second, err := w.Warm(context.Background(), Request{Key: "b", Dir: b, Caller: "test"})
	close(gate)
	if err != nil {
		t.Fatal(err)
	}
	res, _ := first.Wait(context.Background())
	if res.Reason != Done || res.Budget != res.Total {
		t.Errorf("first warm = %+v; want done within a budget of its size", res)
	}
	if second.Budget != 3<<20 || second.Reason != BudgetSpent || second.Warmed > 3<<20 {
		t.Errorf("second warm = %+v; want the 3 MiB the first left, spent", second)
	}
}

func TestWarmStopsWhenItsHoldersLetGo(t *testing.T) {
	dir := diskDir(t)
	warmtest.Model(t, dir, 2, 8)
	drop(t, dir)
	ctx1, cancel1 := context.WithCancel(context.Background())
	ctx2, cancel2 := context.WithCancel(context.Background())
	second := make(chan struct{})
	m := NewMetrics()
	var w *Warmer
	w = newWarmer(t, WithChunk(1<<20), WithMetrics(m), withChunkHook(func(r *Run, i int) {
		switch i {
		case 0:
			<-second // both hold it
		case 1:
			cancel1() // one of two holders lets go: the warm goes on
			err := testenv.Poll(10*time.Second, func() error {
				w.mu.Lock()
				defer w.mu.Unlock()
				if r.holders != 1 {
					return fmt.Errorf("%d holders", r.holders)
				}
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		case 3:
			cancel2() // the last one lets go: the warm stops before chunk 3
			<-r.ctx.Done()
		}
	}))
	run, joined, err := w.Start(ctx1, Request{Key: "m@1", Dir: dir, Caller: "a"})
	if err != nil || joined {
		t.Fatalf("Start = %v, joined %v", err, joined)
	}
	again, joined, err := w.Start(ctx2, Request{Key: "m@1", Dir: dir, Caller: "b"})
	if err != nil || !joined || again != run {
		t.Fatalf("a second Start of the key = %p, joined %v, %v; want it to join %p", again, joined, err, run)
	}
	close(second)
	res, err := run.Wait(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	items, err := Plan(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, cs := chunks(items, 1<<20)
	if want := cs[0].len + cs[1].len + cs[2].len; res.Reason != Cancelled || res.Warmed+res.Resident != want {
		t.Errorf("Result = %+v; want cancelled after the three chunks (%d bytes) before the last holder let go", res, want)
	}
	if w.Running("m@1") != nil {
		t.Error("the cancelled warm still holds its key")
	}
	if got := testutil.ToFloat64(m.Warms.WithLabelValues("cancelled")); got != 1 {
		t.Errorf("modelcache_warms_total{outcome=cancelled} = %v, want 1", got)
	}
}

// A consumer that reads the tree while the warm runs gets ahead of it:
// what the warm saw cold far ahead is resident before it gets there.
func TestWarmStopsWhenOvertaken(t *testing.T) {
	dir := diskDir(t)
	warmtest.Model(t, dir, 2, 16)
	drop(t, dir)
	items, err := Plan(dir)
	if err != nil {
		t.Fatal(err)
	}
	w := newWarmer(t, WithChunk(1<<20), WithLookahead(16<<20), withChunkHook(func(r *Run, i int) {
		if i == 1 {
			for _, it := range items { // the consumer reads everything
				b, err := os.ReadFile(filepath.Join(dir, it.File))
				if err != nil || len(b) == 0 {
					t.Errorf("consumer read %s: %v", it.File, err)
				}
			}
		}
	}))
	res, err := w.Warm(context.Background(), Request{Key: "m@1", Dir: dir, Caller: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Reason != Overtaken || res.Warmed+res.Resident > 16<<20 {
		t.Errorf("Result = %+v; want overtaken within the lookahead", res)
	}
}

// A consumer that reads the very chunk the warm is about to read, after
// the warm probed it, gets ahead of it too.
func TestWarmStopsWhenOvertakenAtItsCursor(t *testing.T) {
	dir := diskDir(t)
	warmtest.Model(t, dir, 1, 8)
	drop(t, dir)
	items, err := Plan(dir)
	if err != nil {
		t.Fatal(err)
	}
	names, cs := chunks(items, 1<<20)
	w := newWarmer(t, WithChunk(1<<20), WithLookahead(1<<20), withChunkHook(func(r *Run, i int) {
		if i == 6 { // the consumer reads chunk 6, probed cold at chunk 5
			f, err := os.Open(filepath.Join(dir, names[cs[6].file]))
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			if _, err := f.ReadAt(make([]byte, cs[6].len), cs[6].off); err != nil {
				t.Error(err)
			}
		}
	}))
	res, err := w.Warm(context.Background(), Request{Key: "m@1", Dir: dir, Caller: "test"})
	var before int64
	for _, c := range cs[:6] {
		before += c.len
	}
	if err != nil || res.Reason != Overtaken || res.Warmed+res.Resident != before {
		t.Errorf("Warm = %+v, %v; want overtaken at chunk 6, after %d bytes", res, err, before)
	}
}

func TestWarmStartsAreRateLimitedPerCaller(t *testing.T) {
	dir := diskDir(t)
	warmtest.File(t, filepath.Join(dir, "config.json"), "{}")
	gate := make(chan struct{})
	m := NewMetrics()
	w := newWarmer(t, WithStartRate(time.Hour, 2), WithMetrics(m), withChunkHook(func(*Run, int) { <-gate }))
	defer close(gate)
	ctx := context.Background()
	start := func(key, caller string) (bool, error) {
		_, joined, err := w.Start(ctx, Request{Key: key, Dir: dir, Caller: caller})
		return joined, err
	}
	for _, key := range []string{"k1", "k2"} {
		if _, err := start(key, "uid:1000"); err != nil {
			t.Fatalf("start %s: %v", key, err)
		}
	}
	if _, err := start("k3", "uid:1000"); !errors.Is(err, ErrRateLimited) {
		t.Errorf("a third start within the hour = %v, want ErrRateLimited", err)
	}
	if joined, err := start("k1", "uid:1000"); err != nil || !joined {
		t.Errorf("joining a running warm = joined %v, %v; want a free join", joined, err)
	}
	if _, err := start("k3", "uid:1001"); err != nil {
		t.Errorf("another caller's start = %v", err)
	}
	if got := testutil.ToFloat64(m.Warms.WithLabelValues("refused")); got != 1 {
		t.Errorf("modelcache_warms_total{outcome=refused} = %v, want 1", got)
	}
}

func TestWarmOfABadTreeFails(t *testing.T) {
	dir := diskDir(t)
	warmtest.File(t, filepath.Join(dir, "config.json"), "{}")
	if err := os.Symlink("/etc/hostname", filepath.Join(dir, "model.safetensors")); err != nil {
		t.Fatal(err)
	}
	w := newWarmer(t)
	res, err := w.Warm(context.Background(), Request{Key: "m@1", Dir: dir, Caller: "test"})
	if err != nil || res.Reason != Failed || !errors.Is(res.Err, ErrEscape) {
		t.Errorf("Warm = %+v, %v; want failed with ErrEscape", res, err)
	}
	if _, _, err := w.Start(context.Background(), Request{Dir: dir}); err == nil {
		t.Error("a request without a key was accepted")
	}
}

func TestOptionsRefuseNonsense(t *testing.T) {
	for name, o := range map[string]Option{
		"share 0":      WithShare(0),
		"share 1.5":    WithShare(1.5),
		"limit -1":     WithLimit(-1),
		"chunk 1000":   WithChunk(1000),
		"chunk 1 GiB":  WithChunk(1 << 30),
		"no rate":      WithStartRate(0, 1),
		"no burst":     WithStartRate(time.Second, 0),
		"lookahead -1": WithLookahead(-1),
	} {
		if _, err := New(o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestBudget(t *testing.T) {
	for _, tc := range []struct {
		share            float64
		available, model int64
		want             int64
	}{
		{0.25, 1000, 1 << 40, 250},
		{0.25, 1000, 100, 100},
		{1, 1000, 5000, 1000},
	} {
		if got, err := Budget(tc.share, tc.available, tc.model); err != nil || got != tc.want {
			t.Errorf("Budget(%v, %d, %d) = %d, %v; want %d", tc.share, tc.available, tc.model, got, err, tc.want)
		}
	}
	if _, err := Budget(0, 1000, 1000); err == nil {
		t.Error("a share of 0 was accepted")
	}
}

func TestParseMemAvailable(t *testing.T) {
	got, err := parseMemAvailable([]byte("MemTotal:       24000000 kB\nMemFree:  1 kB\nMemAvailable:   22000000 kB\n"))
	if err != nil || got != 22000000*1024 {
		t.Errorf("parse = %d, %v", got, err)
	}
	for _, bad := range []string{"MemTotal: 1 kB\n", "MemAvailable: 12 MB\n", "MemAvailable: -5 kB\n", "MemAvailable: 99999999999999999999 kB\n"} {
		if _, err := parseMemAvailable([]byte(bad)); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
	if n, err := MemAvailable(); err != nil || n <= 0 {
		t.Errorf("MemAvailable() = %d, %v", n, err)
	}
}

// withDevice gives warms a fake device counter and short waits.
func withDevice(dev devCounter) Option {
	return func(c *config) error {
		c.device = func(int) devCounter { return dev }
		c.yieldWindow, c.yieldMax = time.Millisecond, 4*time.Millisecond
		return nil
	}
}

// A warm waits while others use the device, and goes on once they stop.
func TestWarmYieldsToOtherIO(t *testing.T) {
	dir := diskDir(t)
	warmtest.Model(t, dir, 1, 8)
	drop(t, dir)
	var mu sync.Mutex
	var counter uint64
	busy := 0 // calls left that see another process's I/O
	calls := 0
	dev := func() (uint64, error) {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if busy > 0 {
			busy--
			counter += 1 << 30
		}
		return counter, nil
	}
	var before int64
	w := newWarmer(t, WithChunk(1<<20), WithYield(1e6), withDevice(dev), withChunkHook(func(r *Run, i int) {
		if i == 4 {
			time.Sleep(2 * time.Millisecond) // a window ends before the next chunk
			mu.Lock()
			busy, calls = 3, 0
			mu.Unlock()
			before = r.Progress().Warmed
		}
	}))
	res, err := w.Warm(context.Background(), Request{Key: "m@1", Dir: dir, Caller: "test"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Reason != Done || res.Yielded <= 0 || calls < 4 || before == 0 {
		t.Errorf("Result = %+v after %d looks at the device; want done after waiting out 3 busy windows", res, calls)
	}

	// A device that stays busy holds the warm until its holder lets go.
	drop(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	w = newWarmer(t, WithChunk(1<<20), WithYield(1e6), withDevice(func() (uint64, error) {
		mu.Lock()
		defer mu.Unlock()
		counter += 1 << 30
		calls++
		if calls == 20 {
			cancel()
		}
		return counter, nil
	}), withChunkHook(func(r *Run, i int) {
		if i == 0 {
			time.Sleep(2 * time.Millisecond)
		}
	}))
	calls = 0
	run, _, err := w.Start(ctx, Request{Key: "m@1", Dir: dir, Caller: "test"})
	if err != nil {
		t.Fatal(err)
	}
	res, err = run.Wait(context.Background())
	if err != nil || res.Reason != Cancelled || res.Warmed+res.Resident > 1<<20 || res.Yielded <= 0 {
		t.Errorf("Warm on a busy device = %+v, %v; want cancelled before reading past its first chunk", res, err)
	}
}

func TestDeviceCounter(t *testing.T) {
	got, err := parseDevStat([]byte(" 2227400 527626 858242658 24732928 2908651 5100716 299590824 4283163 0 752760 29349347\n"))
	if err != nil || got != (858242658+299590824)*512 {
		t.Errorf("parseDevStat = %d, %v", got, err)
	}
	for _, bad := range []string{"", "1 2 3", "1 2 x 4 5 6 7"} {
		if _, err := parseDevStat([]byte(bad)); err == nil {
			t.Errorf("%q: accepted", bad)
		}
	}
	dir := diskDir(t)
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	unix.Fstat(fd, &st)
	p := fmt.Sprintf("/sys/dev/block/%d:%d/stat", unix.Major(st.Dev), unix.Minor(st.Dev))
	if _, err := os.Stat(p); err != nil {
		testenv.Missing(t, p, "run the tests on a filesystem on a block device")
		return
	}
	if dev := deviceOf(fd); dev == nil {
		t.Errorf("deviceOf(%s) = nil though %s exists", dir, p)
	}
}

func TestMetricsLint(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics()
	reg.MustRegister(m.Collectors()...)
	m.add(10, 5)
	m.finish(Result{Reason: Overtaken, Elapsed: time.Second})
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	if n, err := testutil.GatherAndCount(reg, "modelcache_warms_total"); err != nil || n != 6 {
		t.Errorf("modelcache_warms_total has %d series (%v), want one per outcome (6)", n, err)
	}
	var none *Metrics // a Warmer without metrics counts nothing, and does not panic
	none.add(1, 1)
	none.finish(Result{Reason: Done})
	none.refused()
}
