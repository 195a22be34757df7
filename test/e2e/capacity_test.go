package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"github.com/modelcache/modelcache/internal/testenv"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
)

func (e *env) list() map[string]api.Artifact {
	e.t.Helper()
	var l []api.Artifact
	if err := json.Unmarshal([]byte(e.mustCtl("-o", "json", "list")), &l); err != nil {
		e.t.Fatal(err)
	}
	out := map[string]api.Artifact{}
	for _, a := range l {
		out[a.Name] = a
	}
	return out
}

func (e *env) eventually(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for: %s\ndaemon log:\n%s", what, e.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func present(e *env, name string) bool {
	_, err := os.Stat(filepath.Join(e.root, "models", name, "current", "w.bin"))
	return err == nil
}

func fill(t *testing.T, path string, n int) {
	if err := os.WriteFile(path, make([]byte, n), 0o644); err != nil {
		t.Fatalf("filler: %v", err)
	}
}

// TestEvictionOnASmallFilesystem runs the daemon on a 40 MiB tmpfs. Four
// 4 MiB models: a pinned, b leased, c and d plain. Filling the disk past
// the high mark evicts c (least recently used of the evictable); c's
// re-pull and a new pull that cannot fit fail at once with the reason; a
// process that maps d keeps d until it exits.
func TestEvictionOnASmallFilesystem(t *testing.T) {
	mnt := testenv.Tmpfs(t, "40m")
	e := newEnv(t)
	e.root = filepath.Join(mnt, "root")
	e.flags = []string{"--min-age", "0s", "--capacity-interval", "100ms"}
	files := map[string][]byte{}
	for i, n := range []string{"a", "b", "c", "d", "e"} {
		size := 4 << 20
		if n == "e" {
			size = 8 << 20
		}
		files[n+"/w.bin"] = data(size, byte(60+i))
	}
	srv := newServer(t, files)
	e.start()
	uri := func(n string) string { return srv.URL + "/" + n + "/w.bin#sha256=" + sha(files[n+"/w.bin"]) }
	e.mustCtl("pull", uri("a"), "--name", "a", "--pin")
	for _, n := range []string{"b", "c", "d"} {
		e.mustCtl("pull", uri(n), "--name", n)
		time.Sleep(20 * time.Millisecond) // distinct last-use times
	}

	// b is leased by a workload for as long as "modelctl lease" runs.
	lease := exec.Command(filepath.Join(binDir, "modelctl"), "--socket", e.socket, "lease", "b", "--holder", "job-1", "--ttl", "30s")
	if err := lease.Start(); err != nil {
		t.Fatal(err)
	}
	defer lease.Process.Kill()
	e.eventually("b shows its lease", func() bool {
		b := e.list()["b"]
		return len(b.InUse) == 1 && b.InUse[0].ID == "job-1"
	})

	// Past the high mark (85% of 40 MiB): 16 MiB of models + 19 MiB of other data.
	fill(t, filepath.Join(mnt, "filler-1"), 19<<20)
	e.eventually("c evicted", func() bool { return !present(e, "c") })
	for _, n := range []string{"a", "b", "d"} {
		if !present(e, n) {
			t.Fatalf("%s was evicted; only c (unpinned, unused, least recently used) should go\n%s", n, e.log)
		}
	}
	// c is still desired: its re-pull is refused by admission, not started.
	e.eventually("c refused for capacity", func() bool {
		c := e.list()["c"]
		return c.Phase == api.PhaseFailed && c.Reason == api.ReasonInsufficientCapacity
	})
	t0 := time.Now()
	r := e.ctl(nil, "pull", uri("e"), "--name", "e")
	if r.code != 1 || !strings.Contains(r.stderr, "InsufficientCapacity") || !strings.Contains(r.stderr, "needs 8.0 MiB") {
		t.Fatalf("a pull that cannot fit: exit %d %q", r.code, r.stderr)
	}
	t.Logf("refused in %s: %s", time.Since(t0).Round(time.Millisecond), strings.TrimSpace(r.stderr))
	for _, n := range []string{"a", "b", "d"} {
		if !present(e, n) {
			t.Fatalf("%s lost after a refused pull", n)
		}
	}

	// d, mapped by a process, survives more pressure until that process exits.
	mm := exec.Command(filepath.Join(binDir, "mmapper"), filepath.Join(e.root, "models/d/current/w.bin"))
	stdin, _ := mm.StdinPipe()
	stdout, _ := mm.StdoutPipe()
	if err := mm.Start(); err != nil {
		t.Fatal(err)
	}
	if line, _ := bufio.NewReader(stdout).ReadString('\n'); !strings.HasPrefix(line, "mapped") {
		t.Fatalf("mmapper: %q", line)
	}
	e.eventually("d shows the mapping process", func() bool {
		for _, h := range e.list()["d"].InUse {
			if h.Kind == "process" && strings.Contains(h.ID, fmt.Sprintf("pid %d (mmapper)", mm.Process.Pid)) {
				return true
			}
		}
		return false
	})
	fill(t, filepath.Join(mnt, "filler-2"), 4<<20) // past the high mark again: d would be next
	time.Sleep(600 * time.Millisecond)             // several eviction passes
	if !present(e, "d") {
		t.Fatalf("d was evicted while a process mapped it\n%s", e.log)
	}
	if out := e.mustCtl("status"); !strings.Contains(out, "could not be freed") {
		t.Fatalf("status should report what eviction could not free: %q", out)
	}
	if r := e.ctl(nil, "evict", "d", "--force"); r.code != 1 || !strings.Contains(r.stderr, "mmapper") {
		t.Fatalf("evict --force of a mapped model: exit %d %q", r.code, r.stderr)
	}
	stdin.Close()
	mm.Wait()
	e.eventually("d evicted once unmapped", func() bool { return !present(e, "d") })
	if !present(e, "a") || !present(e, "b") {
		t.Fatal("pinned or leased model evicted")
	}

	// The lease ends with its holder: modelctl releases it on SIGTERM.
	lease.Process.Signal(os.Interrupt)
	lease.Wait()
	e.eventually("lease released", func() bool { return len(e.list()["b"].InUse) == 0 })
	if out := e.mustCtl("gc", "--dry-run"); !strings.Contains(out, "would remove") {
		t.Fatalf("gc --dry-run: %q", out)
	}
}
