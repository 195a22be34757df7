package cachestore_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/modelcache/modelcache/cachestore"
)

// TestListSummariesFollowsEveryWrite: ListSummaries keeps what it decoded
// for as long as the index is unchanged, yet every write shows at once,
// and what one caller does to its slices no other caller sees.
func TestListSummariesFollowsEveryWrite(t *testing.T) {
	ctx := context.Background()
	s, _, err := cachestore.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	commit := func(name string, body []byte) {
		d, err := s.Ingest(ctx, "r", bytes.NewReader(body), int64(len(body)), cachestore.DigestBytes(body))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.CommitVersion(ctx, cachestore.VersionSpec{Name: name, Manifest: cachestore.Manifest{{Path: "f", Digest: d, Size: int64(len(body))}}}); err != nil {
			t.Fatal(err)
		}
	}
	commit("a", []byte("one"))
	first, err := s.ListSummaries()
	if err != nil || len(first) != 1 || first[0].Versions[0].Pinned {
		t.Fatalf("first list: %+v %v", first, err)
	}
	first[0].Versions[0].Pinned = true // the caller's copy
	first[0].Versions = nil
	again, _ := s.ListSummaries()
	if len(again) != 1 || len(again[0].Versions) != 1 || again[0].Versions[0].Pinned {
		t.Fatalf("a caller's change reached the next caller: %+v", again)
	}

	if err := s.SetPinned("a", "", true); err != nil {
		t.Fatal(err)
	}
	commit("b", []byte("two"))
	after, _ := s.ListSummaries()
	if len(after) != 2 || after[0].Name != "a" || !after[0].Versions[0].Pinned || after[1].Name != "b" {
		t.Fatalf("list after a pin and a commit: %+v", after)
	}
	if _, err := s.Evict(ctx, "b", "", false); err != nil {
		t.Fatal(err)
	}
	if l, _ := s.ListSummaries(); len(l) != 1 || l[0].Name != "a" {
		t.Fatalf("list after an evict: %+v", l)
	}
}
