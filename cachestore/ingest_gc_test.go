package cachestore_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/cachestore"
)

// TestGCRemovesAbandonedIngests: GC removes the partial ingests its
// predicate gives up on, never one a writer holds open, and keeps those a
// pull may still resume; a dry run only counts them.
func TestGCRemovesAbandonedIngests(t *testing.T) {
	ctx := context.Background()
	gone := map[string]bool{"lost": true, "busy": true}
	s, _, err := cachestore.Open(ctx, t.TempDir(), cachestore.WithAbandoned(func(in cachestore.IngestInfo) bool {
		return gone[in.Owner]
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	partial := func(ref, owner string, n int) *cachestore.Writer {
		w, err := s.Writer(ctx, cachestore.WriterOpts{Ref: ref, Size: -1, Owner: owner})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(make([]byte, n)); err != nil {
			t.Fatal(err)
		}
		return w
	}
	partial("a", "lost", 5000).Close()
	partial("b", "kept", 7000).Close()
	partial("c", "", 3000).Close()
	busy := partial("d", "busy", 1000) // open: not removable whatever its owner

	list, err := s.ListIngests()
	if err != nil || len(list) != 4 {
		t.Fatalf("ListIngests: %+v %v", list, err)
	}
	for _, in := range list {
		if in.Open != (in.Ref == "d") || (in.Ref == "a" && (in.Owner != "lost" || in.Size != 5000)) {
			t.Fatalf("ingest %+v", in)
		}
	}
	dry, err := s.GCDryRun(ctx)
	if err != nil || dry.IngestsRemoved != 1 || dry.IngestBytesFreed != 5000 {
		t.Fatalf("dry run: %+v %v", dry, err)
	}
	if ing, _ := s.Ingests(); len(ing) != 4 {
		t.Fatalf("a dry run removed ingests: %v", ing)
	}
	rep, err := s.GC(ctx)
	if err != nil || rep.IngestsRemoved != 1 || rep.IngestBytesFreed != 5000 {
		t.Fatalf("gc: %+v %v", rep, err)
	}
	ing, _ := s.Ingests()
	if _, ok := ing["a"]; ok || len(ing) != 3 {
		t.Fatalf("after gc: %v, want b, c and the open d", ing)
	}
	if err := s.RemoveIngest("d"); !errors.Is(err, cachestore.ErrLocked) {
		t.Fatalf("RemoveIngest of an open ingest: %v, want ErrLocked", err)
	}
	busy.Close()
	if rep, _ := s.GC(ctx); rep.IngestsRemoved != 1 {
		t.Fatalf("gc after the writer closed: %+v", rep)
	}
}

// TestGCBlobs collects only the blobs it is given, and not one a lease
// holds.
func TestGCBlobs(t *testing.T) {
	ctx := context.Background()
	s, _, err := cachestore.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var ds []string
	for _, b := range []string{"one", "two", "three"} {
		d, err := s.Ingest(ctx, b, strings.NewReader(b), int64(len(b)), "")
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	l := s.NewLease()
	l.Hold(ds[2])
	rep, err := s.GCBlobs(ctx, ds[0], ds[2])
	if err != nil || rep.BlobsRemoved != 1 || rep.BytesFreed != 3 {
		t.Fatalf("GCBlobs: %+v %v", rep, err)
	}
	if s.HasBlob(ds[0]) || !s.HasBlob(ds[1]) || !s.HasBlob(ds[2]) {
		t.Fatal("GCBlobs removed other blobs than the unheld one it was given")
	}
	l.Release()
	if rep, _ := s.GCBlobs(ctx, ds[2]); rep.BlobsRemoved != 1 || s.HasBlob(ds[2]) {
		t.Fatalf("after the lease: %+v", rep)
	}
}

// TestSweepNeverTakesAnIngestBeingCommitted: an abandoned ingest (an
// archive member) stays open from its writer's start to its adoption as a
// blob, so a sweep that runs while its commit syncs (the slow part) cannot
// remove its data from under the rename.
func TestSweepNeverTakesAnIngestBeingCommitted(t *testing.T) {
	ctx := context.Background()
	var s *cachestore.Store
	swept := map[string]int{}
	sweep := func(point string) {
		if point == "batch.sync" || point == "ingest.fsync" {
			n, _ := s.RemoveAbandoned()
			swept[point] += n
		}
	}
	s, _, err := cachestore.Open(ctx, t.TempDir(), cachestore.WithHook(sweep),
		cachestore.WithAbandoned(func(cachestore.IngestInfo) bool { return true }))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	write := func(ref, body string) *cachestore.Writer {
		w, err := s.Writer(ctx, cachestore.WriterOpts{Ref: ref, Size: int64(len(body))})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
		return w
	}
	ws := []*cachestore.Writer{write("layer:m1", "one"), write("layer:m2", "two")}
	dgs, err := s.CommitBatch(ctx, ws, []int64{3, 3})
	if err != nil {
		t.Fatalf("a batch swept while it synced: %v", err)
	}
	if dg, err := write("layer:big", "three").Commit(ctx, 5, ""); err != nil {
		t.Fatalf("a commit swept while it synced: %v", err)
	} else {
		dgs = append(dgs, dg)
	}
	for _, dg := range dgs {
		if !s.HasBlob(dg) {
			t.Fatalf("blob %s missing", dg)
		}
	}
	if swept["batch.sync"] != 0 || swept["ingest.fsync"] != 0 {
		t.Fatalf("sweeps removed ingests being committed: %v", swept)
	}
	if ing, _ := s.Ingests(); len(ing) != 0 {
		t.Fatalf("ingests left after the commits: %v", ing)
	}
}
