package cachestore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// xetFixture is a xorb of eight chunks (chunk i: 100+i bytes of 'a'+i)
// and files laid out of its chunks.
type xetFixture struct {
	t    *testing.T
	s    *Store
	root string
	xorb string
}

func newXetFixture(t *testing.T) *xetFixture {
	root := t.TempDir()
	s, _, err := Open(context.Background(), root)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return &xetFixture{t: t, s: s, root: root, xorb: strings.Repeat("0123456789abcdef", 4)}
}

func xetChunk(i uint32) []byte { return bytes.Repeat([]byte{byte('a' + i)}, 100+int(i)) }

// file lays out chunks [first, end) after prefix and returns the file's
// bytes, its digest and the term that says so.
func (f *xetFixture) file(prefix string, first, end uint32) ([]byte, string, XetTerm) {
	b := []byte(prefix)
	term := XetTerm{Xorb: f.xorb, First: first, End: end, Offset: int64(len(prefix))}
	for i := first; i < end; i++ {
		b = append(b, xetChunk(i)...)
		term.ChunkLens = append(term.ChunkLens, uint32(len(xetChunk(i))))
	}
	b = append(b, "trailer"...)
	return b, DigestBytes(b), term
}

func (f *xetFixture) commit(name string, b []byte) {
	f.t.Helper()
	ctx := context.Background()
	d, err := f.s.Ingest(ctx, "t:"+name, bytes.NewReader(b), int64(len(b)), DigestBytes(b))
	if err != nil {
		f.t.Fatal(err)
	}
	if _, err := f.s.CommitVersion(ctx, VersionSpec{Name: name, Source: "test", Manifest: Manifest{{Path: "w.bin", Digest: d, Size: int64(len(b)), Mode: 0o644}}}); err != nil {
		f.t.Fatal(err)
	}
}

// read asks for chunks [first, end); ok false when the store says no.
func (f *xetFixture) read(first, end uint32) ([]byte, bool) {
	f.t.Helper()
	r, lens, ok := f.s.XetChunks(context.Background(), f.xorb, first, end)
	if !ok {
		return nil, false
	}
	for i := first; i < end; i++ { // each chunk's length, as recorded
		if lens[i-first] != uint32(len(xetChunk(i))) {
			f.t.Fatalf("chunks [%d, %d): lengths %v", first, end, lens)
		}
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		f.t.Fatal(err)
	}
	return b, true
}

func wantChunks(first, end uint32) []byte {
	var b []byte
	for i := first; i < end; i++ {
		b = append(b, xetChunk(i)...)
	}
	return b
}

// TestXetChunksStitch: a range two committed blobs hold between them is
// read from both, in order; one chunk beyond what they hold is refused.
func TestXetChunksStitch(t *testing.T) {
	f := newXetFixture(t)
	a, da, ta := f.file("header of a..", 0, 4)
	b, db, tb := f.file("", 3, 8)
	f.commit("a", a)
	f.commit("b", b)
	if err := f.s.RecordXetTerms(da, []XetTerm{ta}); err != nil {
		t.Fatal(err)
	}
	if err := f.s.RecordXetTerms(strings.TrimPrefix(db, DigestPrefix), []XetTerm{tb}); err != nil { // bare hex, as an oid
		t.Fatal(err)
	}
	for _, r := range [][2]uint32{{0, 8}, {1, 7}, {2, 3}, {3, 4}, {5, 8}} {
		got, ok := f.read(r[0], r[1])
		if !ok || !bytes.Equal(got, wantChunks(r[0], r[1])) {
			t.Errorf("chunks [%d, %d): ok %v, %d bytes, want %d", r[0], r[1], ok, len(got), len(wantChunks(r[0], r[1])))
		}
	}
	for _, r := range [][2]uint32{{0, 9}, {8, 9}, {4, 4}, {5, 3}} {
		if _, ok := f.read(r[0], r[1]); ok {
			t.Errorf("chunks [%d, %d) answered; no blob holds them all", r[0], r[1])
		}
	}
	if _, _, ok := f.s.XetChunks(context.Background(), strings.Repeat("f", 64), 0, 1); ok {
		t.Error("an unknown xorb answered")
	}
}

// TestXetChunksOnlyFromCommitted: terms recorded before their blob is
// committed answer nothing until it is; a blob gone (GC), cut short on
// disk or quarantined by verify answers nothing; GC drops its terms.
func TestXetChunksOnlyFromCommitted(t *testing.T) {
	ctx := context.Background()
	f := newXetFixture(t)
	a, da, ta := f.file("x", 0, 4)
	if err := f.s.RecordXetTerms(da, []XetTerm{ta}); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.read(0, 4); ok {
		t.Fatal("answered from a blob not committed")
	}
	// An ingest of those very bytes, written but not committed, is not it.
	w, err := f.s.Writer(ctx, WriterOpts{Ref: "half", Size: int64(len(a))})
	if err != nil {
		t.Fatal(err)
	}
	w.Write(a)
	if _, ok := f.read(0, 4); ok {
		t.Fatal("answered from an ingest in progress")
	}
	w.Close()
	f.commit("a", a)
	if got, ok := f.read(0, 4); !ok || !bytes.Equal(got, wantChunks(0, 4)) {
		t.Fatalf("after the commit: ok %v", ok)
	}

	// Cut short on disk: refused, nothing read past the end.
	p, _ := f.s.BlobPath(da)
	os.Chmod(filepath.Dir(p), 0o755)
	os.Chmod(p, 0o644)
	if err := os.Truncate(p, int64(len(a)-10)); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.read(0, 4); ok {
		t.Fatal("answered from a blob shorter than its record")
	}
	os.WriteFile(p, bytes.ToUpper(a), 0o444) // same size, wrong bytes: verify's to find
	if rep, err := f.s.Verify(ctx, nil, nil); err != nil || len(rep.Corrupt) != 1 {
		t.Fatalf("verify: %+v %v", rep, err)
	}
	if _, ok := f.read(0, 4); ok {
		t.Fatal("answered from a quarantined blob")
	}

	// Committed again, then evicted and collected: terms dropped.
	f.commit("a2", a)
	if _, ok := f.read(0, 4); !ok {
		t.Fatal("recommitted blob does not answer")
	}
	for _, name := range []string{"a", "a2"} {
		if _, err := f.s.Evict(ctx, name, "", true); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := f.s.GC(ctx); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.read(0, 4); ok {
		t.Fatal("answered after GC removed the blob")
	}
	f.s.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketXetBlobs).Get([]byte(da)) != nil || tx.Bucket(bucketXet).Bucket([]byte(f.xorb)) != nil {
			t.Error("GC left the terms of a removed blob")
		}
		return nil
	})
}

// TestXetGCKeepsHeldTerms: terms of a blob a pull still holds (recorded
// before its commit) survive GC.
func TestXetGCKeepsHeldTerms(t *testing.T) {
	f := newXetFixture(t)
	_, da, ta := f.file("x", 0, 2)
	l := f.s.NewLease()
	l.Hold(da)
	if err := f.s.RecordXetTerms(da, []XetTerm{ta}); err != nil {
		t.Fatal(err)
	}
	f.s.GC(context.Background())
	l.Release()
	f.s.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketXetBlobs).Get([]byte(da)) == nil {
			t.Error("GC dropped the terms of a blob a lease holds")
		}
		return nil
	})
	f.s.GC(context.Background())
	f.s.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketXetBlobs).Get([]byte(da)) != nil {
			t.Error("GC kept the terms of a blob never committed and no longer held")
		}
		return nil
	})
}

// TestXetHostileTerms: terms out of bounds are refused whole; lookups out
// of bounds answer nothing; a term recorded before its blob that reaches
// past it never reads outside the blob.
func TestXetHostileTerms(t *testing.T) {
	f := newXetFixture(t)
	a, da, ta := f.file("x", 0, 4)
	f.commit("a", a)
	bad := func(mut func(*XetTerm)) XetTerm {
		t2 := ta
		t2.ChunkLens = append([]uint32(nil), ta.ChunkLens...)
		mut(&t2)
		return t2
	}
	for name, term := range map[string]XetTerm{
		"upper-case xorb":      bad(func(x *XetTerm) { x.Xorb = strings.ToUpper(x.Xorb) }),
		"short xorb":           bad(func(x *XetTerm) { x.Xorb = x.Xorb[:62] }),
		"path in xorb":         bad(func(x *XetTerm) { x.Xorb = "../" + x.Xorb[3:] }),
		"empty range":          bad(func(x *XetTerm) { x.End = x.First }),
		"range past the bound": bad(func(x *XetTerm) { x.First, x.End = MaxXetChunks-3, MaxXetChunks+1 }),
		"lengths not chunks":   bad(func(x *XetTerm) { x.ChunkLens = x.ChunkLens[1:] }),
		"zero chunk":           bad(func(x *XetTerm) { x.ChunkLens[0] = 0 }),
		"chunk too long":       bad(func(x *XetTerm) { x.ChunkLens[0] = MaxXetChunkLen + 1 }),
		"negative offset":      bad(func(x *XetTerm) { x.Offset = -1 }),
		"past the blob":        bad(func(x *XetTerm) { x.Offset = int64(len(a)) }),
	} {
		if err := f.s.RecordXetTerms(da, []XetTerm{ta, term}); !errors.Is(err, ErrInvalidXet) {
			t.Errorf("%s: %v, want ErrInvalidXet", name, err)
		}
	}
	if err := f.s.RecordXetTerms("sha256:nothex", []XetTerm{ta}); !errors.Is(err, ErrInvalidDigest) {
		t.Errorf("bad digest: %v", err)
	}
	if _, ok := f.read(0, 4); ok {
		t.Fatal("a refused batch recorded something")
	}
	for _, q := range []struct {
		xorb       string
		first, end uint32
	}{{"", 0, 1}, {strings.ToUpper(f.xorb), 0, 1}, {f.xorb, 1, 0}, {f.xorb, 0, MaxXetChunks + 1}} {
		if _, _, ok := f.s.XetChunks(context.Background(), q.xorb, q.first, q.end); ok {
			t.Errorf("lookup %q [%d, %d) answered", q.xorb, q.first, q.end)
		}
	}

	// Recorded before the blob exists, reaching past its end: the blob,
	// once committed, is too short for the term, which never answers.
	b, db, tb := f.file("y", 0, 2)
	tb.Offset += 50
	if err := f.s.RecordXetTerms(db, []XetTerm{tb}); err != nil {
		t.Fatal(err)
	}
	f.commit("b", b)
	if _, ok := f.read(0, 2); ok {
		t.Fatal("a term reaching past its blob answered")
	}
	probs, err := f.s.Fsck()
	if err != nil || !strings.Contains(strings.Join(probs, "\n"), "ends at byte") {
		t.Errorf("fsck does not name the term past its blob: %v %v", probs, err)
	}
}

// TestXetLostIndexRebuilds: a store whose index is lost, with xet terms
// in it, rebuilds without them; lookups answer nothing, nothing fails.
func TestXetLostIndexRebuilds(t *testing.T) {
	ctx := context.Background()
	f := newXetFixture(t)
	a, da, ta := f.file("x", 0, 4)
	f.commit("a", a)
	if err := f.s.RecordXetTerms(da, []XetTerm{ta}); err != nil {
		t.Fatal(err)
	}
	f.s.Close()
	os.Remove(filepath.Join(f.root, indexFile))
	s, rep, err := Open(ctx, f.root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if rep.IndexRebuilt == nil || len(rep.IndexRebuilt.Versions) != 1 {
		t.Fatalf("rebuild: %+v", rep.IndexRebuilt)
	}
	if _, _, ok := s.XetChunks(ctx, f.xorb, 0, 4); ok {
		t.Fatal("terms answered after the index that held them was lost")
	}
	if err := s.RecordXetTerms(da, []XetTerm{ta}); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := s.XetChunks(ctx, f.xorb, 0, 4); !ok {
		t.Fatal("terms recorded again do not answer")
	}
	if probs, err := s.Fsck(); err != nil || len(probs) != 0 {
		t.Fatalf("fsck after rebuild: %v %v", probs, err)
	}
}
