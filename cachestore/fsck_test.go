package cachestore_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/cachestore/storetest"
)

// TestFsck: a clean store has no problems; each kind of damage is named.
func TestFsck(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, _, err := cachestore.Open(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	commit := func(name string, files map[string][]byte) {
		var m cachestore.Manifest
		for p, b := range files {
			d, err := s.Ingest(ctx, "t:"+name+p, strings.NewReader(string(b)), int64(len(b)), cachestore.DigestBytes(b))
			if err != nil {
				t.Fatal(err)
			}
			m = append(m, cachestore.Entry{Path: p, Digest: d, Size: int64(len(b)), Mode: 0o644})
		}
		if _, err := s.CommitVersion(ctx, cachestore.VersionSpec{Name: name, Source: "test", Manifest: m}); err != nil {
			t.Fatal(err)
		}
	}
	commit("a", map[string][]byte{"w.bin": storetest.Data(1000, 1), "sub/c.json": []byte("{}")})
	commit("b", map[string][]byte{"w.bin": storetest.Data(1000, 1)})
	if p, err := s.Fsck(); err != nil || len(p) != 0 {
		t.Fatalf("a clean store: %v %v", p, err)
	}
	tree := filepath.Join(root, "models", "a", "current")
	// A tree file that is a copy, not the blob; an extra file; a tree the
	// index does not know.
	os.Remove(filepath.Join(tree, "sub/c.json"))
	os.WriteFile(filepath.Join(tree, "sub/c.json"), []byte("{}"), 0o444)
	os.WriteFile(filepath.Join(tree, "extra"), []byte("x"), 0o444)
	os.MkdirAll(filepath.Join(root, "models", "ghost", "rev1"), 0o755)
	probs, err := s.Fsck()
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(probs, "\n")
	for _, want := range []string{"sub/c.json is not the blob", "extra is in the tree but not in the manifest", "models/ghost/rev1 is on disk but not in the index"} {
		if !strings.Contains(all, want) {
			t.Errorf("fsck missed %q:\n%s", want, all)
		}
	}
	// A blob gone from disk.
	d := cachestore.DigestBytes(storetest.Data(1000, 1))
	p, _ := s.BlobPath(d)
	os.Chmod(filepath.Dir(p), 0o755)
	os.Remove(p)
	probs, _ = s.Fsck()
	if all := strings.Join(probs, "\n"); !strings.Contains(all, "blob "+d+" is in the index but not on disk") || !strings.Contains(all, "b@") {
		t.Errorf("fsck missed the missing blob:\n%s", all)
	}
}
