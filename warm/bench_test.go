package warm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/warm/warmtest"
	"golang.org/x/sys/unix"
)

// The benchmark's model: a tree of safetensors shards on the disk, made
// once per test binary and removed by TestMain.
var benchModel struct {
	sync.Once
	dir   string
	items []Item
	err   error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if benchModel.dir != "" {
		os.RemoveAll(benchModel.dir)
	}
	os.Exit(code)
}

// BenchmarkWarm measures what warming buys a pod and costs a pull, on
// the disk, the page cache dropped before each run. Each iteration runs,
// in alternating order:
//
//   - reader: the model's page cache dropped, a reader starts after
//     WARM_BENCH_DELAY (default 2s; the server starts after 5s)
//     and reads every file in plan (loader) order; with warming, a warm
//     starts at the drop. speedup-x is the reader's time cold over its
//     time warmed.
//   - pull: a sequential writer (2 MiB writes, fdatasync every 64 MiB
//     and at the end, as the store's ingest does) of WARM_BENCH_PULL_MIB
//     (default 1024) into the same filesystem, beside a warm of the whole
//     (cold) model, alone, alone, beside. pull-ratio is its throughput
//     beside the warm over alone (1 = no effect).
//
// WARM_BENCH_MIB sizes the model (default 2048, in 4 shards);
// WARM_BENCH_DIR picks a disk-backed directory (default TMPDIR, else
// /var/tmp).
func BenchmarkWarm(b *testing.B) {
	size := warmtest.EnvInt(b, "WARM_BENCH_MIB", 2048)
	pullMiB := warmtest.EnvInt(b, "WARM_BENCH_PULL_MIB", 1024)
	delay := warmtest.EnvDuration(b, "WARM_BENCH_DELAY", 2*time.Second)
	benchModel.Do(func() {
		base, err := testenv.DiskBase(os.Getenv("WARM_BENCH_DIR"))
		if err != nil {
			benchModel.err = err
			return
		}
		d, err := os.MkdirTemp(base, "warm-bench-")
		if err != nil {
			benchModel.err = err
			return
		}
		benchModel.dir = d
		warmtest.Model(b, d, 4, size/4)
		benchModel.items, benchModel.err = Plan(d)
	})
	if benchModel.err != nil {
		b.Fatal(benchModel.err)
	}
	dir, items := benchModel.dir, benchModel.items
	total := Total(items)

	var cold, warm, alone, beside time.Duration
	var warmed int64
	var yielded time.Duration
	for i := 0; i < b.N; i++ {
		for k := range 2 {
			on := (i+k)%2 == 0
			d, res := benchReader(b, dir, items, delay, on)
			if on {
				warm += d
				warmed += res.Warmed
				yielded += res.Yielded
				b.Logf("warm before the reader: %s, %d of %d bytes warmed, %d resident, budget %d, %v waiting for other I/O", res.Reason, res.Warmed, res.Total, res.Resident, res.Budget, res.Yielded.Round(time.Millisecond))
			} else {
				cold += d
			}
		}
		for k := range 4 { // on, off, off, on: the second of two pulls in a row pays for the first's deletion
			on := k == 0 || k == 3
			d := benchPull(b, dir, pullMiB<<20, on)
			if on {
				beside += d
			} else {
				alone += d
			}
		}
	}
	n := float64(b.N)
	b.ReportMetric(cold.Seconds()/n, "reader-cold-s")
	b.ReportMetric(warm.Seconds()/n, "reader-warmed-s")
	b.ReportMetric(cold.Seconds()/warm.Seconds(), "speedup-x")
	b.ReportMetric(float64(warmed)/n/float64(total), "warmed-share")
	b.ReportMetric(yielded.Seconds()/n, "yielded-s")
	b.ReportMetric(float64(pullMiB<<20)/(alone.Seconds()/n/2)/1e6, "pull-alone-MB/s")
	b.ReportMetric(float64(pullMiB<<20)/(beside.Seconds()/n/2)/1e6, "pull-warming-MB/s")
	b.ReportMetric(alone.Seconds()/beside.Seconds(), "pull-ratio")
}

// benchReader drops the model's page cache, starts a warm if on, waits
// delay, and times a read of every item in plan order.
func benchReader(b *testing.B, dir string, items []Item, delay time.Duration, on bool) (time.Duration, Result) {
	stop := benchWarm(b, dir, on)
	time.Sleep(delay)
	start := time.Now()
	rd := &warmtest.Reader{Dir: dir}
	defer rd.Close()
	for _, it := range items {
		if err := rd.Read(it.File, it.Offset, it.Length); err != nil {
			b.Fatal(err)
		}
	}
	d := time.Since(start)
	return d, stop()
}

// benchWarm drops the model's page cache and, if on, starts a warm of
// it with the default options. stop ends the warm and returns its Result
// (the zero Result when off).
func benchWarm(b *testing.B, dir string, on bool) (stop func() Result) {
	drop(b, dir)
	if !on {
		return func() Result { return Result{} }
	}
	w, err := New()
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	run, _, err := w.Start(ctx, Request{Key: "bench", Dir: dir, Caller: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	return func() Result {
		cancel()
		res, _ := run.Wait(context.Background())
		w.Close()
		if res.Reason == Failed {
			b.Fatal(res.Err)
		}
		return res
	}
}

// benchPull times a sequential write of n bytes with fdatasync every
// 64 MiB and at the end, beside a warm of the cold model if on.
func benchPull(b *testing.B, dir string, n int64, on bool) time.Duration {
	stop := benchWarm(b, dir, on)
	p := filepath.Join(filepath.Dir(dir), fmt.Sprintf("%s.pull", filepath.Base(dir)))
	defer os.Remove(p)
	f, err := os.Create(p)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 2<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	start := time.Now()
	for at := int64(0); at < n; at += int64(len(buf)) {
		if _, err := f.Write(buf[:min(int64(len(buf)), n-at)]); err != nil {
			b.Fatal(err)
		}
		if (at+int64(len(buf)))%(64<<20) == 0 {
			if err := unix.Fdatasync(int(f.Fd())); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := unix.Fdatasync(int(f.Fd())); err != nil {
		b.Fatal(err)
	}
	d := time.Since(start)
	if res := stop(); on {
		b.Logf("warm beside the pull: %s, %d bytes warmed, %v waiting for other I/O, the pull %v", res.Reason, res.Warmed, res.Yielded.Round(time.Millisecond), d.Round(time.Millisecond))
	}
	return d
}
