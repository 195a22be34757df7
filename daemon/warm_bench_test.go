package daemon

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/warm"
	"github.com/modelcache/modelcache/warm/warmtest"
)

// BenchmarkWarmCSI is warming as a pod meets it, through the daemon and
// its CSI driver (warm's BenchmarkWarm measures the package alone). A
// model of safetensors shards (WARM_BENCH_MIB, default 2048, in 4
// shards) is pulled into the store; each iteration then runs, in
// alternating order:
//
//   - reader: the revision's page cache dropped, a volume of it is
//     published (volume attribute warm "true" or "false"), a reader starts
//     WARM_BENCH_DELAY after the publish (default 5s, as a server after
//     its imports) and reads every file through the mount in loader order
//     (warm.Plan); the volume is unpublished. speedup-x is the reader's
//     time cold over its time warmed.
//   - pull: the page cache dropped, a volume published (warm on, off,
//     off, on), then a pull through the socket of a file:// source of
//     WARM_BENCH_PULL_MIB (default 1024; its own pages kept hot, so the
//     pull's cost is the store's writes), evicted after. pull-ratio is
//     its throughput beside the warm over alone (1 = no effect).
//
// It needs root (bind mounts) and a disk-backed TMPDIR.
func BenchmarkWarmCSI(b *testing.B) {
	size := warmtest.EnvInt(b, "WARM_BENCH_MIB", 2048)
	pullMiB := warmtest.EnvInt(b, "WARM_BENCH_PULL_MIB", 1024)
	delay := warmtest.EnvDuration(b, "WARM_BENCH_DELAY", 5*time.Second)
	r := startCSI(b, csiConfig(b))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	src := b.TempDir()
	warmtest.Model(b, src, 4, size/4)
	if _, err := r.c.Pull(ctx, api.PullRequest{Name: "m", URI: "file://" + src}, true, nil); err != nil {
		b.Fatal(err)
	}
	os.RemoveAll(src)
	a, err := r.c.Get(ctx, "m")
	if err != nil {
		b.Fatal(err)
	}
	tree := r.d.store.TreePath(cachestore.KindModel, "m", a.Revision)
	items, err := warm.Plan(tree)
	if err != nil {
		b.Fatal(err)
	}
	pullSrc := filepath.Join(b.TempDir(), "pull.bin")
	f, err := os.Create(pullSrc)
	if err != nil {
		b.Fatal(err)
	}
	warmtest.Random(b, f, pullMiB<<20)
	f.Close()

	vols := 0
	// publish drops the revision's pages and publishes a volume of it; a
	// namespace per volume keeps the CSI callers' start rate out of it.
	publish := func(on bool) (target string, unpublish func() warm.Result) {
		if err := testenv.DropPageCache(tree); err != nil {
			b.Fatal(err)
		}
		vols++
		id := fmt.Sprintf("bench-%d", vols)
		target = r.target("uid-"+id, "model")
		if err := r.publish(id, target, map[string]string{"modelCache": "m", "warm": strconv.FormatBool(on), "csi.storage.k8s.io/pod.namespace": id}); err != nil {
			b.Fatal(err)
		}
		run := r.d.warming.w.Running("m@" + a.Revision)
		if on != (run != nil) {
			b.Fatalf("publish with warm %v: a warm running: %v", on, run != nil)
		}
		return target, func() warm.Result {
			var res warm.Result
			if run != nil {
				if res = run.Progress(); res.Reason == "" {
					res.Reason = "running"
				}
			}
			r.unpublishGone(id, target)
			return res
		}
	}
	read := func(on bool) time.Duration {
		target, unpublish := publish(on)
		time.Sleep(delay)
		start := time.Now()
		rd := &warmtest.Reader{Dir: target}
		for _, it := range items {
			if err := rd.Read(it.File, it.Offset, it.Length); err != nil {
				b.Fatal(err)
			}
		}
		rd.Close()
		d := time.Since(start)
		if res := unpublish(); on {
			b.Logf("warm before the reader: %s, %d of %d bytes warmed, %d resident, %v waiting for other I/O; the reader %v", res.Reason, res.Warmed, res.Total, res.Resident, res.Yielded.Round(time.Millisecond), d.Round(time.Millisecond))
		}
		return d
	}
	pull := func(on bool) time.Duration {
		if _, err := os.ReadFile(pullSrc); err != nil { // the source's pages hot
			b.Fatal(err)
		}
		_, unpublish := publish(on)
		start := time.Now()
		if _, err := r.c.Pull(ctx, api.PullRequest{Name: "p", URI: "file://" + pullSrc}, true, nil); err != nil {
			b.Fatal(err)
		}
		d := time.Since(start)
		if res := unpublish(); on {
			b.Logf("warm beside the pull: %s, %d bytes warmed, %v waiting for other I/O; the pull %v", res.Reason, res.Warmed, res.Yielded.Round(time.Millisecond), d.Round(time.Millisecond))
		}
		if _, err := r.c.Evict(ctx, "p", "", true); err != nil {
			b.Fatal(err)
		}
		return d
	}

	var cold, warmed, alone, beside time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for k := range 2 {
			if on := (i+k)%2 == 0; on {
				warmed += read(true)
			} else {
				cold += read(false)
			}
		}
		for k := range 4 { // on, off, off, on
			if on := k == 0 || k == 3; on {
				beside += pull(true)
			} else {
				alone += pull(false)
			}
		}
	}
	n := float64(b.N)
	b.ReportMetric(cold.Seconds()/n, "reader-cold-s")
	b.ReportMetric(warmed.Seconds()/n, "reader-warmed-s")
	b.ReportMetric(cold.Seconds()/warmed.Seconds(), "speedup-x")
	b.ReportMetric(float64(pullMiB<<20)/(alone.Seconds()/n/2)/1e6, "pull-alone-MB/s")
	b.ReportMetric(float64(pullMiB<<20)/(beside.Seconds()/n/2)/1e6, "pull-warming-MB/s")
	b.ReportMetric(alone.Seconds()/beside.Seconds(), "pull-ratio")
}
