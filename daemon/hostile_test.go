package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcache/modelcache/internal/testenv"

	"golang.org/x/sys/unix"

	"github.com/modelcache/modelcache/api"
)

// TestOneDownloadPerBlob pulls the same file under three names at once:
// the server sees one GET.
func TestOneDownloadPerBlob(t *testing.T) {
	w := data(2<<20, 40)
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	gate := make(chan struct{})
	srv.hook = func(rw http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodGet {
			<-gate
		}
		return false
	}
	cfg := testConfig(t)
	cfg.MaxConcurrentPulls = 3
	h := start(t, cfg)
	uri := srv.URL + "/w.bin#sha256=" + sha(w)
	for _, n := range []string{"a", "b", "c"} {
		if _, err := h.c.Pull(context.Background(), api.PullRequest{Name: n, URI: uri}, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"a", "b", "c"} {
		h.waitPhase(n, api.PhaseDownloading)
	}
	// All three reach the blob: one downloads it, two wait for its flight.
	testenv.Eventually(t, "two pulls wait for the blob's download", 30*time.Second, func() error {
		h.d.mu.Lock()
		defer h.d.mu.Unlock()
		waiting := 0
		for _, fw := range h.d.flights {
			waiting += fw.waiters
		}
		if waiting != 2 {
			return fmt.Errorf("%d wait", waiting)
		}
		return nil
	})
	close(gate)
	for _, n := range []string{"a", "b", "c"} {
		if _, err := h.c.Wait(context.Background(), n, 30*time.Second, nil); err != nil {
			t.Fatal(err)
		}
	}
	if g := srv.gets.Load(); g != 1 {
		t.Fatalf("the blob was fetched %d times for three artifacts, want 1", g)
	}
}

// TestTLSIsVerified: a server with a certificate no system root signed is
// refused, and the artifact says why.
func TestTLSIsVerified(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("x")) }))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	defer srv.Close()
	h := start(t, testConfig(t))
	_, err := h.pull(api.PullRequest{Name: "tls", URI: srv.URL + "/w.bin"})
	if !errors.Is(err, api.ErrFailed) || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("self-signed server: %v, want a Failed pull naming the certificate", err)
	}
}

// TestHostileFileNameFromURL: a URL whose last segment is ".." names no
// file the store may create.
func TestHostileFileNameFromURL(t *testing.T) {
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1); w.Write([]byte("x")) }))
	defer srv.Close()
	h := start(t, testConfig(t))
	_, err := h.pull(api.PullRequest{Name: "dots", URI: srv.URL + "/a/.."})
	if err == nil {
		t.Fatal("a file named '..' was accepted")
	}
	if _, err := lstatTree(h.cfg.Root, "dots"); err == nil {
		t.Fatal("a tree appeared")
	}
}

// TestDiskFull pulls into a store on a small tmpfs: the pull fails with a
// reason that says the disk is full, nothing is visible (not even the
// partial download), other artifacts stay intact, and once space is freed
// the pull succeeds.
func TestDiskFull(t *testing.T) {
	mnt := testenv.Tmpfs(t, "32m") // the budget (~26 MiB) is far beyond what the writer has in flight
	small, big := data(1<<20, 41), data(8<<20, 42)
	srv := newFileServer(t, map[string][]byte{"small.bin": small, "big.bin": big})
	// big.bin comes without a size (no HEAD, a chunked body), so admission
	// cannot refuse it up front; something else fills the disk after the
	// pull was admitted (before its budget is spent): the disk fills in the
	// middle of the pull.
	var fill sync.Once
	srv.hook = func(rw http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/big.bin" {
			return false
		}
		if r.Method == http.MethodHead {
			rw.WriteHeader(http.StatusMethodNotAllowed)
			return true
		}
		if r.Header.Get("Range") != "" {
			return false
		}
		fill.Do(func() {
			var st unix.Statfs_t
			if err := unix.Statfs(mnt, &st); err != nil {
				t.Error(err)
				return
			}
			if err := os.WriteFile(filepath.Join(mnt, "filler"), make([]byte, int64(st.Bavail)*st.Bsize-256<<10), 0o600); err != nil {
				t.Error(err)
			}
		})
		for off := 0; off < len(big); off += 1 << 20 {
			rw.Write(big[off : off+1<<20])
			rw.(http.Flusher).Flush()
		}
		return true
	}
	cfg := testConfig(t)
	cfg.Root = filepath.Join(mnt, "root")
	h := start(t, cfg)
	if _, err := h.pull(api.PullRequest{Name: "small", URI: srv.URL + "/small.bin#sha256=" + sha(small)}); err != nil {
		t.Fatal(err)
	}
	_, err := h.pull(api.PullRequest{Name: "big", URI: srv.URL + "/big.bin#sha256=" + sha(big)})
	if !errors.Is(err, api.ErrFailed) || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("pull onto a full disk: %v, want Failed naming a full disk", err)
	}
	if _, err := lstatTree(cfg.Root, "big"); err == nil {
		t.Fatal("a partial tree is visible")
	}
	if ents, _ := os.ReadDir(filepath.Join(cfg.Root, "ingest")); len(ents) != 0 {
		t.Fatalf("%d partial downloads left on the full disk", len(ents))
	}
	if h.read("small", "small.bin") != string(small) {
		t.Fatal("the other artifact was damaged")
	}
	if out, err := exec.Command("mount", "-o", "remount,size=64m", mnt).CombinedOutput(); err != nil {
		t.Fatalf("remount: %v %s", err, out)
	}
	a, err := h.c.Wait(context.Background(), "big", 30*time.Second, nil)
	for err != nil && errors.Is(err, api.ErrFailed) { // the next retry comes within RetryMax
		a, err = h.c.Wait(context.Background(), "big", 30*time.Second, nil)
		if err != nil {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if err != nil || a.Phase != api.PhaseReady || h.read("big", "big.bin") != string(big) {
		t.Fatalf("after freeing space: %+v %v", a, err)
	}
}
