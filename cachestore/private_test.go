package cachestore

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestPrivateTreesLiveApart: a private artifact's trees are under
// private/, never under models/ (where a node's local PV may point);
// SetPrivate moves every version, its current link with them, both ways;
// a private commit moves an artifact in, a public one never moves it out;
// fsck, repair after a crash and a rebuild of a lost index keep the place.
func TestPrivateTreesLiveApart(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, _, err := Open(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	commit := func(name, rev string, private bool) {
		t.Helper()
		body := []byte("weights of " + name + "@" + rev)
		d, err := s.Ingest(ctx, name+rev, bytes.NewReader(body), int64(len(body)), "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.CommitVersion(ctx, VersionSpec{Name: name, Source: "file:///" + name, Revision: rev, Private: private,
			Manifest: Manifest{{Path: "w.bin", Digest: d, Size: int64(len(body))}}}); err != nil {
			t.Fatal(err)
		}
	}
	// at checks that name's trees are on the side private says, and only
	// there, that current reads, and that rev's tree has mode.
	at := func(name, rev string, private bool, mode os.FileMode) {
		t.Helper()
		side, other := filepath.Join(root, "models"), filepath.Join(root, "private", "models")
		if private {
			side, other = other, side
		}
		if got, want := s.TreePath(KindModel, name, rev), filepath.Join(side, name, rev); got != want {
			t.Fatalf("%s@%s: TreePath %s, want %s", name, rev, got, want)
		}
		if s.IsPrivate(KindModel, name) != private {
			t.Fatalf("%s: IsPrivate %v, want %v", name, !private, private)
		}
		if _, err := os.Lstat(filepath.Join(other, name)); !os.IsNotExist(err) {
			t.Fatalf("%s: %s exists too: %v", name, filepath.Join(other, name), err)
		}
		fi, err := os.Stat(filepath.Join(side, name, rev))
		if err != nil || fi.Mode().Perm() != mode {
			t.Fatalf("%s@%s: %v %v, want mode %v", name, rev, fi, err, mode)
		}
		if _, err := os.ReadFile(filepath.Join(side, name, "current", "w.bin")); err != nil {
			t.Fatalf("%s: reading through current: %v", name, err)
		}
	}

	commit("pub", "r1", false)
	commit("priv", "r1", true)
	at("pub", "r1", false, 0o755)
	at("priv", "r1", true, 0o700)
	for _, d := range []string{"private", "private/models", "private/kernels"} {
		if fi, err := os.Stat(filepath.Join(root, d)); err != nil || fi.Mode().Perm() != 0o711 {
			t.Fatalf("%s: %v %v, want 0711 (passed through, never listed)", d, fi, err)
		}
	}

	// Both ways, every version with it.
	commit("pub", "r2", false)
	if err := s.SetPrivate(KindModel, "pub", true); err != nil {
		t.Fatal(err)
	}
	at("pub", "r1", true, 0o755) // the mode is its owner's to set
	at("pub", "r2", true, 0o755)
	if err := s.SetPrivate(KindModel, "pub", false); err != nil {
		t.Fatal(err)
	}
	at("pub", "r2", false, 0o755)
	if err := s.SetPrivate(KindModel, "nothing", true); err != nil {
		t.Fatalf("SetPrivate of a name with no tree: %v", err)
	}
	if err := s.SetPrivate(KindModel, "../x", true); err == nil {
		t.Fatal("SetPrivate took a name with a path in it")
	}

	// A private commit takes the artifact's other versions along; a
	// public commit to a private artifact leaves it private.
	commit("pub", "r3", true)
	at("pub", "r1", true, 0o755)
	at("pub", "r3", true, 0o700)
	commit("priv", "r2", false)
	at("priv", "r2", true, 0o755)
	if p, err := s.Fsck(); err != nil || len(p) != 0 {
		t.Fatalf("fsck of a store with private trees: %v %v", p, err)
	}

	// A copy under models/ of a private name (made by hand) is named by
	// fsck and removed by repair; a private artifact whose every tree is
	// gone is rebuilt under private/, closed.
	if err := os.MkdirAll(filepath.Join(root, "models", "priv", "r1"), 0o755); err != nil {
		t.Fatal(err)
	}
	if p, _ := s.Fsck(); !strings.Contains(strings.Join(p, "\n"), "models/priv/r1 is on disk but not in the index") {
		t.Fatalf("fsck did not name the public copy of a private name: %q", p)
	}
	if err := os.RemoveAll(filepath.Join(root, "private", "models", "pub")); err != nil {
		t.Fatal(err)
	}
	s.db.Close() // this run dies
	s, rep, err := Open(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	if rep.TreesRebuilt != 3 || rep.TreesRemoved != 1 {
		t.Fatalf("repair: %+v, want 3 trees rebuilt (pub's) and 1 removed (models/priv)", rep)
	}
	at("priv", "r1", true, 0o700)
	at("pub", "r3", true, 0o700)

	// A lost index is rebuilt with each artifact where its trees are.
	s.Close()
	if err := os.Remove(filepath.Join(root, indexFile)); err != nil {
		t.Fatal(err)
	}
	s, _, err = Open(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	at("priv", "r2", true, 0o755)
	if a, err := s.Get("priv"); err != nil || len(a.Versions) != 2 {
		t.Fatalf("priv after the index was rebuilt: %+v %v", a, err)
	}
	if p, err := s.Fsck(); err != nil || len(p) != 0 {
		t.Fatalf("fsck after the rebuild: %v %v", p, err)
	}
}

func TestInTrees(t *testing.T) {
	for rel, want := range map[string][]string{
		"models":                   {},
		"models/m":                 {"m"},
		"models/m/r1/sub/w.bin":    {"m", "r1", "sub", "w.bin"},
		"private/kernels/k/r/x":    {"k", "r", "x"},
		"/private/models/m/":       {"m"},
		"private":                  nil,
		"privatemodels/m":          nil,
		"blobs/sha256/ab/abcd":     nil,
		"holds/h/tree/w.bin":       nil,
		"hf/models--a--b/blobs/x":  nil,
		"":                         nil,
		"private/blobs/sha256/ab/": nil,
	} {
		got, ok := InTrees(rel)
		if ok != (want != nil) || (ok && !reflect.DeepEqual(got, want)) {
			t.Errorf("InTrees(%q) = %q %v, want %q", rel, got, ok, want)
		}
	}
}
