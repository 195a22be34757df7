package cachestore_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/cachestore/storetest"
)

// stageVersion ingests one file and commits it as name@rev of hub repo
// org/repo at ref main.
func stageVersion(t *testing.T, s *cachestore.Store, name, rev string, seed byte, stage bool) {
	t.Helper()
	ctx := context.Background()
	b := storetest.Data(1000+int(seed), seed)
	d, err := s.Ingest(ctx, name+rev, bytes.NewReader(b), int64(len(b)), "")
	if err != nil {
		t.Fatal(err)
	}
	spec := cachestore.VersionSpec{Name: name, Source: "hf://org/repo@" + rev, Revision: rev, HFRepo: "org/repo", HFRef: "main", Stage: stage,
		Manifest: cachestore.Manifest{{Path: "w.bin", Digest: d, Size: int64(len(b))}}}
	if _, err := s.CommitVersion(ctx, spec); err != nil {
		t.Fatalf("commit %s@%s (stage %v): %v", name, rev, stage, err)
	}
}

func currentOf(t *testing.T, s *cachestore.Store, root, name string) (index, link, ref string) {
	t.Helper()
	a, err := s.Summary(name)
	if err != nil {
		t.Fatal(err)
	}
	l, _ := os.Readlink(filepath.Join(root, "models", name, "current"))
	r, _ := os.ReadFile(filepath.Join(root, "hf", "models--org--repo", "refs", "main"))
	return a.Current, l, string(r)
}

// TestStageThenActivate: a staged commit is Ready with its tree in place
// while current (index, symlink, the HF view's refs/main) stays on the
// old revision; Activate moves all three; a crash right after Activate's
// index write is repaired at Open to the new revision; activating a
// revision that is not there fails and moves nothing.
func TestStageThenActivate(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	var crash bool
	s, _, err := cachestore.Open(ctx, root, cachestore.WithHook(func(p string) {
		if crash && p == "activate.after-index" {
			panic("crash")
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	old, next := strings.Repeat("a", 40), strings.Repeat("b", 40)
	stageVersion(t, s, "m", old, 1, false)
	stageVersion(t, s, "m", next, 2, true)
	if i, l, r := currentOf(t, s, root, "m"); i != old || l != old || r != old {
		t.Fatalf("after the staged commit: current %s, link %s, refs/main %s; want all %s", i, l, r, old)
	}
	if _, err := os.Stat(filepath.Join(root, "models", "m", next, "w.bin")); err != nil {
		t.Fatalf("the staged tree: %v", err)
	}
	a, _ := s.Summary("m")
	if len(a.Versions) != 2 {
		t.Fatalf("versions %+v", a.Versions)
	}
	for _, v := range a.Versions {
		if v.State != cachestore.StateReady {
			t.Errorf("%s is %s", v.Revision, v.State)
		}
	}
	if err := s.Activate("m", strings.Repeat("c", 40)); !errors.Is(err, cachestore.ErrNotFound) {
		t.Errorf("activating an unknown revision: %v, want ErrNotFound", err)
	}
	if err := s.Activate("m", next); err != nil {
		t.Fatal(err)
	}
	if i, l, r := currentOf(t, s, root, "m"); i != next || l != next || r != next {
		t.Fatalf("after Activate: current %s, link %s, refs/main %s; want all %s", i, l, r, next)
	}
	// Back (a rollback): immediate, and a crash after the index write
	// leaves a store that Open repairs to the index's word.
	crash = true
	func() {
		defer func() { recover() }()
		s.Activate("m", old)
	}()
	// The process died: no clean shutdown. Close (to free the index's
	// lock), then make its clean record stale as a crashed run leaves it.
	s.Close()
	storetest.Crashed(t, root)
	s, _, err = cachestore.Open(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if i, l, _ := currentOf(t, s, root, "m"); i != old || l != old {
		t.Fatalf("after a crash in Activate and Open: current %s, link %s; want %s", i, l, old)
	}
}
