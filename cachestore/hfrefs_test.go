package cachestore_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/cachestore/storetest"
)

// TestHFRefsThatCannotCoexist: revisions main and main/x of one repo
// cannot both be refs (one is a file, the other needs it as a directory).
// Whichever comes first, every commit succeeds, refs/main names its
// commit, and later syncs of the repo keep working.
func TestHFRefsThatCannotCoexist(t *testing.T) {
	for _, order := range [][]string{{"main", "main/x", "v2"}, {"main/x", "main", "v2"}} {
		t.Run(strings.ReplaceAll(strings.Join(order, ","), "/", "_"), func(t *testing.T) {
			ctx := context.Background()
			root := t.TempDir()
			s, _, err := cachestore.Open(ctx, root)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			commits := map[string]string{}
			for i, ref := range order {
				b := storetest.Data(1000+i, byte(i))
				d, err := s.Ingest(ctx, "f"+ref, bytes.NewReader(b), int64(len(b)), "")
				if err != nil {
					t.Fatal(err)
				}
				rev := strings.Repeat(string("abc"[i]), 40)
				commits[ref] = rev
				spec := cachestore.VersionSpec{Name: "m" + string("abc"[i]), Source: "hf://org/repo@" + ref, Revision: rev, HFRepo: "org/repo", HFRef: ref,
					Manifest: cachestore.Manifest{{Path: "w.bin", Digest: d, Size: int64(len(b))}}}
				if _, err := s.CommitVersion(ctx, spec); err != nil {
					t.Fatalf("commit of revision %s: %v", ref, err)
				}
			}
			refs := filepath.Join(root, "hf", "models--org--repo", "refs")
			for _, ref := range []string{"main", "v2"} {
				if b, err := os.ReadFile(filepath.Join(refs, ref)); err != nil || string(b) != commits[ref] {
					t.Errorf("refs/%s: %q %v, want %s", ref, b, err, commits[ref])
				}
			}
			if _, err := os.Stat(filepath.Join(root, "hf", "models--org--repo", "snapshots", commits["main/x"], "w.bin")); err != nil {
				t.Errorf("the left-out ref's snapshot: %v", err)
			}
		})
	}
}

// TestHideHFView: a version taken out of the hf/ view leaves it (its
// snapshot, and its ref), the other artifact of the same repo stays, and
// a store opened again does not bring it back.
func TestHideHFView(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, _, err := cachestore.Open(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	repo := filepath.Join(root, "hf", "models--org--repo")
	for i, name := range []string{"private", "public"} {
		b := storetest.Data(1000+i, byte(i))
		d, err := s.Ingest(ctx, name, bytes.NewReader(b), int64(len(b)), "")
		if err != nil {
			t.Fatal(err)
		}
		ref := []string{"v1", "v2"}[i]
		spec := cachestore.VersionSpec{Name: name, Source: "hf://org/repo@" + ref, Revision: strings.Repeat("ab"[i:i+1], 40), HFRepo: "org/repo", HFRef: ref,
			Manifest: cachestore.Manifest{{Path: "w.bin", Digest: d, Size: int64(len(b))}}}
		if _, err := s.CommitVersion(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.HideHFView("private", ""); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		if _, err := os.Stat(filepath.Join(repo, "snapshots", strings.Repeat("a", 40))); !os.IsNotExist(err) {
			t.Errorf("%s: the hidden version's snapshot: %v", when, err)
		}
		if _, err := os.Stat(filepath.Join(repo, "refs", "v1")); !os.IsNotExist(err) {
			t.Errorf("%s: the hidden version's ref: %v", when, err)
		}
		if _, err := os.Stat(filepath.Join(repo, "snapshots", strings.Repeat("b", 40), "w.bin")); err != nil {
			t.Errorf("%s: the other version's snapshot: %v", when, err)
		}
	}
	check("hidden")
	s.Close()
	if s, _, err = cachestore.Open(ctx, root); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	check("reopened")
}
