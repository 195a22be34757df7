package cachestore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/cachestore/storetest"
)

// populate fills a store with enough artifacts that index.db spans many
// pages, plus the kinds a rebuild must tell apart: a model with two
// revisions (the older one current), a kernel cache and an HF version.
func populate(t *testing.T, root string) map[string]cachestore.Version {
	t.Helper()
	ctx := context.Background()
	s, _, err := cachestore.Open(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	commit := func(spec cachestore.VersionSpec, files map[string][]byte) {
		for p, b := range files {
			d, err := s.Ingest(ctx, spec.Name+"/"+spec.Revision+"/"+p, bytes.NewReader(b), int64(len(b)), "")
			if err != nil {
				t.Fatal(err)
			}
			e := cachestore.Entry{Path: p, Digest: d, Size: int64(len(b))}
			if spec.HFRepo != "" && strings.HasSuffix(p, ".json") {
				e.Etag = "0123456789abcdef0123456789abcdef01234567" // a git blob sha1, as the hub names small files
			}
			spec.Manifest = append(spec.Manifest, e)
		}
		if _, err := s.CommitVersion(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	// Many versions sharing a few blobs: an index of many pages, few fsyncs.
	var bulk cachestore.Manifest
	for j := 0; j < 8; j++ {
		b := storetest.Data(64+j, byte(j))
		d, err := s.Ingest(ctx, fmt.Sprint("bulk", j), bytes.NewReader(b), int64(len(b)), "")
		if err != nil {
			t.Fatal(err)
		}
		for k := 0; k < 25; k++ {
			bulk = append(bulk, cachestore.Entry{Path: fmt.Sprintf("shard%d/f%02d.bin", k, j), Digest: d, Size: int64(len(b))})
		}
	}
	for i := 0; i < 30; i++ {
		if _, err := s.CommitVersion(ctx, cachestore.VersionSpec{Name: fmt.Sprintf("bulk%02d", i), Source: "test://bulk", Revision: "r1", Manifest: bulk}); err != nil {
			t.Fatal(err)
		}
	}
	shared := storetest.Data(5000, 200)
	commit(cachestore.VersionSpec{Name: "a", Source: "test://a", Revision: "r1"}, map[string][]byte{"w.bin": shared, "config.json": []byte(`{"model_type":"llama"}`)})
	commit(cachestore.VersionSpec{Name: "a", Source: "test://a", Revision: "r2"}, map[string][]byte{"w.bin": storetest.Data(5000, 201), "config.json": []byte(`{"model_type":"llama"}`)})
	commit(cachestore.VersionSpec{Name: "a", Source: "test://a", Revision: "r1"}, map[string][]byte{"w.bin": shared, "config.json": []byte(`{"model_type":"llama"}`)}) // r1 current again
	// The newest tree is r2, the current link says r1: the link must win.
	future := time.Now().Add(time.Hour)
	os.Chtimes(filepath.Join(root, "models", "a", "r2"), future, future)
	commit(cachestore.VersionSpec{Name: "k", Kind: cachestore.KindKernelCache, Source: "test://k", Revision: strings.Repeat("c", 64)}, map[string][]byte{"triton/x.cubin": storetest.Data(3000, 202)})
	commit(cachestore.VersionSpec{Name: "h", Source: "hf://org/repo", Revision: strings.Repeat("a", 40), HFRepo: "org/repo", HFRef: "main"},
		map[string][]byte{"model.safetensors": storetest.Data(4000, 203), "config.json": []byte(`{}`)})
	arts, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]cachestore.Version{}
	for _, a := range arts {
		for _, v := range a.Versions {
			out[a.Name+"@"+v.Revision] = v
		}
	}
	return out
}

// open calls cachestore.Open and turns a panic into a test failure, so a
// regression shows as a message rather than a dead test binary.
func openNoPanic(t *testing.T, root string) (s *cachestore.Store, rep *cachestore.RepairReport, err error) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("Open panicked on a damaged index: %v", r)
		}
	}()
	return cachestore.Open(context.Background(), root, cachestore.WithLockTimeout(100*time.Millisecond))
}

// checkRebuilt asserts that every version of before is back Ready with
// the same manifest digest, trees and currents intact.
func checkRebuilt(t *testing.T, root string, s *cachestore.Store, before map[string]cachestore.Version) {
	t.Helper()
	arts, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]cachestore.Version{}
	current := map[string]string{}
	for _, a := range arts {
		current[a.Name] = a.Current
		for _, v := range a.Versions {
			got[a.Name+"@"+v.Revision] = v
		}
	}
	for k, want := range before {
		v, ok := got[k]
		if !ok {
			t.Errorf("%s: not rebuilt", k)
			continue
		}
		if v.State != cachestore.StateReady || v.ManifestDigest != want.ManifestDigest || v.Kind != want.Kind || v.Bytes != want.Bytes {
			t.Errorf("%s: rebuilt as %s %s kind %s %d bytes, want Ready %s kind %s %d bytes", k, v.State, v.ManifestDigest, v.Kind, v.Bytes, want.ManifestDigest, want.Kind, want.Bytes)
		}
	}
	if len(got) != len(before) {
		t.Errorf("%d versions after the rebuild, want %d", len(got), len(before))
	}
	if current["a"] != "r1" {
		t.Errorf("current of a is %q, want r1 (what the current link said)", current["a"])
	}
	if h := got["h@"+strings.Repeat("a", 40)]; h.HFRepo != "org/repo" || h.HFRef != "main" {
		t.Errorf("hf version rebuilt with repo %q ref %q, want org/repo main", h.HFRepo, h.HFRef)
	} else {
		for _, e := range h.Manifest {
			if e.Path == "config.json" && e.Etag != "0123456789abcdef0123456789abcdef01234567" {
				t.Errorf("hf etag of config.json: %q", e.Etag)
			}
		}
	}
	if b, err := os.ReadFile(filepath.Join(root, "models", "a", "current", "w.bin")); err != nil || !bytes.Equal(b, storetest.Data(5000, 200)) {
		t.Errorf("models/a/current/w.bin after the rebuild: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "hf", "models--org--repo", "snapshots", strings.Repeat("a", 40), "config.json")); err != nil {
		t.Errorf("hf view after the rebuild: %v", err)
	}
	rep, err := s.GCDryRun(context.Background())
	if err != nil || rep.BlobsRemoved != 0 {
		t.Errorf("GC after the rebuild would remove %d blobs (%v); every blob is in a tree", rep.BlobsRemoved, err)
	}
}

// An emptied or deleted index.db over a store full of trees: Open rebuilds
// the index from the trees and blobs, it does not delete every tree the
// new, empty index does not know.
func TestLostIndexIsRebuiltFromDisk(t *testing.T) {
	for _, how := range []string{"truncated to zero", "deleted"} {
		t.Run(how, func(t *testing.T) {
			root := t.TempDir()
			before := populate(t, root)
			idx := filepath.Join(root, "index.db")
			if how == "deleted" {
				os.Remove(idx)
			} else {
				os.Truncate(idx, 0)
			}
			// A tree that is not the store's (a symlink inside) is set aside, not deleted.
			odd := filepath.Join(root, "models", "odd", "r1")
			os.MkdirAll(odd, 0o755)
			os.Symlink("/etc/passwd", filepath.Join(odd, "passwd"))

			s, rep, err := openNoPanic(t, root)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if rep.IndexRebuilt == nil || len(rep.IndexRebuilt.Versions) != len(before) || rep.Clean() {
				t.Fatalf("repair report %+v: want the index rebuilt with %d versions", rep, len(before))
			}
			if len(rep.IndexRebuilt.Quarantined) != 1 {
				t.Errorf("quarantined %v: want the odd tree", rep.IndexRebuilt.Quarantined)
			}
			if ents, _ := os.ReadDir(filepath.Join(root, "quarantine")); len(ents) != 1 {
				t.Errorf("quarantine holds %d entries, want the odd tree", len(ents))
			}
			checkRebuilt(t, root, s, before)
		})
	}
}

// A damaged index.db is a named error that says what to do, not a panic
// (a crash loop under systemd) and not an empty store; following the
// remedy it gives gets every version back.
func TestDamagedIndexIsANamedError(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(p string, size int64)
	}{
		{"truncated to half", func(p string, size int64) { os.Truncate(p, size/2) }},
		{"meta pages zeroed", func(p string, size int64) {
			f, _ := os.OpenFile(p, os.O_WRONLY, 0)
			f.WriteAt(make([]byte, 8192), 0)
			f.Close()
		}},
		{"pages overwritten", func(p string, size int64) {
			f, _ := os.OpenFile(p, os.O_WRONLY, 0)
			junk := bytes.Repeat([]byte{0xA5, 0x17, 0xFF, 0x00}, int(size/4))
			f.WriteAt(junk[:size-8192], 8192) // every page after the two meta pages
			f.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			before := populate(t, root)
			idx := filepath.Join(root, "index.db")
			fi, err := os.Stat(idx)
			if err != nil || fi.Size() < 64<<10 {
				t.Fatalf("index %v %v: want one of many pages", fi, err)
			}
			tc.damage(idx, fi.Size())
			s, _, err := openNoPanic(t, root)
			if err == nil {
				s.Close()
				t.Fatal("a damaged index opened without an error")
			}
			if !errors.Is(err, cachestore.ErrIndexDamaged) || !strings.Contains(err.Error(), "mv "+idx) {
				t.Fatalf("error %q: want ErrIndexDamaged naming the file and the remedy", err)
			}
			t.Logf("%s: index %d bytes: %v", tc.name, fi.Size(), err)
			if _, serr := os.Stat(filepath.Join(root, "models", "a", "r1", "w.bin")); serr != nil {
				t.Fatalf("a tree went with the index: %v", serr)
			}
			// The remedy: move the file aside and start again.
			if err := os.Rename(idx, idx+".damaged"); err != nil {
				t.Fatal(err)
			}
			s, rep, err := openNoPanic(t, root)
			if err != nil {
				t.Fatalf("open after moving the damaged index aside: %v", err)
			}
			defer s.Close()
			if rep.IndexRebuilt == nil {
				t.Fatalf("report %+v: want the index rebuilt", rep)
			}
			checkRebuilt(t, root, s, before)
		})
	}
}
