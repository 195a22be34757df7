// Package storetest is the conformance suite of cachestore.Store: every
// configuration of the store (O_DIRECT or buffered, any filesystem) must
// pass it. Call Run from a test with a function that opens a fresh store.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/modelcache/modelcache/cachestore"
)

// Opener opens a store at root (a fresh directory, or one opened before).
type Opener func(t *testing.T, root string) *cachestore.Store

// Run runs the conformance suite.
func Run(t *testing.T, open Opener) {
	t.Run("IngestCommitRead", func(t *testing.T) { testIngest(t, open) })
	t.Run("ResumeByRef", func(t *testing.T) { testResume(t, open) })
	t.Run("DigestAndSizeMismatch", func(t *testing.T) { testMismatch(t, open) })
	t.Run("DedupSharedBlob", func(t *testing.T) { testDedup(t, open) })
	t.Run("CommitVersionTree", func(t *testing.T) { testCommitTree(t, open) })
	t.Run("ExpectedManifestDigest", func(t *testing.T) { testExpectedDigest(t, open) })
	t.Run("NewRevisionSwapsCurrent", func(t *testing.T) { testSwap(t, open) })
	t.Run("EvictAndGC", func(t *testing.T) { testEvictGC(t, open) })
	t.Run("VerifyQuarantines", func(t *testing.T) { testVerify(t, open) })
	t.Run("ReopenRepairs", func(t *testing.T) { testRepair(t, open) })
}

// Data returns n deterministic bytes that differ by seed.
func Data(n int, seed byte) []byte {
	b := make([]byte, n)
	x := uint32(seed)*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

func ingest(t *testing.T, s *cachestore.Store, ref string, b []byte) string {
	t.Helper()
	d, err := s.Ingest(context.Background(), ref, bytes.NewReader(b), int64(len(b)), cachestore.DigestBytes(b))
	if err != nil {
		t.Fatalf("ingest %s: %v", ref, err)
	}
	return d
}

func testIngest(t *testing.T, open Opener) {
	s := open(t, t.TempDir())
	for _, n := range []int{0, 1, 4095, 4096, 4097, 2<<20 + 17, 5 << 20} {
		b := Data(n, byte(n))
		d := ingest(t, s, "r", b)
		if d != cachestore.DigestBytes(b) {
			t.Fatalf("size %d: digest %s, want %s", n, d, cachestore.DigestBytes(b))
		}
		p, _ := s.BlobPath(d)
		got, err := os.ReadFile(p)
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("size %d: blob content differs (err %v)", n, err)
		}
		fi, _ := os.Stat(p)
		if fi.Mode().Perm() != 0o444 {
			t.Fatalf("blob mode %v, want 0444", fi.Mode().Perm())
		}
	}
	if ing, _ := s.Ingests(); len(ing) != 0 {
		t.Fatalf("ingests left after commit: %v", ing)
	}
}

func testResume(t *testing.T, open Opener) {
	root := t.TempDir()
	s := open(t, root)
	ctx := context.Background()
	b := Data(3<<20+123, 7)
	w, err := s.Writer(ctx, cachestore.WriterOpts{Ref: "res", Size: int64(len(b))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Writer(ctx, cachestore.WriterOpts{Ref: "res", Size: -1}); !errors.Is(err, cachestore.ErrLocked) {
		t.Fatalf("second writer on the same ref: %v, want ErrLocked", err)
	}
	cut := 2<<20 + 5000
	if _, err := w.Write(b[:cut]); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s = open(t, root) // a restart in between keeps the partial data
	w, err = s.Writer(ctx, cachestore.WriterOpts{Ref: "res", Size: int64(len(b))})
	if err != nil {
		t.Fatal(err)
	}
	off := w.Offset()
	if off == 0 || off > int64(cut) || int64(cut)-off >= 4096 {
		t.Fatalf("resumed at %d, want within 4 KiB below %d", off, cut)
	}
	if _, err := w.Write(b[off:]); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Commit(ctx, int64(len(b)), cachestore.DigestBytes(b)); err != nil {
		t.Fatalf("commit after resume: %v", err)
	}
}

func testMismatch(t *testing.T, open Opener) {
	s := open(t, t.TempDir())
	ctx := context.Background()
	b := Data(10000, 3)
	_, err := s.Ingest(ctx, "bad", bytes.NewReader(b), int64(len(b)), cachestore.DigestBytes([]byte("other")))
	if !errors.Is(err, cachestore.ErrDigestMismatch) {
		t.Fatalf("wrong digest: %v, want ErrDigestMismatch", err)
	}
	if s.HasBlob(cachestore.DigestBytes(b)) {
		t.Fatal("a blob with a wrong digest became visible")
	}
	_, err = s.Ingest(ctx, "short", bytes.NewReader(b[:5000]), int64(len(b)), "")
	if !errors.Is(err, cachestore.ErrSizeMismatch) {
		t.Fatalf("short body: %v, want ErrSizeMismatch", err)
	}
	_, err = s.Ingest(ctx, "long", bytes.NewReader(b), 5000, "")
	if !errors.Is(err, cachestore.ErrSizeMismatch) {
		t.Fatalf("long body: %v, want ErrSizeMismatch", err)
	}
	if ing, _ := s.Ingests(); len(ing) != 1 { // "long" is kept for resume; wrong ones are gone
		t.Fatalf("ingests after mismatches: %v", ing)
	}
}

func commit(t *testing.T, s *cachestore.Store, name, rev string, files map[string][]byte) *cachestore.Version {
	t.Helper()
	var m cachestore.Manifest
	for p, b := range files {
		d := ingest(t, s, name+"/"+p, b)
		m = append(m, cachestore.Entry{Path: p, Digest: d, Size: int64(len(b))})
	}
	v, err := s.CommitVersion(context.Background(), cachestore.VersionSpec{Name: name, Source: "test://" + name, Revision: rev, Manifest: m})
	if err != nil {
		t.Fatalf("commit %s: %v", name, err)
	}
	return v
}

func testDedup(t *testing.T, open Opener) {
	s := open(t, t.TempDir())
	shared := Data(100000, 1)
	commit(t, s, "a", "r1", map[string][]byte{"w.bin": shared, "a.json": []byte("{}")})
	commit(t, s, "b", "r1", map[string][]byte{"model/w.bin": shared, "b.json": []byte("[]")})
	u, err := s.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if u.Blobs != 3 || u.StoreBytes != int64(len(shared))+4 {
		t.Fatalf("usage %+v: want 3 blobs, %d bytes", u, len(shared)+4)
	}
	for _, a := range u.Artifacts {
		if a.Shared != int64(len(shared)) || a.Unique != 2 {
			t.Fatalf("artifact usage %+v: want shared %d unique 2", a, len(shared))
		}
	}
	fa, _ := os.Stat(filepath.Join(s.Root(), "models/a/current/w.bin"))
	fb, _ := os.Stat(filepath.Join(s.Root(), "models/b/current/model/w.bin"))
	if !os.SameFile(fa, fb) {
		t.Fatal("a shared file is not one inode in both trees")
	}
}

func testCommitTree(t *testing.T, open Opener) {
	s := open(t, t.TempDir())
	files := map[string][]byte{"config.json": []byte(`{"a":1}`), "sub/dir/x.safetensors": Data(9000, 2), "sub/y": nil}
	v := commit(t, s, "m", "", files)
	if v.Revision != v.ManifestDigest[len("sha256:"):] {
		t.Fatalf("revision %q, want the manifest digest hex", v.Revision)
	}
	for p, b := range files {
		got, err := os.ReadFile(filepath.Join(s.Root(), "models/m/current", p))
		if err != nil || !bytes.Equal(got, b) {
			t.Fatalf("%s through current: %v", p, err)
		}
	}
	a, err := s.Get("m")
	if err != nil || a.Current != v.Revision || a.Versions[0].State != cachestore.StateReady || a.Versions[0].Bytes != 9007 {
		t.Fatalf("get: %+v %v", a, err)
	}
	// A manifest naming a blob that is not there commits nothing.
	_, err = s.CommitVersion(context.Background(), cachestore.VersionSpec{Name: "n", Revision: "r", Manifest: cachestore.Manifest{{Path: "x", Digest: cachestore.DigestBytes([]byte("absent")), Size: 6}}})
	if !errors.Is(err, cachestore.ErrNotFound) {
		t.Fatalf("commit with a missing blob: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(s.Root(), "models/n")); err == nil {
		t.Fatal("a failed commit left a visible tree")
	}
}

func testExpectedDigest(t *testing.T, open Opener) {
	s := open(t, t.TempDir())
	d := ingest(t, s, "x", []byte("hello"))
	m := cachestore.Manifest{{Path: "h.txt", Digest: d, Size: 5}}
	m2 := append(cachestore.Manifest(nil), m...)
	m2.Validate()
	_, err := s.CommitVersion(context.Background(), cachestore.VersionSpec{Name: "e", Manifest: m, ExpectedDigest: cachestore.DigestBytes([]byte("nope"))})
	if !errors.Is(err, cachestore.ErrDigestMismatch) {
		t.Fatalf("wrong folder checksum: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(s.Root(), "models/e")); err == nil {
		t.Fatal("a rejected commit left a visible tree")
	}
	if _, err := s.CommitVersion(context.Background(), cachestore.VersionSpec{Name: "e", Manifest: m, ExpectedDigest: m2.Digest()}); err != nil {
		t.Fatalf("right folder checksum: %v", err)
	}
}

func testSwap(t *testing.T, open Opener) {
	s := open(t, t.TempDir())
	commit(t, s, "m", "r1", map[string][]byte{"f": []byte("one")})
	commit(t, s, "m", "r2", map[string][]byte{"f": []byte("two")})
	got, _ := os.ReadFile(filepath.Join(s.Root(), "models/m/current/f"))
	if string(got) != "two" {
		t.Fatalf("current/f = %q, want two", got)
	}
	if got, _ := os.ReadFile(filepath.Join(s.Root(), "models/m/r1/f")); string(got) != "one" {
		t.Fatalf("old revision not kept: %q", got)
	}
	a, _ := s.Get("m")
	if a.Current != "r2" || len(a.Versions) != 2 {
		t.Fatalf("artifact %+v", a)
	}
}

func testEvictGC(t *testing.T, open Opener) {
	s := open(t, t.TempDir())
	ctx := context.Background()
	shared := Data(5000, 9)
	commit(t, s, "a", "r", map[string][]byte{"s": shared, "only-a": []byte("a")})
	commit(t, s, "b", "r", map[string][]byte{"s": shared})
	if err := s.SetPinned("a", "", true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Evict(ctx, "a", "", false); !errors.Is(err, cachestore.ErrPinned) {
		t.Fatalf("evict pinned: %v", err)
	}
	s.SetPinned("a", "", false)
	if _, err := s.Evict(ctx, "a", "", false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(s.Root(), "models/a")); err == nil {
		t.Fatal("evicted tree still visible")
	}
	l := s.NewLease()
	held := ingest(t, s, "held", []byte("held by a pull in flight"))
	l.Hold(held)
	rep, err := s.GC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.BlobsRemoved != 1 || rep.BytesFreed != 1 {
		t.Fatalf("gc %+v: want only a's unique blob removed", rep)
	}
	if !s.HasBlob(cachestore.DigestBytes(shared)) || !s.HasBlob(held) {
		t.Fatal("gc removed a shared or held blob")
	}
	l.Release()
	if rep, _ := s.GC(ctx); rep.BlobsRemoved != 1 {
		t.Fatalf("gc after release %+v", rep)
	}
	if got, _ := os.ReadFile(filepath.Join(s.Root(), "models/b/current/s")); !bytes.Equal(got, shared) {
		t.Fatal("b lost its shared file")
	}
}

func testVerify(t *testing.T, open Opener) {
	s := open(t, t.TempDir())
	ctx := context.Background()
	good := Data(70000, 4)
	v := commit(t, s, "m", "r", map[string][]byte{"w": good, "c.json": []byte("{}")})
	rep, err := s.Verify(ctx, nil, nil)
	if err != nil || len(rep.Corrupt) != 0 || rep.BlobsChecked != 2 {
		t.Fatalf("clean verify: %+v %v", rep, err)
	}
	d := cachestore.DigestBytes(good)
	p, _ := s.BlobPath(d)
	os.Chmod(p, 0o644)
	f, _ := os.OpenFile(p, os.O_WRONLY, 0)
	f.WriteAt([]byte{good[500] ^ 0xff}, 500)
	f.Close()
	rep, err = s.Verify(ctx, []string{"m"}, nil)
	if err != nil || len(rep.Corrupt) != 1 || rep.Corrupt[0] != d || len(rep.Affected) != 1 {
		t.Fatalf("verify after a flipped byte: %+v %v", rep, err)
	}
	if _, err := os.Lstat(filepath.Join(s.Root(), "models/m/r")); err == nil {
		t.Fatal("a tree with a corrupt blob is still visible")
	}
	a, _ := s.Get("m")
	if a.Versions[0].State != cachestore.StateMissing || !strings.Contains(a.Versions[0].Message, "quarantined") {
		t.Fatalf("version after verify: %+v", a.Versions[0])
	}
	// Repair: re-ingest the right bytes and re-commit the same revision.
	ingest(t, s, "again", good)
	if _, err := s.CommitVersion(ctx, cachestore.VersionSpec{Name: "m", Revision: v.Revision, Manifest: v.Manifest}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(s.Root(), "models/m/current/w")); !bytes.Equal(got, good) {
		t.Fatal("repaired file differs")
	}
}

func testRepair(t *testing.T, open Opener) {
	root := t.TempDir()
	s := open(t, root)
	v := commit(t, s, "m", "r", map[string][]byte{"w": Data(3000, 5), "x": []byte("x")})
	commit(t, s, "gone", "r", map[string][]byte{"g": []byte("g-data")})
	s.Close()
	Crashed(t, root)
	// Damage: a stray tree, a deleted tree, a missing blob, a stray temp dir, a wrong link.
	os.MkdirAll(filepath.Join(root, "models/stray/rev"), 0o755)
	os.WriteFile(filepath.Join(root, "models/stray/rev/f"), []byte("unverified"), 0o644)
	os.MkdirAll(filepath.Join(root, "tmp/tree-123"), 0o755)
	os.RemoveAll(filepath.Join(root, "models/m/r"))
	os.Remove(filepath.Join(root, "models/m/current"))
	p, _ := (&storeRoot{root}).blobPath(cachestore.DigestBytes([]byte("g-data")))
	os.Remove(p)

	s = open(t, root)
	if _, err := os.Lstat(filepath.Join(root, "models/stray")); err == nil {
		t.Fatal("a tree without an index record survived repair")
	}
	if got, err := os.ReadFile(filepath.Join(root, "models/m/current/x")); err != nil || string(got) != "x" {
		t.Fatalf("tree of a Ready version not rebuilt: %v", err)
	}
	a, _ := s.Get("gone")
	if a.Versions[0].State != cachestore.StateMissing {
		t.Fatalf("version with a missing blob: %+v", a.Versions[0])
	}
	if _, err := os.Lstat(filepath.Join(root, "models/gone/r")); err == nil {
		t.Fatal("tree with a missing blob still visible")
	}
	if ents, _ := os.ReadDir(filepath.Join(root, "tmp")); len(ents) != 0 {
		t.Fatalf("tmp not emptied: %v", ents)
	}
	_ = v
}

// Crashed makes root's index look like a run that opened the store and
// died: a write transaction since the clean Close makes the clean record
// stale, so the next Open repairs (cachestore doc.go: Clean shutdown).
func Crashed(t *testing.T, root string) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(root, "index.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(func(*bolt.Tx) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

type storeRoot struct{ root string }

func (r *storeRoot) blobPath(d string) (string, error) {
	h, err := cachestore.ParseDigest(d)
	return filepath.Join(r.root, "blobs/sha256", h[:2], h), err
}
