package main

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/capacity"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
)

// httpBench alternates curl -o (+ sync), the reference pipeline
// (reference.go) and modelctl pull of the four
// shards over plain HTTP, O_DIRECT and buffered; the origin is a Go file
// server over the model on tmpfs, so the node's disk holds only what is
// pulled, sending with sendfile(2) as file servers do, so that it takes
// little of the CPU the node under test shares with it.
func httpBench(dir, src string, files []file, canDrop bool) {
	var total int64
	for _, f := range files {
		total += f.size
	}
	var served atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(err)
	go http.Serve(ln, countBytes(http.FileServer(http.Dir(src)), &served))
	base := "http://" + ln.Addr().String()

	curlRes, curlNoSync, directRes, bufRes, refRes := []float64{}, []float64{}, []float64{}, []float64{}, []float64{}
	var rss, idleRSS, cpuPerGB, wall []float64
	var directStages, bufStages []map[string]float64
	for i := 0; i < *runs; i++ {
		// curl
		out := filepath.Join(dir, "curl")
		os.MkdirAll(out, 0o755)
		args := []string{"-sS", "--fail"}
		for _, f := range files {
			args = append(args, "-o", filepath.Join(out, f.name), base+"/"+f.name)
		}
		coldPrep(canDrop)
		t0 := time.Now()
		c := exec.Command("curl", args...)
		c.Stderr = os.Stderr
		must(c.Run())
		curlNoSync = append(curlNoSync, float64(total)/time.Since(t0).Seconds())
		// curl does not fsync; sync so both sides pay for getting bytes to disk
		// (modelcached fsyncs every blob before it is visible).
		syscall.Sync()
		curlRes = append(curlRes, float64(total)/time.Since(t0).Seconds())
		os.RemoveAll(out)

		// the reference pipeline (reference.go): verified and fsynced
		os.MkdirAll(out, 0o755)
		args = []string{"reference", out}
		for _, f := range files {
			args = append(args, base+"/"+f.name+"#sha256="+f.sha)
		}
		coldPrep(canDrop)
		t0 = time.Now()
		c = exec.Command(os.Args[0], args...)
		c.Stderr = os.Stderr
		must(c.Run())
		refRes = append(refRes, float64(total)/time.Since(t0).Seconds())
		os.RemoveAll(out)

		for _, direct := range []bool{true, false} {
			d := startDaemon(filepath.Join(dir, "root"), filepath.Join(dir, "mc.sock"), direct)
			coldPrep(canDrop)
			idle := d.peakRSS()
			cpu0 := d.cpuSeconds()
			t0 := time.Now()
			pullAll(d, base, files, "m")
			el := time.Since(t0).Seconds()
			if direct {
				directStages = append(directStages, d.stages())
				wall = append(wall, el)
				directRes = append(directRes, float64(total)/el)
				rss = append(rss, float64(d.peakRSS()))
				idleRSS = append(idleRSS, float64(idle))
				cpuPerGB = append(cpuPerGB, (d.cpuSeconds()-cpu0)/(float64(total)/1e9))
			} else {
				bufStages = append(bufStages, d.stages())
				bufRes = append(bufRes, float64(total)/el)
			}
			if i == *runs-1 && direct {
				secondArtifact(d, base, files, &served)
			}
			d.stop()
			os.RemoveAll(filepath.Join(dir, "root"))
		}
	}
	fmt.Println()
	fmt.Printf("cold pull of %s over loopback (GB/s, median of %d):\n", api.FormatBytes(total), *runs)
	fmt.Printf("  curl -o (no fsync)         %.2f  %v\n", median(curlNoSync)/1e9, gbps(curlNoSync))
	fmt.Printf("  curl -o + sync             %.2f  %v\n", median(curlRes)/1e9, gbps(curlRes))
	fmt.Printf("  reference pipeline         %.2f  %v  (verified, fsynced, the 4 files at once: what this machine allows a verified pull)\n", median(refRes)/1e9, gbps(refRes))
	fmt.Printf("  modelctl pull, O_DIRECT    %.2f  %v  vs curl+sync %.2fx, vs curl %.2fx, vs the reference %.2fx\n", median(directRes)/1e9, gbps(directRes), median(ratios(directRes, curlRes)), median(ratios(directRes, curlNoSync)), median(ratios(directRes, refRes)))
	fmt.Printf("  modelctl pull, buffered    %.2f  %v  vs curl+sync %.2fx, vs curl %.2fx\n", median(bufRes)/1e9, gbps(bufRes), median(ratios(bufRes, curlRes)), median(ratios(bufRes, curlNoSync)))
	// What each pull adds to the daemon: its writer's buffers and the
	// connection's, above the idle daemon (the 4 pulls run at once).
	perPull := (median(rss) - median(idleRSS)) / concurrentPulls
	fmt.Printf("  daemon peak RSS (O_DIRECT) %s, idle before it %s: %s per concurrent pull (%d at once); daemon CPU per GB %.2f s\n",
		api.FormatBytes(int64(median(rss))), api.FormatBytes(int64(median(idleRSS))), api.FormatBytes(int64(perPull)), concurrentPulls, median(cpuPerGB))
	fmt.Printf("  where the seconds go (daemon's modelcache_pull_stage_seconds, summed over the 4 shards, which run side by side; wall %.2fs):\n", median(wall))
	fmt.Printf("    O_DIRECT: %s\n    buffered: %s\n", stageLine(directStages), stageLine(bufStages))
	addRow("http pull of "+api.FormatBytes(total)+" (4 shards), cold, incl. sync", gb(median(directRes)), "curl -o + sync "+gb(median(curlRes)), fmt.Sprintf("%.2fx", median(ratios(directRes, curlRes))))
	addRow("http pull of "+api.FormatBytes(total)+" (4 shards), cold, incl. sync", gb(median(directRes)), "reference pipeline (verified, fsynced) "+gb(median(refRes)), fmt.Sprintf("%.2fx", median(ratios(directRes, refRes))))
	addRow("http pull of "+api.FormatBytes(total)+" (4 shards), cold, buffered (--direct-io=false)", gb(median(bufRes)), "curl -o + sync "+gb(median(curlRes)), fmt.Sprintf("%.2fx", median(ratios(bufRes, curlRes))))
	addRow(fmt.Sprintf("daemon RSS per concurrent pull (%d at once, O_DIRECT), above the idle daemon", concurrentPulls),
		fmt.Sprintf("%s (peak %s, idle %s)", api.FormatBytes(int64(perPull)), api.FormatBytes(int64(median(rss))), api.FormatBytes(int64(median(idleRSS)))),
		"a pull's own buffers: 2 × "+api.FormatBytes(writeBuffer()), fmt.Sprintf("%.2fx the buffers", perPull/float64(2*writeBuffer())))
}

// writeBuffer is the size of each of a pull's two buffers in the daemons
// the bench starts: --write-buffer-size in BENCH_DAEMON_ARGS, or the
// default.
func writeBuffer() int64 {
	args := strings.Fields(os.Getenv("BENCH_DAEMON_ARGS"))
	for i, a := range args {
		v, ok := strings.CutPrefix(a, "--write-buffer-size=")
		if !ok && a == "--write-buffer-size" && i+1 < len(args) {
			v, ok = args[i+1], true
		}
		if n, err := capacity.ParseBytes(v); ok && err == nil {
			return n
		}
	}
	return cachestore.DefaultWriteBuffer
}

func countBytes(h http.Handler, n *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&hubtest.CountingWriter{ResponseWriter: w, N: n}, r)
	})
}

func secondArtifact(d *daemon, base string, files []file, served *atomic.Int64) {
	before := served.Load()
	t0 := time.Now()
	pullAll(d, base, files, "again")
	el := time.Since(t0)
	fmt.Printf("second artifact set with the same %d files: %d bytes fetched, %s (%s per artifact, modelctl process included)\n",
		len(files), served.Load()-before, el.Round(time.Millisecond), (el / time.Duration(len(files))).Round(time.Microsecond))
	addRow("dedup: the same files as new artifacts", fmt.Sprintf("%d bytes fetched, %s per artifact", served.Load()-before, (el/time.Duration(len(files))).Round(time.Millisecond)), "goal: 0 bytes, < 100 ms", fmt.Sprintf("%.2fx the goal", el.Seconds()/float64(len(files))/0.1))
}
