package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
)

// checkReady: every Ready artifact's tree holds exactly its manifest's
// bytes. This is the invariant a crash must never break.
func checkReady(t *testing.T, e *env) {
	t.Helper()
	c := &api.Client{Socket: e.socket}
	list, err := c.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range list {
		if a.Phase != api.PhaseReady {
			continue
		}
		full, err := c.Get(context.Background(), a.Name)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range full.Versions[0].Files {
			fh, err := os.Open(filepath.Join(full.Path, f.Path))
			if err != nil {
				t.Fatalf("Ready artifact %s lacks %s: %v", a.Name, f.Path, err)
			}
			h := sha256.New()
			n, _ := io.Copy(h, fh)
			fh.Close()
			if n != f.Size || "sha256:"+hex.EncodeToString(h.Sum(nil)) != f.Digest {
				t.Fatalf("Ready artifact %s: %s is corrupt (%d bytes)", a.Name, f.Path, n)
			}
		}
	}
}

// fsck: a full verify must find nothing wrong.
func fsck(t *testing.T, e *env) {
	t.Helper()
	out := e.mustCtl("verify")
	if !strings.Contains(out, "0 corrupt, 0 missing") {
		t.Fatalf("verify after restart: %s", out)
	}
	checkReady(t, e)
	if ents, _ := os.ReadDir(filepath.Join(e.root, "tmp")); len(ents) != 0 {
		t.Fatalf("temp files left after repair: %v", ents)
	}
}

func TestCrashAtCommitPoints(t *testing.T) {
	tree := map[string][]byte{"config.json": []byte(`{"model_type":"x"}`), "w-1.safetensors": data(2<<20+5, 11), "w-2.safetensors": data(3<<20, 12), "sub/tok.json": data(70000, 13)}
	for _, point := range []string{"blob.after-rename:2", "tree.after-rename:1", "commit.after-index:1"} {
		t.Run(point, func(t *testing.T) {
			e := newEnv(t)
			src := filepath.Join(e.dir, "src")
			writeTree(t, src, tree)
			e.start("MODELCACHED_FAULTPOINT=" + point)
			e.mustCtl("pull", "file://"+src, "--name", "m", "--no-wait")
			if !e.waitKilled(20 * time.Second) {
				t.Fatalf("the daemon did not reach %s\n%s", point, e.log)
			}
			e.start()
			checkReady(t, e)
			e.mustCtl("wait", "m", "--timeout", "30s")
			fsck(t, e)
			for p, b := range tree {
				got, err := os.ReadFile(filepath.Join(e.root, "models/m/current", p))
				if err != nil || string(got) != string(b) {
					t.Fatalf("%s after the crash: %v", p, err)
				}
			}
		})
	}
}

// TestCrashMidDownloadResumes kills the daemon inside an ingest and
// checks that the restart fetches only what was not yet on disk.
func TestCrashMidDownloadResumes(t *testing.T) {
	const buf = cachestore.DefaultWriteBuffer // one write of the daemon's writer
	big := data(3*buf+5<<20, 21)
	srv := newServer(t, map[string][]byte{"big.bin": big})
	e := newEnv(t)
	e.start("MODELCACHED_FAULTPOINT=ingest.write:2") // after 2 buffers are on disk
	e.mustCtl("pull", srv.URL+"/big.bin#sha256="+sha(big), "--name", "big", "--no-wait")
	if !e.waitKilled(20 * time.Second) {
		t.Fatalf("no kill\n%s", e.log)
	}
	if _, err := os.Lstat(filepath.Join(e.root, "models/big")); err == nil {
		t.Fatal("a half-downloaded artifact is visible")
	}
	// The server may still be writing into the dead daemon's connection
	// for a moment: count from when that has stopped.
	before := srv.sent.Load()
	for stable := 0; stable < 5; {
		time.Sleep(50 * time.Millisecond)
		if now := srv.sent.Load(); now != before {
			before, stable = now, 0
		} else {
			stable++
		}
	}
	e.start()
	e.mustCtl("wait", "big", "--timeout", "30s")
	fsck(t, e)
	off := parseRangeStart(srv.lastRange())
	after := srv.sent.Load() - before
	if off < 2*buf {
		t.Fatalf("resumed at %d; %d bytes were on disk at the kill", off, 2*buf)
	}
	if after != int64(len(big))-off {
		t.Fatalf("after restart fetched %d bytes, want exactly the %d not on disk", after, int64(len(big))-off)
	}
	t.Logf("killed after %d bytes sent; resumed at %d; re-fetched %d bytes that were in flight", before, off, before-off)
}

// TestKillSoak SIGKILLs the daemon at random moments of a throttled
// multi-artifact pull; after every restart no Ready artifact may hold a
// wrong byte, and the pulls finish.
func TestKillSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak")
	}
	files := map[string][]byte{"a.bin": data(6<<20, 31), "b.bin": data(5<<20+3, 32), "shared.bin": data(3<<20, 33)}
	srv := newServer(t, files)
	srv.throttle.Store(96 << 10) // ~9.6 MB/s: a pull spans several kills
	e := newEnv(t)
	e.start()
	for _, n := range []string{"a.bin", "b.bin", "shared.bin"} {
		e.mustCtl("pull", srv.URL+"/"+n+"#sha256="+sha(files[n]), "--name", strings.TrimSuffix(n, ".bin"), "--no-wait")
	}
	e.mustCtl("pull", srv.URL+"/shared.bin#sha256="+sha(files["shared.bin"]), "--name", "shared-too", "--no-wait")
	kills := 0
	for i := 0; i < 6; i++ {
		time.Sleep(time.Duration(150+rand.IntN(350)) * time.Millisecond)
		e.kill()
		kills++
		e.start()
		checkReady(t, e)
	}
	srv.throttle.Store(0)
	for _, n := range []string{"a", "b", "shared", "shared-too"} {
		e.mustCtl("wait", n, "--timeout", "60s")
	}
	fsck(t, e)
	var total int64
	for _, b := range files {
		total += int64(len(b))
	}
	t.Logf("kills %d; bytes sent %d for %d bytes of content (re-fetched %d)", kills, srv.sent.Load(), total, srv.sent.Load()-total)
}
