package file

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/fetchers"
)

// hubCache writes a hub cache repository as huggingface_hub does: each
// file once under blobs/ (named by its LFS sha256 or git blob sha1), a
// snapshot of relative symlinks into ../../blobs (one level deeper per
// subdirectory), and refs/main holding the commit.
func hubCache(t *testing.T, cache, repo, commit string, files map[string]string) string {
	t.Helper()
	rd := filepath.Join(cache, repo)
	snap := filepath.Join(rd, "snapshots", commit)
	i := 0
	for p, body := range files {
		i++
		blob := strings.Repeat(string(rune('a'+i)), 64)
		write(t, filepath.Join(rd, "blobs", blob), body)
		link := filepath.Join(snap, p)
		os.MkdirAll(filepath.Dir(link), 0o755)
		rel, _ := filepath.Rel(filepath.Dir(link), filepath.Join(rd, "blobs", blob))
		if err := os.Symlink(rel, link); err != nil {
			t.Fatal(err)
		}
	}
	write(t, filepath.Join(rd, "refs", "main"), commit)
	return snap
}

// TestHubCacheSnapshot: a snapshot of a hub cache is pulled through its
// links into blobs/ (the bytes, under the links' paths, read as the
// requester), a single file of it too; a link that leads anywhere else
// out of the source (refs/, another repository's blobs, /etc, a blob in a
// subdirectory of blobs/) is still refused, naming the link and where
// links may lead.
func TestHubCacheSnapshot(t *testing.T) {
	requireRoot(t)
	cache := t.TempDir()
	openTree(t, cache)
	commit := strings.Repeat("c", 40)
	files := map[string]string{"config.json": `{"model_type":"llama"}`, "model.safetensors": "weights", "tokenizer/tokenizer.json": "{}"}
	snap := hubCache(t, cache, "models--acme--tiny", commit, files)
	f := New()
	for _, as := range []*fetchers.Identity{nil, nobody} {
		got, err := readAll(t, f, fetchers.Source{URI: "file://" + snap, As: as})
		if err != nil || len(got) != len(files) {
			t.Fatalf("snapshot as %v: %v %v", as, got, err)
		}
		for p, body := range files {
			if got[p] != body {
				t.Errorf("snapshot as %v: %s = %q, want %q", as, p, got[p], body)
			}
		}
		got, err = readAll(t, f, fetchers.Source{URI: "file://" + snap + "/tokenizer/tokenizer.json", As: as})
		if err != nil || got["tokenizer.json"] != "{}" {
			t.Fatalf("one file of a snapshot as %v: %v %v", as, got, err)
		}
	}
	// A blob the requester may not read is refused to it, by name.
	blobs := filepath.Join(cache, "models--acme--tiny", "blobs")
	ents, _ := os.ReadDir(blobs)
	for _, e := range ents {
		os.Chmod(filepath.Join(blobs, e.Name()), 0o600)
	}
	if _, err := readAll(t, f, fetchers.Source{URI: "file://" + snap, As: nobody}); !errors.Is(err, fetchers.ErrUnauthorized) || !strings.Contains(err.Error(), blobs) {
		t.Errorf("unreadable blobs as nobody: %v; want access denied naming a blob", err)
	}

	other := hubCache(t, cache, "models--acme--other", commit, map[string]string{"w.bin": "other's"})
	write(t, filepath.Join(cache, "models--acme--tiny", "blobs", "sub", "x"), "x")
	write(t, filepath.Join(cache, "outside"), "outside")
	otherBlob, _ := os.Readlink(filepath.Join(other, "w.bin"))
	for name, target := range map[string]string{
		"ref":        "../../refs/main",
		"other-repo": filepath.Join(filepath.Dir(other), filepath.Base(other), otherBlob),
		"etc":        "/etc/hostname",
		"deeper":     "../../blobs/sub/x",
		"up":         "../../../outside",
	} {
		t.Run(name, func(t *testing.T) {
			s := hubCache(t, t.TempDir(), "models--acme--esc", commit, map[string]string{"ok.json": "{}"})
			os.Symlink(target, filepath.Join(s, "bad"))
			_, err := f.Resolve(context.Background(), fetchers.Source{URI: "file://" + s})
			if !errors.Is(err, fetchers.ErrBadSource) || !strings.Contains(err.Error(), "symlink bad points outside the source tree") || !strings.Contains(err.Error(), "only links to files directly in") {
				t.Errorf("link to %s: %v; want refused, naming the link and where links may lead", target, err)
			}
		})
	}
	// Outside a hub cache the rule is as before: every link out is refused.
	plain := t.TempDir()
	write(t, filepath.Join(plain, "blobs", "x"), "x")
	os.MkdirAll(filepath.Join(plain, "snap"), 0o755)
	os.Symlink("../blobs/x", filepath.Join(plain, "snap", "x"))
	if _, err := f.Resolve(context.Background(), fetchers.Source{URI: "file://" + plain + "/snap"}); !errors.Is(err, fetchers.ErrBadSource) || !strings.Contains(err.Error(), "copy the file into the tree") {
		t.Errorf("a link out of a plain tree: %v", err)
	}
}

// TestHubCacheBlobsOutsideRoots: with --file-roots naming only the
// snapshot, its blobs/ lies outside them and the pull is refused saying so.
func TestHubCacheBlobsOutsideRoots(t *testing.T) {
	snap := hubCache(t, t.TempDir(), "models--acme--tiny", strings.Repeat("c", 40), map[string]string{"w.bin": "w"})
	_, err := New(WithRoots(snap)).Resolve(context.Background(), fetchers.Source{URI: "file://" + snap})
	if !errors.Is(err, fetchers.ErrUnauthorized) || !strings.Contains(err.Error(), "--file-roots") || !strings.Contains(err.Error(), "blobs") {
		t.Fatalf("blobs outside the roots: %v", err)
	}
	got, err := readAll(t, New(WithRoots(filepath.Dir(filepath.Dir(filepath.Dir(snap))))), fetchers.Source{URI: "file://" + snap})
	if err != nil || got["w.bin"] != "w" {
		t.Fatalf("the cache under the roots: %v %v", got, err)
	}
}
