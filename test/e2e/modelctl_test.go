package e2e

import (
	"encoding/json"
	"github.com/modelcache/modelcache/internal/testenv"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/api"
)

func writeTree(t *testing.T, dir string, files map[string][]byte) {
	for p, b := range files {
		full := filepath.Join(dir, p)
		os.MkdirAll(filepath.Dir(full), 0o755)
		if err := os.WriteFile(full, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestModelctlEndToEnd(t *testing.T) {
	e := newEnv(t)

	// No daemon yet: exit 1, and the message says where it looked and how to start one.
	r := e.ctl(nil, "list")
	if r.code != 1 || !strings.Contains(r.stderr, e.socket) || !strings.Contains(r.stderr, "make run") {
		t.Fatalf("unreachable daemon: exit %d, %q", r.code, r.stderr)
	}
	// Usage errors exit 2.
	for _, args := range [][]string{{"pull"}, {"pull", "file:///x"}, {"bogus"}, {"-o", "xml", "list"}, {"inspect"}, {"pull", "--nope", "file:///x"}} {
		if r := e.ctl(nil, args...); r.code != 2 {
			t.Errorf("modelctl %v: exit %d, want 2 (usage)\n%s", args, r.code, r.stderr)
		}
	}

	e.start()
	src := filepath.Join(e.dir, "src")
	writeTree(t, src, map[string][]byte{"config.json": []byte(`{"architectures":["X"]}`), "model/w.safetensors": data(1<<20, 1), "README.md": []byte("readme")})

	out := e.mustCtl("pull", "file://"+src, "--name", "m", "--pin", "--exclude", "*.md")
	if !strings.Contains(out, "m: Ready at "+filepath.Join(e.root, "models/m/current")) {
		t.Fatalf("pull output %q", out)
	}
	if _, err := os.Stat(filepath.Join(e.root, "models/m/current/README.md")); err == nil {
		t.Fatal("--exclude '*.md' did not exclude README.md")
	}

	var list []api.Artifact
	if err := json.Unmarshal([]byte(e.mustCtl("-o", "json", "list")), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || list[0].Phase != api.PhaseReady || !list[0].Pinned || list[0].Bytes != 1<<20+23 {
		t.Fatalf("list: %+v", list)
	}
	var a api.Artifact
	json.Unmarshal([]byte(e.mustCtl("inspect", "m", "-o", "json")), &a)
	if len(a.Versions) != 1 || len(a.Versions[0].Files) != 2 || a.Versions[0].Files[1].Path != "model/w.safetensors" {
		t.Fatalf("inspect: %+v", a)
	}
	if y := e.mustCtl("inspect", "m", "-o", "yaml"); !strings.Contains(y, "phase: Ready") {
		t.Fatalf("inspect as yaml: %q", y)
	}
	// For people: units, no raw floats, the digest explained.
	if d := e.mustCtl("inspect", "m"); !strings.Contains(d, "Phase:") || !strings.Contains(d, "Ready") || !strings.Contains(d, "1.0 MiB") ||
		strings.Contains(d, "e+0") || !strings.Contains(d, "pull --digest") || !strings.Contains(d, "Path:") {
		t.Fatalf("inspect: %q", d)
	}
	if l := e.mustCtl("list"); !strings.Contains(l, "AGE") || !strings.Contains(l, "1.0 MiB") {
		t.Fatalf("list: %q", l)
	}
	if v := e.mustCtl("version"); !strings.Contains(v, "modelctl:") || !strings.Contains(v, "modelcached:") {
		t.Fatalf("version: %q", v)
	}
	if out := e.mustCtl("wait", "m", "--timeout", "5s"); !strings.Contains(out, "Ready") {
		t.Fatalf("wait: %q", out)
	}
	if out := e.mustCtl("du"); !strings.Contains(out, "m") || !strings.Contains(out, "1.0 MiB") {
		t.Fatalf("du: %q", out)
	}
	if out := e.mustCtl("status"); !strings.Contains(out, "1 ready") {
		t.Fatalf("status: %q", out)
	}
	if out := e.mustCtl("verify"); !strings.Contains(out, "0 corrupt") {
		t.Fatalf("verify: %q", out)
	}

	// A pinned artifact is not evicted without --force; the error says what to do.
	if r := e.ctl(nil, "evict", "m"); r.code != 1 || !strings.Contains(r.stderr, "unpin") {
		t.Fatalf("evict pinned: exit %d %q", r.code, r.stderr)
	}
	e.mustCtl("unpin", "m")
	if out := e.mustCtl("evict", "m"); !strings.Contains(out, "evicted 1 revision") || !strings.Contains(out, "2 blob") {
		t.Fatalf("evict: %q", out)
	}
	if r := e.ctl(nil, "inspect", "m"); r.code != 1 || !strings.Contains(r.stderr, "not in the cache") {
		t.Fatalf("inspect after evict: %d %q", r.code, r.stderr)
	}

	// A failed pull exits 1 with the reason; a new name's pull that failed
	// for good leaves nothing behind (no entry to evict) unless --keep.
	// --no-wait returns at once and wait reports the failure.
	if r := e.ctl(nil, "pull", "file://"+src, "--name", "bad", "--digest", "sha256:"+strings.Repeat("1", 64)); r.code != 1 || !strings.Contains(r.stderr, "digest mismatch") || !strings.Contains(r.stderr, "nothing was kept") {
		t.Fatalf("pull with a wrong --digest: %d %q", r.code, r.stderr)
	}
	if r := e.ctl(nil, "inspect", "bad"); r.code != 1 || !strings.Contains(r.stderr, "not in the cache") {
		t.Fatalf("inspect after a first pull failed for good: %d %q", r.code, r.stderr)
	}
	if r := e.ctl(nil, "pull", "file://"+src, "--name", "bad", "--keep", "--digest", "sha256:"+strings.Repeat("1", 64)); r.code != 1 || !strings.Contains(r.stderr, "desire for bad stays") {
		t.Fatalf("pull --keep with a wrong --digest: %d %q", r.code, r.stderr)
	}
	e.mustCtl("evict", "bad")
	// A pull nobody waited for keeps its Failed ad-hoc entry: evict --failed drops it.
	e.mustCtl("pull", "file://"+src, "--name", "bad2", "--no-wait", "--digest", "sha256:"+strings.Repeat("2", 64))
	if r := e.ctl(nil, "wait", "bad2", "--timeout", "20s"); r.code != 1 || !strings.Contains(r.stderr, "digest mismatch") {
		t.Fatalf("wait for a pull with a wrong --digest: %d %q", r.code, r.stderr)
	}
	if out := e.mustCtl("evict", "--failed"); !strings.Contains(out, "bad2: evicted") {
		t.Fatalf("evict --failed: %q", out)
	}
	e.mustCtl("pull", "file://"+src, "--name", "later", "--no-wait")
	e.mustCtl("wait", "later", "--timeout", "20s")
	if r := e.ctl(nil, "wait", "nosuch", "--timeout", "300ms"); r.code != 1 || !strings.Contains(r.stderr, "nothing desires it") {
		t.Fatalf("wait for a name nobody wants: %d %q", r.code, r.stderr)
	}
	if out := e.mustCtl("-o", "yaml", "gc"); !strings.Contains(out, "blobsRemoved") {
		t.Fatalf("gc yaml: %q", out)
	}
}

// TestPeerCanReadNotMutate runs modelctl as uid 65534: it may list, not evict.
func TestPeerCanReadNotMutate(t *testing.T) {
	nobody := asNobody(t)
	e := newEnv(t)
	e.start()
	src := filepath.Join(e.dir, "src")
	writeTree(t, src, map[string][]byte{"w.bin": []byte("weights")})
	e.mustCtl("pull", "file://"+src, "--name", "m")

	if r := e.ctl(nobody, "list"); r.code != 0 || !strings.Contains(r.stdout, "m ") {
		t.Fatalf("uid 65534 list: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, args := range [][]string{{"evict", "m"}, {"pull", "file://" + src, "--name", "x"}, {"gc"}, {"pin", "m"}, {"verify"}} {
		r := e.ctl(nobody, args...)
		if r.code != 1 || !strings.Contains(r.stderr, "uid 65534 may read the cache but not change it") || !strings.Contains(r.stderr, "root") {
			t.Errorf("uid 65534 %v: exit %d %q", args, r.code, r.stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(e.root, "models/m/current/w.bin")); err != nil {
		t.Fatal("the artifact is gone after a refused evict")
	}
}

// TestLeaseWhileCommandRuns: modelctl lease holds the lease while its
// command runs, passes the command's exit code on, and releases.
func TestLeaseWhileCommandRuns(t *testing.T) {
	e := newEnv(t)
	e.start()
	src := filepath.Join(e.dir, "src")
	writeTree(t, src, map[string][]byte{"w.bin": []byte("weights")})
	e.mustCtl("pull", "file://"+src, "--name", "m")
	marker := filepath.Join(e.dir, "seen")
	// The command looks at the lease from inside (it is listed) and exits 3.
	script := filepath.Join(binDir, "modelctl") + " --socket " + e.socket + " -o json list > " + marker + "; exit 3"
	r := e.ctl(nil, "lease", "m", "--holder", "batch-9", "--ttl", "30s", "--", "sh", "-c", script)
	if r.code != 3 {
		t.Fatalf("lease -- cmd: exit %d, want the command's 3\n%s", r.code, r.stderr)
	}
	seen, _ := os.ReadFile(marker)
	if !strings.Contains(string(seen), `"id": "batch-9"`) {
		t.Fatalf("while the command ran, list did not show the lease: %s", seen)
	}
	var list []api.Artifact
	json.Unmarshal([]byte(e.mustCtl("-o", "json", "list")), &list)
	if len(list) != 1 || len(list[0].InUse) != 0 {
		t.Fatalf("lease not released after the command: %+v", list)
	}
	if r := e.ctl(nil, "lease", "nosuch", "--ttl", "10s"); r.code != 1 {
		t.Fatalf("lease of an unknown artifact: exit %d", r.code)
	}
}

// asNobody is the command prefix that runs modelctl as uid 65534 with no
// groups; it skips a test that cannot (not root, no setpriv).
func asNobody(t *testing.T) []string {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (to run a peer as another uid with setpriv)", "run the tests as root, as CI does")
	}
	setpriv := testenv.Require(t, "setpriv", "apt-get install util-linux")
	return []string{setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"}
}
