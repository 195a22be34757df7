package daemon

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/internal/testenv"

	"github.com/modelcache/modelcache/api"
)

// hfjs runs test/hfjs/check.mjs (the official @huggingface/hub client).
// Under CI=true a missing node or npm install is a failure.
func hfjs(t *testing.T, args ...string) []byte {
	t.Helper()
	dir, _ := filepath.Abs("../test/hfjs")
	node := testenv.Require(t, "node", "apt-get install nodejs npm")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@huggingface", "hub")); err != nil {
		testenv.Missing(t, "the official HF JS client", "cd test/hfjs && npm ci")
	}
	cmd := exec.Command(node, append([]string{filepath.Join(dir, "check.mjs")}, args...)...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("node check.mjs %v: %v\n%s", args, err, stderr)
	}
	// The client logs its downloads to stdout; the answer is the last line.
	lines := bytes.Split(bytes.TrimSpace(out), []byte("\n"))
	return lines[len(lines)-1]
}

// TestOfficialClientAgreesWithHubAndView: the official client downloads
// from the test hub the bytes the hub holds (the hub is faithful), and
// the daemon's HF cache view passes the client's scanCacheDir with no
// warnings, listing the same files under the right commit and refs.
func TestOfficialClientAgreesWithHubAndView(t *testing.T) {
	h, hub := startWithHub(t)
	files := hubModel(2, 7)
	sha := hub.Commit("acme/js-check", files, "main")

	cache := t.TempDir()
	var dl struct{ Path string }
	json.Unmarshal(hfjs(t, "download", hub.URL(), "acme/js-check", "main", cache), &dl)
	for p, b := range files {
		got, err := os.ReadFile(filepath.Join(dl.Path, p))
		if err != nil || string(got) != string(b) {
			t.Fatalf("the official client got other bytes for %s from the test hub: %v", p, err)
		}
	}

	if _, err := h.pull(api.PullRequest{Name: "js", URI: "hf://acme/js-check"}); err != nil {
		t.Fatal(err)
	}
	var scan struct {
		Repos []struct {
			ID         string
			FilesCount int
			Revisions  []struct {
				Commit string
				Refs   []string
				Files  []struct {
					Path string
					Size int64
				}
			}
		}
		Warnings []string
	}
	if err := json.Unmarshal(hfjs(t, "scan", filepath.Join(h.cfg.Root, "hf")), &scan); err != nil {
		t.Fatal(err)
	}
	if len(scan.Warnings) != 0 {
		t.Fatalf("scanCacheDir warns about the view: %v", scan.Warnings)
	}
	if len(scan.Repos) != 1 || scan.Repos[0].ID != "acme/js-check" || len(scan.Repos[0].Revisions) != 1 {
		t.Fatalf("scan: %+v", scan)
	}
	// The JS client's scanSnapshotDir lists a snapshot's top level only (it
	// skips subdirectories; Python's scan recurses): compare with that.
	top := 0
	for p := range files {
		if !strings.Contains(p, "/") {
			top++
		}
	}
	rev := scan.Repos[0].Revisions[0]
	if rev.Commit != sha || len(rev.Refs) != 1 || rev.Refs[0] != "main" || len(rev.Files) != top {
		t.Fatalf("revision as the client sees it: %+v", rev)
	}
	var got []string
	for _, f := range rev.Files {
		rel, _ := filepath.Rel(filepath.Join(h.cfg.Root, "hf", "models--acme--js-check", "snapshots", sha), f.Path)
		if int64(len(files[rel])) != f.Size {
			t.Fatalf("%s: size %d, want %d", rel, f.Size, len(files[rel]))
		}
		got = append(got, rel)
	}
	sort.Strings(got)
	t.Logf("scanCacheDir sees %v", got)
}

// TestFilePullOfOfficialClientCache: a snapshot the official client wrote
// into a hub cache (files as symlinks into ../../blobs) is pulled with
// file://, and the artifact's tree holds the bytes as regular files, not
// the links.
func TestFilePullOfOfficialClientCache(t *testing.T) {
	h, hub := startWithHub(t)
	files := hubModel(1, 9)
	hub.Commit("acme/js-cache", files, "main")
	cache := t.TempDir()
	var dl struct{ Path string }
	json.Unmarshal(hfjs(t, "download", hub.URL(), "acme/js-cache", "main", cache), &dl)
	if fi, err := os.Lstat(filepath.Join(dl.Path, "config.json")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("the official client's snapshot holds no link at config.json (%v): not the layout under test", err)
	}
	if _, err := h.pull(api.PullRequest{Name: "cached", URI: "file://" + dl.Path}); err != nil {
		t.Fatal(err)
	}
	for p, b := range files {
		tp := filepath.Join(h.cfg.Root, "models", "cached", "current", p)
		fi, err := os.Lstat(tp)
		if err != nil || !fi.Mode().IsRegular() {
			t.Fatalf("%s in the tree: %v %v; want a regular file", p, fi, err)
		}
		if got, _ := os.ReadFile(tp); !bytes.Equal(got, b) {
			t.Fatalf("%s in the tree: other bytes than the hub's", p)
		}
	}
}
