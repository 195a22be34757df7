package cachestore_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/modelcache/modelcache/cachestore"
)

// A hold record outlives the loss of the index: Open puts it back from
// its copy under holds/, and DeleteHold removes both.
func TestHoldsSurviveALostIndex(t *testing.T) {
	root := t.TempDir()
	populate(t, root)
	s, _, err := cachestore.Open(context.Background(), root)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Records().PutHold("csi:vol-1", []byte(`{"pod":"ml/a"}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.Records().PutHold("csi:vol-2", []byte(`{"pod":"ml/b"}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.Records().DeleteHold("csi:vol-2"); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := os.Remove(filepath.Join(root, "index.db")); err != nil {
		t.Fatal(err)
	}
	s, rep, err := cachestore.Open(context.Background(), root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if rep.IndexRebuilt == nil || rep.HoldsRestored != 1 {
		t.Fatalf("report %+v: want the index rebuilt and 1 hold restored", rep)
	}
	got, err := s.Records().Holds()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || string(got["csi:vol-1"]) != `{"pod":"ml/a"}` {
		t.Fatalf("holds after a lost index: %q, want csi:vol-1 only, its record intact", got)
	}
	if err := s.Records().DeleteHold("csi:vol-1"); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(filepath.Join(root, "holds")); len(ents) != 0 {
		t.Fatalf("holds/ keeps %d entries after DeleteHold", len(ents))
	}
}

// A hold's composed tree shows each part's files under its directory,
// read-only hardlinks of the blobs; a clash is an error naming both;
// DeleteHold takes the tree down.
func TestHoldTree(t *testing.T) {
	root := t.TempDir()
	populate(t, root)
	ctx := context.Background()
	s, _, err := cachestore.Open(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	kc := strings.Repeat("c", 64)
	if err := s.Records().PutHold("csi:v", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	tree, err := s.HoldTree(ctx, "csi:v", []cachestore.TreePart{{Name: "a", Revision: "r1"}, {Dir: "kernels/k", Name: "k", Revision: kc}})
	if err != nil {
		t.Fatal(err)
	}
	if tree != s.HoldTreePath("csi:v") || !strings.HasPrefix(tree, root+"/holds/") {
		t.Fatalf("tree at %s, want under %s/holds", tree, root)
	}
	for rel, src := range map[string]string{"w.bin": "models/a/r1/w.bin", "config.json": "models/a/r1/config.json", "kernels/k/triton/x.cubin": "kernels/k/" + kc + "/triton/x.cubin"} {
		var a, b syscall.Stat_t
		if err := syscall.Stat(filepath.Join(tree, rel), &a); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Stat(filepath.Join(root, src), &b); err != nil {
			t.Fatal(err)
		}
		if a.Ino != b.Ino || a.Mode&0o222 != 0 {
			t.Errorf("%s: inode %d mode %o, want the read-only blob of %s (inode %d)", rel, a.Ino, a.Mode, src, b.Ino)
		}
	}
	if _, err := s.HoldTree(ctx, "csi:w", []cachestore.TreePart{{Name: "a", Revision: "r1"}, {Name: "a", Revision: "r2"}}); err == nil || !strings.Contains(err.Error(), "a@r1") || !strings.Contains(err.Error(), "a@r2") {
		t.Errorf("clashing parts: %v, want an error naming both", err)
	}
	if _, err := s.HoldTree(ctx, "csi:w", []cachestore.TreePart{{Dir: "../x", Name: "a", Revision: "r1"}}); !errors.Is(err, cachestore.ErrInvalidPath) {
		t.Errorf("a part's directory with ..: %v, want ErrInvalidPath", err)
	}
	if _, err := s.HoldTree(ctx, "csi:w", []cachestore.TreePart{{Name: "a", Revision: "nope"}}); !errors.Is(err, cachestore.ErrNotFound) {
		t.Errorf("a part that is not Ready: %v, want ErrNotFound", err)
	}
	if err := s.Records().DeleteHold("csi:v"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tree); !os.IsNotExist(err) {
		t.Fatalf("the composed tree outlived its hold: %v", err)
	}
}
