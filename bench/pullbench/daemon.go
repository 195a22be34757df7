package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/internal/testenv"
)

type daemon struct {
	bin     string
	cmd     *exec.Cmd
	socket  string
	metrics string // host:port of /metrics
	start   time.Duration
}

// concurrentPulls is the daemon's --max-concurrent-pulls in the bench:
// the http scenario's files are fetched this many at once.
const concurrentPulls = 4

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
