// Command pullbench measures modelcached against the tools people use
// today, in one run on one machine, and prints ratios (absolute numbers
// drift on shared machines; ratios measured side by side do not).
//
//	go run ./bench/pullbench -bin bin [-size-mib 2048] [-runs 3]
//
// It serves a synthetic model (four shards + small JSON files) from a
// loopback HTTP server and alternates: curl -o of the files, modelctl pull
// with O_DIRECT, modelctl pull buffered — dropping the page cache before
// each cold run when it may (root). Then: a second artifact of the same
// files (bytes fetched, time); materializing a tree vs cp -r; the daemon's
// peak RSS and CPU per GB; modelctl list with 10,000 artifacts in the
// index; daemon restart time with them.
//
// Where to find what:
//
//	main.go         flags, the daemons it starts, the http, hf, oci and s3
//	                scenarios, dedup, materialize vs cp -r, list and restart
//	big.go          the one-file pull from an in-memory origin: peak RSS, CPU
//	                per GB, and the restart of a pull killed halfway
//	kernelcache.go  a signed kernel cache: modelctl pull vs crane export | tar -x
//	reference.go    the reference pipeline, the verified pull the http row
//	                compares with (run as "pullbench reference")
//	table.go        the summary table that ends a run
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/s3/manager"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/capacity"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
	"github.com/modelcache/modelcache/internal/testenv"
)

type file struct {
	name string
	size int64
	sha  string
}

var (
	binDir  = flag.String("bin", "bin", "directory with modelcached and modelctl")
	baseBin = flag.String("base-bin", os.Getenv("BENCH_BASE_BIN"), "another build's directory (e.g. main's): the hf, oci, s3 and kernelcache scenarios alternate its pulls with -bin's and print the ratio; env BENCH_BASE_BIN")
	sizeMiB = flag.Int64("size-mib", envInt("BENCH_SIZE_MIB", 2048), "model size in MiB (four shards); env BENCH_SIZE_MIB")
	runs    = flag.Int("runs", int(envInt("BENCH_RUNS", 3)), "alternating runs of each pull variant; env BENCH_RUNS")
	bigMiB  = flag.Int64("big-mib", envInt("BENCH_BIG_MIB", 4096), "size of the one-file pull for peak RSS and the kill/restart test; env BENCH_BIG_MIB")
	nArts   = flag.Int("artifacts", int(envInt("BENCH_ARTIFACTS", 10000)), "artifacts in the index for the list/restart test")
	only    = flag.String("only", os.Getenv("BENCH_ONLY"), "run one scenario: http, big, kernelcache, list, hf, oci or s3 (default: all); env BENCH_ONLY")
	workDir = flag.String("dir", os.Getenv("BENCH_DIR"), "scratch directory (default: a temp dir on the same filesystem as /var/tmp)")
)

func envInt(k string, def int64) int64 {
	if v, err := strconv.ParseInt(os.Getenv(k), 10, 64); err == nil {
		return v
	}
	return def
}

// cleanup runs, last first, when must ends the bench on an error (the
// deferred calls do not run on os.Exit): it stops the daemons started,
// unmounts the origins' tmpfs and removes the scratch directory, so a
// failed run leaves no daemon or mount behind.
var cleanup []func()

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "pullbench:", err)
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
		os.Exit(1)
	}
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "reference" {
		referenceMain(os.Args[2:])
		return
	}
	flag.Parse()
	dir := *workDir
	if dir == "" {
		d, err := os.MkdirTemp("/var/tmp", "pullbench-")
		must(err)
		dir = d
	}
	defer os.RemoveAll(dir)
	cleanup = append(cleanup, func() { os.RemoveAll(dir) })
	fmt.Printf("pullbench: model %d MiB in 4 shards + 2 JSON files, %d alternating runs, scratch %s\n", *sizeMiB, *runs, dir)
	canDrop := dropCaches() == nil
	if !canDrop {
		fmt.Println("note: cannot drop the page cache (not root): cold runs are warm on the server side")
	}

	origin := originDir(dir)
	defer syscall.Unmount(origin, 0)
	cleanup = append(cleanup, func() { syscall.Unmount(origin, 0) })

	switch *only {
	case "", "http":
	case "big":
		bigPull(dir, *bigMiB, canDrop)
		printTable()
		return
	case "kernelcache":
		kernelCacheBench(dir, origin, canDrop)
		printTable()
		return
	case "list":
		listAndRestart(dir, *nArts)
		printTable()
		return
	case "s3", "hf", "oci":
		src := filepath.Join(origin, "src")
		files := makeModel(src, *sizeMiB<<20)
		map[string]func(dir, src string, files []file, canDrop bool){"s3": s3Bench, "hf": hfBench, "oci": ociBench}[*only](dir, src, files, canDrop)
		printTable()
		return
	default:
		must(fmt.Errorf("-only %q: the scenarios that run alone are http, big, kernelcache, list, hf, oci and s3", *only))
	}
	src := filepath.Join(origin, "src")
	files := makeModel(src, *sizeMiB<<20)
	if *only == "http" {
		httpBench(dir, src, files, canDrop)
		printTable()
		return
	}
	httpBench(dir, src, files, canDrop)
	defer printTable()
	bigPull(dir, *bigMiB, canDrop)

	hfBench(dir, src, files, canDrop)
	ociBench(dir, src, files, canDrop)
	s3Bench(dir, src, files, canDrop)
	kernelCacheBench(dir, origin, canDrop)
	materializeVsCp(dir, src, files)
	listAndRestart(dir, *nArts)
}

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

// originDir is where the origins keep their data: a tmpfs under dir
// (root only), so that an origin serves from memory as a real one across
// the network would, and the node's disk carries only the pull's writes.
// The model and one origin's copy of it fit (2 × size + slack). Without
// root it is a plain directory and the run says so.
func originDir(dir string) string {
	o := filepath.Join(dir, "origin")
	must(os.MkdirAll(o, 0o755))
	size := fmt.Sprintf("size=%dm", 2**sizeMiB+512)
	if err := syscall.Mount("tmpfs", o, "tmpfs", 0, size); err != nil {
		fmt.Printf("note: origins serve from the same disk as the store (tmpfs: %v): cold reads of the origin share the disk\n", err)
	} else {
		fmt.Printf("origins serve from tmpfs (%s); the store is on %s\n", size, dir)
	}
	return o
}

func gbps(xs []float64) []string { return each(xs, 1e9, "%.2f") }

// each formats every x/unit with format: the runs behind a median.
func each(xs []float64, unit float64, format string) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = fmt.Sprintf(format, x/unit)
	}
	return out
}

// medianIndex is the index of the median of xs (the lower one for an even
// count).
func medianIndex(xs []float64) int {
	idx := make([]int, len(xs))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return xs[idx[a]] < xs[idx[b]] })
	return idx[(len(idx)-1)/2]
}

func ratios(a, b []float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = a[i] / b[i]
	}
	return out
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func dropCaches() error {
	syscall.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
}

func coldPrep(can bool) {
	if can {
		dropCaches()
	}
}

// makeModel writes four shards of pseudo-random bytes and two JSON files.
func makeModel(dir string, size int64) []file {
	must(os.MkdirAll(dir, 0o755))
	var out []file
	rng := rand.NewChaCha8([32]byte{1, 2, 3})
	buf := make([]byte, 4<<20)
	for i := 1; i <= 4; i++ {
		name := fmt.Sprintf("model-%05d-of-00004.safetensors", i)
		f, err := os.Create(filepath.Join(dir, name))
		must(err)
		h := sha256.New()
		left := size / 4
		for left > 0 {
			n := min(int64(len(buf)), left)
			rng.Read(buf[:n])
			f.Write(buf[:n])
			h.Write(buf[:n])
			left -= n
		}
		must(f.Close())
		out = append(out, file{name, size / 4, hex.EncodeToString(h.Sum(nil))})
	}
	for _, j := range []struct{ name, body string }{
		{"config.json", `{"architectures":["LlamaForCausalLM"],"torch_dtype":"bfloat16"}`},
		{"model.safetensors.index.json", `{"metadata":{"total_size":` + strconv.FormatInt(size, 10) + `}}`},
	} {
		must(os.WriteFile(filepath.Join(dir, j.name), []byte(j.body), 0o644))
		s := sha256.Sum256([]byte(j.body))
		out = append(out, file{j.name, int64(len(j.body)), hex.EncodeToString(s[:])})
	}
	return out
}

func countBytes(h http.Handler, n *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&hubtest.CountingWriter{ResponseWriter: w, N: n}, r)
	})
}

// daemonArgs are extra modelcached flags for the next startDaemon.
var daemonArgs []string

// useBase makes startDaemon run -base-bin's build.
var useBase bool

// baseToo runs pull, and (with -base-bin) the same with the base build,
// appending each throughput (or time) to its list. The two take turns at
// going first: the one that follows the peer's run pays for it
// (docs/benchmarks.md has the runs that showed it).
func baseToo(mc, base *[]float64, pull func() float64) {
	if *baseBin == "" {
		*mc = append(*mc, pull())
		return
	}
	withBase := func() float64 {
		useBase = true
		defer func() { useBase = false }()
		return pull()
	}
	if len(*mc)%2 == 1 {
		*base = append(*base, withBase())
		*mc = append(*mc, pull())
		return
	}
	*mc = append(*mc, pull())
	*base = append(*base, withBase())
}

// printBase says how -bin's build did against -base-bin's, alternated in
// this run; higherBetter is false for times.
func printBase(title string, mc, base []float64, higherBetter bool) {
	if len(base) == 0 {
		return
	}
	r := median(ratios(mc, base))
	if !higherBetter {
		r = median(ratios(base, mc))
	}
	fmt.Printf("  %s: this build vs the base build (%s): %.2fx faster (median of the runs' ratios; this %v, base %v)\n", title, *baseBin, r, secsOrGB(mc, higherBetter), secsOrGB(base, higherBetter))
}

func secsOrGB(xs []float64, gbs bool) []string {
	if gbs {
		return gbps(xs)
	}
	return secs(xs)
}

type daemon struct {
	bin     string
	cmd     *exec.Cmd
	socket  string
	metrics string // host:port of /metrics
	start   time.Duration
}

func startDaemon(root, sock string, direct bool, env ...string) *daemon {
	t0 := time.Now()
	maddr, err := testenv.FreeAddr()
	must(err)
	bin := *binDir
	if useBase {
		bin = *baseBin
	}
	cmd := exec.Command(filepath.Join(bin, "modelcached"), "--root", root, "--socket", sock,
		"--metrics-addr", maddr, "--models-dir", "", "--socket-group", "", "--log-level", "warn",
		"--direct-io="+strconv.FormatBool(direct), "--max-concurrent-pulls", strconv.Itoa(concurrentPulls))
	cmd.Args = append(cmd.Args, daemonArgs...)
	cmd.Args = append(cmd.Args, strings.Fields(os.Getenv("BENCH_DAEMON_ARGS"))...)
	cmd.Stderr = os.Stderr
	cmd.Env = append(os.Environ(), env...)
	cmd.Env = append(cmd.Env, strings.Fields(os.Getenv("BENCH_DAEMON_ENV"))...)
	must(cmd.Start())
	cleanup = append(cleanup, func() { cmd.Process.Kill() })
	c := &api.Client{Socket: sock}
	for c.Health(context.Background()) != nil {
		if time.Since(t0) > 60*time.Second {
			must(fmt.Errorf("daemon did not start"))
		}
		time.Sleep(2 * time.Millisecond)
	}
	return &daemon{bin: bin, cmd: cmd, socket: sock, metrics: maddr, start: time.Since(t0)}
}

// stages reads the daemon's modelcache_pull_stage_seconds sums: seconds
// spent in each stage of its pulls so far.
func (d *daemon) stages() map[string]float64 {
	out := map[string]float64{}
	resp, err := http.Get("http://" + d.metrics + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), `modelcache_pull_stage_seconds_sum{stage="`)
		if !ok {
			continue
		}
		name, v, ok := strings.Cut(rest, `"} `)
		if f, err := strconv.ParseFloat(v, 64); ok && err == nil {
			out[name] = f
		}
	}
	return out
}

// stageOrder is how the bench prints the stages (the daemon's labels).
var stageOrder = []string{"resolve", "read", "buffer_wait", "hash", "write", "fsync", "commit", "archive_check", "unpack", "publish"}

// stageLine says where a pull's seconds went, from the daemon's own
// histogram: the sums over its files (read, hash and write overlap).
func stageLine(st []map[string]float64) string {
	var b strings.Builder
	for _, k := range stageOrder {
		var xs []float64
		for _, m := range st {
			xs = append(xs, m[k])
		}
		fmt.Fprintf(&b, " %s %.2fs", k, median(xs))
	}
	return strings.TrimSpace(b.String())
}

func (d *daemon) stop() {
	d.cmd.Process.Signal(syscall.SIGTERM)
	d.cmd.Wait()
}

func (d *daemon) ctl(args ...string) []byte {
	cmd := exec.Command(filepath.Join(d.bin, "modelctl"), append([]string{"--socket", d.socket}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		must(fmt.Errorf("modelctl %v: %v: %s", args, err, stderr.String()))
	}
	return out
}

// pullAll pulls each file as an artifact (an http source is one file):
// all queued at once, then waited for, as the files of one model are
// fetched side by side (--max-concurrent-pulls 4, like --files-per-pull).
func pullAll(d *daemon, base string, files []file, prefix string) {
	for i, f := range files {
		d.ctl("pull", base+"/"+f.name+"#sha256="+f.sha, "--name", fmt.Sprintf("%s-%d", prefix, i), "--no-wait")
	}
	for i := range files {
		d.ctl("wait", fmt.Sprintf("%s-%d", prefix, i), "--timeout", "10m")
	}
}

func (d *daemon) status(key string) int64 {
	fh, err := os.Open(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), key+":"); ok {
			f := strings.Fields(rest)
			n, _ := strconv.ParseInt(f[0], 10, 64)
			return n << 10
		}
	}
	return 0
}

func (d *daemon) peakRSS() int64 { return d.status("VmHWM") }

func (d *daemon) cpuSeconds() float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", d.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
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

// materializeVsCp times building a tree of hardlinks for the model against
// cp -r of the same files, alternating.
func materializeVsCp(dir, src string, files []file) {
	root := filepath.Join(dir, "mroot")
	st, _, err := cachestore.Open(context.Background(), root)
	must(err)
	defer func() { st.Close(); os.RemoveAll(root) }()
	var m cachestore.Manifest
	for _, f := range files {
		fh, err := os.Open(filepath.Join(src, f.name))
		must(err)
		d, err := st.Ingest(context.Background(), f.name, fh, f.size, "sha256:"+f.sha)
		fh.Close()
		must(err)
		m = append(m, cachestore.Entry{Path: f.name, Digest: d, Size: f.size})
	}
	var mat, cp []float64
	for i := 0; i < 5; i++ {
		t0 := time.Now()
		_, err := st.CommitVersion(context.Background(), cachestore.VersionSpec{Name: fmt.Sprintf("tree-%d", i), Revision: "r", Manifest: m})
		must(err)
		mat = append(mat, time.Since(t0).Seconds())
		dst := filepath.Join(dir, fmt.Sprintf("cp-%d", i))
		t0 = time.Now()
		must(exec.Command("cp", "-r", src, dst).Run())
		syscall.Sync()
		cp = append(cp, time.Since(t0).Seconds())
		os.RemoveAll(dst)
	}
	fmt.Printf("materialize %d-file tree (hardlinks + rename + fsync + index): %.2f ms; cp -r (+sync): %.0f ms; %.0fx faster\n",
		len(files), median(mat)*1e3, median(cp)*1e3, median(cp)/median(mat))
	addRow("materialize a model tree from the store", fmt.Sprintf("%.2f ms", median(mat)*1e3), fmt.Sprintf("cp -r + sync %.0f ms", median(cp)*1e3), fmt.Sprintf("%.3fx time", median(mat)/median(cp)))

	// Commit of one blob: rename + directory fsync.
	var blob []float64
	for i := 0; i < 20; i++ {
		b := []byte(fmt.Sprintf("blob-%d-%d", i, time.Now().UnixNano()))
		w, err := st.Writer(context.Background(), cachestore.WriterOpts{Ref: string(b), Size: int64(len(b))})
		must(err)
		w.Write(b)
		t0 := time.Now()
		_, err = w.Commit(context.Background(), int64(len(b)), "")
		must(err)
		blob = append(blob, time.Since(t0).Seconds())
	}
	fmt.Printf("commit of one small blob (fsync, verify, rename, dir fsync, index): %.2f ms median\n", median(blob)*1e3)
}

// evictionPass times the capacity work over the seeded index: the
// periodic pass with no pressure (summaries only), and the planning an
// admission does (every manifest read, the evictable total computed).
func evictionPass(st *cachestore.Store) {
	e := &capacity.Evictor{Policy: capacity.DefaultPolicy(), Store: st, FS: st, Now: time.Now}
	var idle, plan []float64
	for i := 0; i < 5; i++ {
		t0 := time.Now()
		_, err := e.Run(context.Background(), capacity.Pass{})
		must(err)
		idle = append(idle, time.Since(t0).Seconds())
		t0 = time.Now()
		in, err := e.Inputs()
		must(err)
		in.Now = in.Now.Add(time.Hour) // everything old enough
		capacity.Evictable(in)
		plan = append(plan, time.Since(t0).Seconds())
	}
	fmt.Printf("eviction over %d artifacts: periodic pass without pressure %.1f ms; admission planning (read all manifests, plan, evictable total) %.0f ms\n",
		len(mustList(st)), median(idle)*1e3, median(plan)*1e3)
}

func mustList(st *cachestore.Store) []cachestore.Artifact {
	l, err := st.ListSummaries()
	must(err)
	return l
}

// concurrentPulls is the daemon's --max-concurrent-pulls in the bench:
// the http scenario's files are fetched this many at once.
const concurrentPulls = 4

// listAndRestart fills an index with n artifacts, then times the daemon's
// start and modelctl list.
func listAndRestart(dir string, n int) {
	root := filepath.Join(dir, "lroot")
	st, _, err := cachestore.Open(context.Background(), root)
	must(err)
	t0 := time.Now()
	for i := 0; i < n; i++ {
		b := []byte(fmt.Sprintf(`{"artifact":%d}`, i))
		d, err := st.Ingest(context.Background(), "x", bytes.NewReader(b), int64(len(b)), "")
		must(err)
		_, err = st.CommitVersion(context.Background(), cachestore.VersionSpec{Name: fmt.Sprintf("model-%05d", i), Source: "file:///seed", Manifest: cachestore.Manifest{
			{Path: "config.json", Digest: d, Size: int64(len(b))},
		}})
		must(err)
	}
	seed := time.Since(t0)
	evictionPass(st)
	st.Close()
	sock := filepath.Join(dir, "l.sock")
	var starts, lists, listsTable []float64
	for i := 0; i < 3; i++ {
		d := startDaemon(root, sock, true)
		starts = append(starts, d.start.Seconds())
		for j := 0; j < 3; j++ {
			t0 := time.Now()
			out := d.ctl("-o", "json", "list")
			lists = append(lists, time.Since(t0).Seconds())
			if j == 0 && i == 0 && bytes.Count(out, []byte(`"name"`)) < n {
				must(fmt.Errorf("list returned fewer than %d artifacts", n))
			}
			t0 = time.Now()
			d.ctl("list")
			listsTable = append(listsTable, time.Since(t0).Seconds())
		}
		d.stop()
	}
	fmt.Printf("%d artifacts in the index (seeded in %s): daemon start to healthy %.0f ms; modelctl -o json list %.0f ms; modelctl list (table) %.0f ms\n",
		n, seed.Round(time.Second), median(starts)*1e3, median(lists)*1e3, median(listsTable)*1e3)
	addRow(fmt.Sprintf("%d artifacts: daemon start / modelctl list", n), fmt.Sprintf("%.0f ms / %.0f ms", median(starts)*1e3, median(listsTable)*1e3),
		"goal: start < 1 s, list < 100 ms", fmt.Sprintf("%.2fx / %.2fx the goal", median(starts), median(listsTable)*1e3/100))
	_ = io.Discard
}

// hfBench serves the model from the test hub (LFS shards redirect to a
// CDN origin) and alternates modelctl pull hf://, the official JS client's
// snapshotDownload, and curl -L of the resolve URLs. Then a revision that
// changes one shard of four: the bytes fetched.
func hfBench(dir, src string, files []file, canDrop bool) {
	hub := hubtest.New()
	defer hub.Close()
	model := map[string][]byte{}
	var total int64
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(src, f.name))
		must(err)
		model[f.name] = b
		total += int64(len(b))
	}
	sha := hub.Commit("bench/model", model, "main")
	node, nerr := exec.LookPath("node")
	js, _ := filepath.Abs("test/hfjs/check.mjs")
	if _, err := os.Stat(filepath.Join(filepath.Dir(js), "node_modules")); nerr == nil && err != nil {
		nerr = err
	}
	if nerr != nil {
		fmt.Printf("hf: the official JS client is not installed (cd test/hfjs && npm ci): %v\n", nerr)
	}
	timed := func(run func()) (float64, float64) {
		coldPrep(canDrop)
		t0 := time.Now()
		run()
		a := time.Since(t0).Seconds()
		syscall.Sync()
		return float64(total) / a, float64(total) / time.Since(t0).Seconds()
	}
	var mc, mcBase, mc1, jsNo, jsSync, curlNo, curlSync, getsPerPull []float64
	for i := 0; i < *runs; i++ {
		daemonArgs = []string{"--range-connections", "1"}
		d := startDaemon(filepath.Join(dir, "hroot"), filepath.Join(dir, "h.sock"), true, "HF_ENDPOINT="+hub.URL(), "HF_TOKEN=")
		_, x := timed(func() { d.ctl("pull", "hf://bench/model", "--name", "m") })
		mc1 = append(mc1, x)
		d.stop()
		os.RemoveAll(filepath.Join(dir, "hroot"))
		daemonArgs = nil
		baseToo(&mc, &mcBase, func() float64 {
			d := startDaemon(filepath.Join(dir, "hroot"), filepath.Join(dir, "h.sock"), true, "HF_ENDPOINT="+hub.URL(), "HF_TOKEN=")
			defer func() { d.stop(); os.RemoveAll(filepath.Join(dir, "hroot")) }()
			gets := hub.ResolveGets.Load()
			_, x := timed(func() { d.ctl("pull", "hf://bench/model", "--name", "m") })
			if !useBase {
				getsPerPull = append(getsPerPull, float64(hub.ResolveGets.Load()-gets))
			}
			return x
		})
		if i == *runs-1 {
			// One shard of four changes: only it is fetched again (and the small git files).
			d := startDaemon(filepath.Join(dir, "hroot"), filepath.Join(dir, "h.sock"), true, "HF_ENDPOINT="+hub.URL(), "HF_TOKEN=")
			d.ctl("pull", "hf://bench/model", "--name", "m")
			next := map[string][]byte{}
			for k, v := range model {
				next[k] = v
			}
			shard := files[1].name
			changed := append([]byte(nil), model[shard]...)
			changed[len(changed)/2] ^= 0xff
			next[shard] = changed
			hub.Commit("bench/model", next, "main")
			before := hub.Sent.Load()
			t0 := time.Now()
			d.ctl("pull", "hf://bench/model", "--name", "m")
			fmt.Printf("hf revision that changes 1 of 4 shards: %s fetched (the shard is %s), %s\n",
				api.FormatBytes(hub.Sent.Load()-before), api.FormatBytes(int64(len(changed))), time.Since(t0).Round(time.Millisecond))
			addRow("hf revision update (1 of 4 shards changed)", api.FormatBytes(hub.Sent.Load()-before)+" fetched", "the changed shard is "+api.FormatBytes(int64(len(changed))), fmt.Sprintf("%.2fx", float64(hub.Sent.Load()-before)/float64(len(changed))))
			d.stop()
			os.RemoveAll(filepath.Join(dir, "hroot"))
			hub.Commit("bench/model", model, "main") // the next run pulls what the peers pull
		}
		if nerr == nil {
			cache := filepath.Join(dir, "jscache")
			a, b := timed(func() {
				c := exec.Command(node, js, "download", hub.URL(), "bench/model", sha, cache)
				c.Dir = filepath.Dir(js)
				c.Stderr = os.Stderr
				must(c.Run())
			})
			jsNo, jsSync = append(jsNo, a), append(jsSync, b)
			os.RemoveAll(cache)
		}
		out := filepath.Join(dir, "hcurl")
		os.MkdirAll(out, 0o755)
		args := []string{"-sS", "--fail", "-L"}
		for _, f := range files {
			args = append(args, "-o", filepath.Join(out, f.name), hub.URL()+"/bench/model/resolve/"+sha+"/"+f.name)
		}
		a, b := timed(func() { must(exec.Command("curl", args...).Run()) })
		curlNo, curlSync = append(curlNo, a), append(curlSync, b)
		os.RemoveAll(out)
	}
	fmt.Printf("hf pull of %s from the loopback test hub (GB/s, median of %d):\n", api.FormatBytes(total), *runs)
	fmt.Printf("  modelctl pull hf:// (verified, fsynced)  %.2f  %v  default --range-connections (adaptive, up to 4 per shard): %v GETs of file content per pull\n", median(mc)/1e9, gbps(mc), getsPerPull)
	fmt.Printf("  modelctl pull hf://, --range-connections 1 %.2f  %v\n", median(mc1)/1e9, gbps(mc1))
	if len(jsNo) > 0 {
		fmt.Printf("  @huggingface/hub snapshotDownload       %.2f  %v (+sync %.2f)  modelctl vs it: %.2fx (vs +sync %.2fx)\n",
			median(jsNo)/1e9, gbps(jsNo), median(jsSync)/1e9, median(ratios(mc, jsNo)), median(ratios(mc, jsSync)))
		addRow("hf pull of "+api.FormatBytes(total)+" from the loopback hub, incl. sync", gb(median(mc)), "@huggingface/hub snapshotDownload + sync "+gb(median(jsSync)), fmt.Sprintf("%.2fx", median(ratios(mc, jsSync))))
	}
	fmt.Printf("  curl -L of the resolve URLs              %.2f  %v (+sync %.2f)  modelctl vs it: %.2fx (vs +sync %.2fx)\n",
		median(curlNo)/1e9, gbps(curlNo), median(curlSync)/1e9, median(ratios(mc, curlNo)), median(ratios(mc, curlSync)))
	printBase("hf pull", mc, mcBase, true)
	if len(mcBase) > 0 && len(jsSync) > 0 {
		fmt.Printf("  base build vs snapshotDownload + sync: %.2fx\n", median(ratios(mcBase, jsSync)))
	}
}

// alternate runs modelctl (a pull into a fresh daemon) and each peer
// command, *runs times, and prints throughputs and ratios.
func alternate(title, dir string, total int64, canDrop bool, env []string, uri string, peers map[string]func(out string)) {
	timed := func(run func()) float64 {
		coldPrep(canDrop)
		t0 := time.Now()
		run()
		syscall.Sync()
		return float64(total) / time.Since(t0).Seconds()
	}
	mc, base := []float64{}, []float64{}
	res := map[string][]float64{}
	for i := 0; i < *runs; i++ {
		baseToo(&mc, &base, func() float64 {
			d := startDaemon(filepath.Join(dir, "xroot"), filepath.Join(dir, "x.sock"), true, env...)
			defer func() { d.stop(); os.RemoveAll(filepath.Join(dir, "xroot")) }()
			return timed(func() { d.ctl("pull", uri, "--name", "m") })
		})
		for name, run := range peers {
			out := filepath.Join(dir, "peer")
			os.MkdirAll(out, 0o755)
			res[name] = append(res[name], timed(func() { run(out) }))
			os.RemoveAll(out)
		}
	}
	fmt.Printf("%s (GB/s incl. sync, median of %d):\n  modelctl pull  %.2f  %v\n", title, *runs, median(mc)/1e9, gbps(mc))
	for name, r := range res {
		fmt.Printf("  %-14s %.2f  %v  modelctl vs it: %.2fx\n", name, median(r)/1e9, gbps(r), median(ratios(mc, r)))
		addRow(title, gb(median(mc)), name+" "+gb(median(r)), fmt.Sprintf("%.2fx", median(ratios(mc, r))))
		if len(base) > 0 {
			fmt.Printf("  %-14s base build vs it: %.2fx\n", name, median(ratios(base, r)))
		}
	}
	printBase(title, mc, base, true)
}

// ociBench pushes the model as an ORAS artifact (raw layers) to Debian's
// docker-registry and compares modelctl pull oci:// with oras pull.
func ociBench(dir, src string, files []file, canDrop bool) {
	reg, err := testenv.Tool("docker-registry")
	oras, oerr := testenv.Tool("oras")
	if err != nil || oerr != nil {
		fmt.Println("oci: docker-registry or oras missing; skipped (see .ci/run)")
		return
	}
	host, stop, err := testenv.StartRegistry(reg, filepath.Dir(src)) // its data beside the model, on the origin tmpfs
	must(err)
	defer stop()
	args := []string{"push", "--plain-http", host + "/bench/model:v1"}
	var total int64
	for _, f := range files {
		args = append(args, f.name)
		total += f.size
	}
	push := exec.Command(oras, args...)
	push.Dir = src
	if out, err := push.CombinedOutput(); err != nil {
		must(fmt.Errorf("oras push: %v %s", err, out))
	}
	alternate("oci pull of "+api.FormatBytes(total)+" from docker-registry on loopback", dir, total, canDrop,
		[]string{}, "oci://"+host+"/bench/model:v1", map[string]func(string){
			"oras pull": func(out string) {
				c := exec.Command(oras, "pull", "--plain-http", "-o", out, host+"/bench/model:v1")
				if b, err := c.CombinedOutput(); err != nil {
					must(fmt.Errorf("oras pull: %v %s", err, b))
				}
			},
		})
}

// s3Bench puts the model into versitygw and compares modelctl pull s3://
// with curl of presigned URLs.
func s3Bench(dir, src string, files []file, canDrop bool) {
	gw, err := testenv.Tool("versitygw")
	if err != nil {
		fmt.Println("s3: versitygw missing; skipped (see .ci/run)")
		return
	}
	host, err := testenv.FreeAddr()
	must(err)
	data := filepath.Join(filepath.Dir(src), "s3data") // on the origin tmpfs
	os.MkdirAll(data, 0o755)
	cmd := exec.Command(gw, "--port", host, "posix", data)
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY=bench", "ROOT_SECRET_KEY=bench-secret-key")
	must(cmd.Start())
	defer func() { cmd.Process.Kill(); cmd.Wait(); os.RemoveAll(data) }()
	must(testenv.WaitTCP(host, 10*time.Second))
	ep := "http://" + host
	c := s3.New(s3.Options{Region: "us-east-1", BaseEndpoint: aws.String(ep), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider("bench", "bench-secret-key", "")})
	ctx := context.Background()
	_, err = c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String("models")})
	must(err)
	var total int64
	var urls []string
	pre := s3.NewPresignClient(c)
	for _, f := range files {
		fh, err := os.Open(filepath.Join(src, f.name))
		must(err)
		_, err = c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("models"), Key: aws.String("m/" + f.name), Body: fh, ChecksumAlgorithm: "SHA256"})
		fh.Close()
		must(err)
		total += f.size
		req, err := pre.PresignGetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("models"), Key: aws.String("m/" + f.name)})
		must(err)
		urls = append(urls, req.URL)
	}
	env := []string{"AWS_ENDPOINT_URL=" + ep, "AWS_ACCESS_KEY_ID=bench", "AWS_SECRET_ACCESS_KEY=bench-secret-key", "AWS_REGION=us-east-1"}
	alternate("s3 pull of "+api.FormatBytes(total)+" from versitygw on loopback", dir, total, canDrop, env, "s3://models/m/",
		map[string]func(string){
			"curl presigned": func(out string) {
				args := []string{"-sS", "--fail"}
				for i, u := range urls {
					args = append(args, "-o", filepath.Join(out, files[i].name), u)
				}
				must(exec.Command("curl", args...).Run())
			},
			// The AWS SDK's own downloader (parallel ranged GETs), no verification.
			"aws-sdk s3 manager": func(out string) {
				dl := manager.NewDownloader(c)
				for _, f := range files {
					fh, err := os.Create(filepath.Join(out, f.name))
					must(err)
					_, err = dl.Download(ctx, fh, &s3.GetObjectInput{Bucket: aws.String("models"), Key: aws.String("m/" + f.name)})
					fh.Close()
					must(err)
				}
			},
		})
}
