package cachestore

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestCleanShutdownSkipsTheWalk: after a clean Close, Open empties tmp/
// but walks no tree (a stray tree stays), and deletes the clean record at
// once, so that a crash of that run is repaired by the next Open (the
// stray tree goes).
func TestCleanShutdownSkipsTheWalk(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, _, err := Open(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"a":1}`)
	d, err := s.Ingest(ctx, "r", bytes.NewReader(body), int64(len(body)), DigestBytes(body))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CommitVersion(ctx, VersionSpec{Name: "m", Manifest: Manifest{{Path: "config.json", Digest: d, Size: int64(len(body))}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	stray := filepath.Join(root, "models", "stray", "rev")
	if err := os.MkdirAll(stray, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "tmp", "tree-1"), 0o755); err != nil {
		t.Fatal(err)
	}

	s, rep, err := Open(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.AfterCleanShutdown || rep.TmpRemoved != 1 {
		t.Fatalf("open after a clean close: %+v, want AfterCleanShutdown and tmp/ emptied", rep)
	}
	if _, err := os.Stat(stray); err != nil {
		t.Fatalf("the stray tree was walked and removed after a clean shutdown: %v", err)
	}
	if clean, err := closedCleanly(s.db); err != nil || clean {
		t.Fatalf("the clean record outlived Open (%v, %v): a crash of this run would not be repaired", clean, err)
	}
	// This run dies: the index closes without Close.
	if err := s.db.Close(); err != nil {
		t.Fatal(err)
	}

	s, rep, err = Open(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if rep.AfterCleanShutdown || rep.TreesRemoved != 1 {
		t.Fatalf("open after a crash: %+v, want the full repair (the stray tree removed)", rep)
	}
	if _, err := os.Stat(stray); !os.IsNotExist(err) {
		t.Fatalf("the stray tree survived the repair after a crash: %v", err)
	}
	if got, err := os.ReadFile(filepath.Join(root, "models", "m", "current", "config.json")); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("the committed model after both opens: %q, %v", got, err)
	}
}

// TestRepairRebuildsATreeClosed: a version's tree that repair rebuilds
// after a crash is 0700: the store does not know whether the version is
// private, and its owner (the daemon, before it serves) opens a public one.
func TestRepairRebuildsATreeClosed(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, _, err := Open(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte("weights")
	d, err := s.Ingest(ctx, "w", bytes.NewReader(body), int64(len(body)), "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CommitVersion(ctx, VersionSpec{Name: "m", Source: "file:///m", Revision: "r1",
		Manifest: Manifest{{Path: "w.bin", Digest: d, Size: int64(len(body))}}}); err != nil {
		t.Fatal(err)
	}
	tree := s.TreePath(KindModel, "m", "r1")
	if fi, err := os.Stat(tree); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("a committed public tree: %v %v, want 0755", fi.Mode(), err)
	}
	if err := os.RemoveAll(tree); err != nil {
		t.Fatal(err)
	}
	// This run dies: the index closes without Close.
	if err := s.db.Close(); err != nil {
		t.Fatal(err)
	}
	s, rep, err := Open(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fi, err := os.Stat(tree)
	if err != nil || rep.TreesRebuilt != 1 {
		t.Fatalf("tree not rebuilt: %v, report %+v", err, rep)
	}
	if fi.Mode().Perm() != 0o700 {
		t.Fatalf("a rebuilt tree is %v, want 0700 until its owner opens it", fi.Mode().Perm())
	}
}
