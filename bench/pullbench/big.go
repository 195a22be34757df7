package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers"
)

// genFile is a large file made in memory on the fly: a 16 MiB random
// block repeated. Its origin holds 16 MiB whatever the size, so a 4 GiB
// pull costs the bench no disk and no 4 GiB of memory.
type genFile struct {
	block []byte
	size  int64
	off   int64
}

func (g *genFile) Read(p []byte) (int, error) {
	if g.off >= g.size {
		return 0, io.EOF
	}
	i := g.off % int64(len(g.block))
	n := copy(p[:min(int64(len(p)), g.size-g.off)], g.block[i:])
	g.off += int64(n)
	return n, nil
}

func (g *genFile) Seek(off int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
		g.off = off
	case io.SeekCurrent:
		g.off += off
	case io.SeekEnd:
		g.off = g.size + off
	}
	return g.off, nil
}

// bigPull pulls one file of sizeMiB from an in-memory origin: the
// daemon's peak RSS and CPU per GB over the pull (one pull, one stream),
// then the same pull killed (SIGKILL) halfway and started again: the
// bytes fetched twice.
func bigPull(dir string, sizeMiB int64, canDrop bool) {
	size := sizeMiB << 20
	block := make([]byte, 16<<20)
	rand.NewChaCha8([32]byte{4}).Read(block)
	h := sha256.New()
	io.Copy(h, &genFile{block: block, size: size})
	sum := hex.EncodeToString(h.Sum(nil))
	var served atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(err)
	srv := &http.Server{Handler: countBytes(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("ETag", `"gen-`+sum[:16]+`"`)
		http.ServeContent(w, r, "big.safetensors", time.Time{}, &genFile{block: block, size: size})
	}), &served)}
	go srv.Serve(ln)
	defer srv.Close()
	uri := "http://" + ln.Addr().String() + "/big.safetensors#sha256=" + sum
	root, sock := filepath.Join(dir, "broot"), filepath.Join(dir, "b.sock")

	// Whole pull, -runs times, each into a fresh daemon: peak RSS (the
	// highest of the runs), CPU and throughput (medians; every run shown).
	var rates, cpus, rssAll, anons, walls []float64
	var stages []map[string]float64
	var idle int64
	for range *runs {
		d := startDaemon(root, sock, true)
		coldPrep(canDrop)
		idle = max(idle, d.peakRSS())
		cpu0 := d.cpuSeconds()
		t0 := time.Now()
		d.ctl("pull", uri, "--name", "big")
		el := time.Since(t0).Seconds()
		rates, walls = append(rates, float64(size)/el), append(walls, el)
		rssAll, anons = append(rssAll, float64(d.peakRSS())), append(anons, float64(d.status("RssAnon")))
		cpus = append(cpus, (d.cpuSeconds()-cpu0)/(float64(size)/1e9))
		stages = append(stages, d.stages())
		d.stop()
		os.RemoveAll(root)
	}
	m := medianIndex(rates) // the run whose stages are shown
	rss, cpu := int64(slices.Max(rssAll)), median(cpus)
	fmt.Printf("pull of one %s file from memory, %d runs: %.2f GB/s %v; daemon peak RSS %s (MiB: %v; idle before it at most %s; anonymous at the end, MiB: %v); CPU %.2f s per GB %v\n",
		api.FormatBytes(size), len(rates), median(rates)/1e9, gbps(rates), api.FormatBytes(rss), each(rssAll, 1<<20, "%.1f"), api.FormatBytes(idle), each(anons, 1<<20, "%.1f"), cpu, each(cpus, 1, "%.2f"))
	fmt.Printf("  where the seconds go (the median run): %s (wall %.2fs)\n", stageLine([]map[string]float64{stages[m]}), walls[m])
	addRow(fmt.Sprintf("daemon peak RSS during a %s pull (one stream)", api.FormatBytes(size)), api.FormatBytes(rss)+fmt.Sprintf(" (the highest of %d; %s idle)", len(rssAll), api.FormatBytes(idle)), "goal: < 64 MiB", fmt.Sprintf("%.2fx the goal", float64(rss)/float64(64<<20)))
	addRow("daemon CPU per GB, those pulls (O_DIRECT)", fmt.Sprintf("%.2f s (median of %d)", cpu, len(cpus)), "goal: ≤ 1.0 s", fmt.Sprintf("%.2fx the goal", cpu))

	// Killed halfway, started again.
	d := startDaemon(root, sock, true)
	before := served.Load()
	d.ctl("pull", uri, "--name", "big", "--no-wait")
	for served.Load()-before < size/2 {
		time.Sleep(5 * time.Millisecond)
	}
	// Stopped first, so that what the kernel holds is counted once the
	// origin can send no more, then killed.
	d.cmd.Process.Signal(syscall.SIGSTOP)
	time.Sleep(100 * time.Millisecond)
	inKernel := socketQueued(ln.Addr().(*net.TCPAddr).Port) // served, never read by the daemon
	d.cmd.Process.Signal(syscall.SIGKILL)
	d.cmd.Wait()
	first := served.Load() - before
	d = startDaemon(root, sock, true)
	d.ctl("pull", uri, "--name", "big")
	again := served.Load() - before - size
	d.stop()
	os.RemoveAll(root)
	lost := again - inKernel // read by the daemon, not yet on disk
	fmt.Printf("pull of %s killed (SIGKILL) after %s were served, then started again: %s fetched twice: %s in the kernel's socket buffers at the kill (Send-Q + Recv-Q), %s read by the daemon and not yet written\n",
		api.FormatBytes(size), api.FormatBytes(first), api.FormatBytes(again), api.FormatBytes(inKernel), api.FormatBytes(lost))
	addRow(fmt.Sprintf("restart of a half-done %s pull (SIGKILL at half)", api.FormatBytes(size)),
		fmt.Sprintf("%s fetched again: %s the daemon had read, %s in socket buffers", api.FormatBytes(again), api.FormatBytes(lost), api.FormatBytes(inKernel)),
		"goal: ≤ one chunk ("+api.FormatBytes(fetchers.DefaultChunk)+", a Range request)", fmt.Sprintf("%.2fx the goal (all: %.2fx)", float64(lost)/fetchers.DefaultChunk, float64(again)/fetchers.DefaultChunk))
}

// socketQueued is what the loopback connections to or from port hold in
// the kernel (/proc/net/tcp: the origin's Send-Q, the daemon's Recv-Q):
// bytes the origin has served that the daemon has not read.
func socketQueued(port int) int64 {
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return 0
	}
	var n int64
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		_, lp, _ := strings.Cut(f[1], ":")
		_, rp, _ := strings.Cut(f[2], ":")
		tx, rx, _ := strings.Cut(f[4], ":")
		p := fmt.Sprintf("%04X", port)
		switch p {
		case lp: // the origin's side: what it has sent and not had acknowledged, or not sent
			v, _ := strconv.ParseInt(tx, 16, 64)
			n += v
		case rp: // the daemon's side: what arrived and was not read
			v, _ := strconv.ParseInt(rx, 16, 64)
			n += v
		}
	}
	return n
}
