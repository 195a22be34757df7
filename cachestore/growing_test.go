package cachestore_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/cachestore/storetest"
)

// isClosed reports whether ch is closed now.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// readGrowing reads g's first n bytes (each of them written already).
func readGrowing(t *testing.T, g *cachestore.Growing, n int64) []byte {
	t.Helper()
	b := make([]byte, n)
	if k, err := g.ReadAt(b, 0); int64(k) != n || (err != nil && err != io.EOF) {
		t.Fatalf("read %d of %d written bytes: %v", k, n, err)
	}
	return b
}

// A Writer opened with the blob's digest is readable as it grows: by
// whole buffers, each written and hashed, up to what Commit checks; a
// watch of the digest hears it open and hears the commit.
func TestGrowingFollowsWriter(t *testing.T) {
	ctx := context.Background()
	s, _, err := cachestore.Open(ctx, t.TempDir(), cachestore.WithWriteBuffer(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	data := storetest.Data(300<<10, 3) // four buffers and a part
	d := cachestore.DigestBytes(data)

	if _, err := s.OpenGrowing(d); !errors.Is(err, cachestore.ErrNotFound) {
		t.Fatalf("before any writer: %v, want ErrNotFound", err)
	}
	opened, stop := s.WatchBlob(d)
	defer stop()
	w, err := s.Writer(ctx, cachestore.WriterOpts{Ref: "r", Size: int64(len(data)), Digest: d})
	if err != nil {
		t.Fatal(err)
	}
	if !isClosed(opened) {
		t.Fatal("the watch of the digest was not told that a writer opened")
	}
	g, err := s.OpenGrowing(d)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if g.Size() != int64(len(data)) || g.Written() != 0 {
		t.Fatalf("size %d written %d, want %d and 0", g.Size(), g.Written(), len(data))
	}
	if _, err := w.Write(data[:100<<10]); err != nil { // one full buffer and a part
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	n, err := g.Wait(wctx, 0)
	if err != nil || n != 64<<10 {
		t.Fatalf("after a buffer and a part: %d bytes readable (%v), want the one whole buffer", n, err)
	}
	if got := readGrowing(t, g, n); !bytes.Equal(got, data[:n]) {
		t.Fatal("the growing blob's bytes differ from what was written")
	}
	if k, err := g.ReadAt(make([]byte, 10), n-5); k != 5 || err != io.EOF {
		t.Fatalf("a read past what is written: %d bytes, %v; want 5 and EOF", k, err)
	}
	grown, stop2 := s.WatchBlob(d)
	defer stop2()
	if _, err := w.Write(data[100<<10:]); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Wait(wctx, n); err != nil {
		t.Fatal(err)
	}
	if !isClosed(grown) {
		t.Fatal("the watch of the digest was not told that the blob grew")
	}
	if _, err := w.Commit(ctx, int64(len(data)), d); err != nil {
		t.Fatal(err)
	}
	if err := g.Whole(wctx); err != nil {
		t.Fatalf("Whole after the commit: %v", err)
	}
	if n, err = g.Wait(wctx, n); err != nil || n != int64(len(data)) {
		t.Fatalf("after the commit: %d bytes readable (%v), want all %d", n, err, len(data))
	}
	if got := readGrowing(t, g, n); !bytes.Equal(got, data) {
		t.Fatal("the growing blob read after its commit differs from the data")
	}
	if _, err := s.OpenGrowing(d); !errors.Is(err, cachestore.ErrNotFound) {
		t.Fatalf("after the commit: %v, want ErrNotFound (the blob is in blobs/)", err)
	}

	// A blob committed by a writer no reader follows is told too.
	other := storetest.Data(1000, 6)
	committed, stop3 := s.WatchBlob(cachestore.DigestBytes(other))
	defer stop3()
	if _, err := s.Ingest(ctx, "other", bytes.NewReader(other), 1000, ""); err != nil {
		t.Fatal(err)
	}
	if !isClosed(committed) {
		t.Fatal("the watch of a digest was not told of its commit")
	}
}

// A writer that stops early ends its readers with ErrIngestEnded once
// they read what it wrote; one whose commit finds the bytes wrong ends
// them with ErrDigestMismatch at once. A resumed writer starts its
// readers at what it kept.
func TestGrowingEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	s, _, err := cachestore.Open(ctx, t.TempDir(), cachestore.WithWriteBuffer(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	data := storetest.Data(200<<10, 4)
	d := cachestore.DigestBytes(data)
	opts := cachestore.WriterOpts{Ref: "r", Size: int64(len(data)), Digest: d}

	w, err := s.Writer(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	g, err := s.OpenGrowing(d)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	w.Write(data[:70<<10])
	w.Close() // kept for a resume: its tail is written as it closes
	if n, err := g.Wait(ctx, 0); err != nil || n != 70<<10 {
		t.Fatalf("after close: %d readable (%v), want the 70 KiB written", n, err)
	}
	if n, err := g.Wait(ctx, 70<<10); !errors.Is(err, cachestore.ErrIngestEnded) || n != 70<<10 {
		t.Fatalf("past the end of a closed writer: %d, %v; want ErrIngestEnded", n, err)
	}
	if err := g.Whole(ctx); !errors.Is(err, cachestore.ErrIngestEnded) {
		t.Fatalf("Whole of a closed writer: %v, want ErrIngestEnded", err)
	}

	w, err = s.Writer(ctx, opts) // resumes at 68 KiB (a 4 KiB boundary)
	if err != nil {
		t.Fatal(err)
	}
	g2, err := s.OpenGrowing(d)
	if err != nil {
		t.Fatal(err)
	}
	defer g2.Close()
	if g2.Written() != w.Offset() || w.Offset() != 68<<10 {
		t.Fatalf("a resumed writer's readers start at %d, its offset %d; want 68 KiB", g2.Written(), w.Offset())
	}
	bad := bytes.Clone(data[w.Offset():])
	bad[0] ^= 1
	w.Write(bad)
	if _, err := w.Commit(ctx, int64(len(data)), d); !errors.Is(err, cachestore.ErrDigestMismatch) {
		t.Fatalf("commit of flipped bytes: %v", err)
	}
	if _, err := g2.Wait(ctx, 0); !errors.Is(err, cachestore.ErrDigestMismatch) {
		t.Fatalf("a reader of bytes the commit refused: %v, want ErrDigestMismatch", err)
	}
	if err := g2.Whole(ctx); !errors.Is(err, cachestore.ErrDigestMismatch) {
		t.Fatalf("Whole of bytes the commit refused: %v, want ErrDigestMismatch", err)
	}
	if _, err := s.OpenGrowing(d); !errors.Is(err, cachestore.ErrNotFound) {
		t.Fatalf("after the refused commit: %v, want ErrNotFound", err)
	}
}

// A writer without a digest (or of unknown size) is not readable, and a
// malformed digest is refused.
func TestGrowingOnlyWithDigest(t *testing.T) {
	ctx := context.Background()
	s, _, err := cachestore.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	data := storetest.Data(1000, 5)
	d := cachestore.DigestBytes(data)
	for _, o := range []cachestore.WriterOpts{{Ref: "a", Size: 1000}, {Ref: "b", Size: -1, Digest: d}} {
		w, err := s.Writer(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.OpenGrowing(d); !errors.Is(err, cachestore.ErrNotFound) {
			t.Errorf("%+v: %v, want ErrNotFound", o, err)
		}
		w.Abort()
	}
	if _, err := s.Writer(ctx, cachestore.WriterOpts{Ref: "c", Size: 1, Digest: "sha256:xyz"}); !errors.Is(err, cachestore.ErrInvalidDigest) {
		t.Errorf("a malformed digest: %v", err)
	}
}

// A blob readers follow, fed slowly through ReadFrom, shows its bytes to
// them within moments, not once a buffer fills: with O_DIRECT a whole
// number of blocks (the rest of the last block starts the next buffer),
// without it all of them; either way the blob commits whole and right.
func TestGrowingShowsASlowSourceSoon(t *testing.T) {
	for _, direct := range []bool{false, true} {
		ctx := context.Background()
		s, _, err := cachestore.Open(ctx, t.TempDir(), cachestore.WithWriteBuffer(1<<20), cachestore.WithDirectIO(direct))
		if err != nil {
			t.Fatal(err)
		}
		data := storetest.Data(200<<10, 8)
		d := cachestore.DigestBytes(data)
		w, err := s.Writer(ctx, cachestore.WriterOpts{Ref: "slow", Size: int64(len(data)), Digest: d})
		if err != nil {
			t.Fatal(err)
		}
		g, err := s.OpenGrowing(d)
		if err != nil {
			t.Fatal(err)
		}
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		go func() {
			_, err := w.ReadFrom(pr)
			done <- err
		}()
		pw.Write(data[:10000]) // two blocks and a part, far from a full buffer
		// Then a byte at a time, well apart, until the first 8 KiB show.
		want := int64(10000)
		if direct {
			want = 8192
		}
		deadline := time.Now().Add(time.Minute)
		for g.Written() < want && time.Now().Before(deadline) {
			pw.Write(nil)
			time.Sleep(20 * time.Millisecond)
		}
		if got := g.Written(); got < want {
			t.Fatalf("direct %v: %d of the first 10,000 bytes readable after a minute, want %d", direct, got, want)
		}
		if got := readGrowing(t, g, want); !bytes.Equal(got, data[:want]) {
			t.Fatalf("direct %v: the growing blob's first bytes differ from the data", direct)
		}
		pw.Write(data[10000:])
		pw.Close()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if got, err := w.Commit(ctx, int64(len(data)), d); err != nil || got != d {
			t.Fatalf("direct %v: commit %s, %v", direct, got, err)
		}
		g.Close()
		s.Close()
	}
}
