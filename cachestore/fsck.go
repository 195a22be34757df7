package cachestore

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	bolt "go.etcd.io/bbolt"
)

// Fsck checks that the index, the blobs and the trees agree, without
// rehashing (Verify rehashes): every Ready version's blobs exist with
// their size and a record; its tree holds exactly its manifest's paths,
// each a hardlink to its blob; `current` points at a Ready version; no
// tree exists that the index does not know; no blob record lacks its
// file; every Xet chunk term of a recorded blob lies within it (terms of
// blobs not recorded are not problems: XetChunks never answers from
// them, and GC drops them). It holds the store's lock, so it sees no commit half-way.
// Problems are sentences naming what is wrong; none means clean.
func (s *Store) Fsck() ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	arts, err := s.List()
	if err != nil {
		return nil, err
	}
	f := &fscker{s: s, known: map[string]bool{}}
	if err := f.blobRecords(); err != nil {
		return nil, err
	}
	for _, a := range arts {
		for _, v := range a.Versions {
			f.version(a.Name, v)
		}
		f.current(a)
	}
	f.unknownTrees()
	if err := f.xetTerms(); err != nil {
		return nil, err
	}
	sort.Strings(f.probs)
	return f.probs, nil
}

// fscker is one run of Fsck, with the store's lock held.
type fscker struct {
	s       *Store
	probs   []string
	records map[string]int64 // blob digest → size, as the index records it
	known   map[string]bool  // the trees of recorded versions: kind dir/name/rev
}

func (f *fscker) bad(format string, a ...any) { f.probs = append(f.probs, fmt.Sprintf(format, a...)) }

// blobRecords reads the blob records and checks each against its file.
func (f *fscker) blobRecords() error {
	f.records = map[string]int64{}
	if err := f.s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketBlobs).ForEach(func(k, raw []byte) error {
			var r blobRecord
			if err := json.Unmarshal(raw, &r); err != nil {
				f.bad("blob record %s is unreadable: %v", k, err)
				return nil
			}
			f.records[string(k)] = r.Size
			return nil
		})
	}); err != nil {
		return err
	}
	for d, size := range f.records {
		p, _ := f.s.BlobPath(d)
		fi, err := os.Stat(p)
		switch {
		case err != nil:
			f.bad("blob %s is in the index but not on disk", d)
		case fi.Size() != size:
			f.bad("blob %s is %d bytes on disk, %d in the index", d, fi.Size(), size)
		}
	}
	return nil
}

// version checks that a Ready version's blobs exist with their size and
// a record, and that its tree holds exactly its manifest's paths, each a
// hardlink to its blob.
func (f *fscker) version(name string, v Version) {
	base, err := f.s.treeBase(v.Kind, name)
	if err != nil {
		f.bad("%s@%s: %v", name, v.Revision, err)
		return
	}
	tree := filepath.Join(base, name, v.Revision)
	f.known[tree] = true
	if v.State != StateReady {
		return
	}
	want := map[string]bool{}
	for _, e := range v.Manifest {
		want[e.Path] = true
		f.entry(name, v.Revision, tree, e)
	}
	filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(tree, p)
		if !want[filepath.ToSlash(rel)] {
			f.bad("%s@%s: %s is in the tree but not in the manifest", name, v.Revision, filepath.ToSlash(rel))
		}
		return nil
	})
}

// entry checks one manifest entry of name@rev: its blob, its record and
// its hardlink in the tree.
func (f *fscker) entry(name, rev, tree string, e Entry) {
	bp, _ := f.s.BlobPath(e.Digest)
	bfi, err := os.Stat(bp)
	if err != nil {
		f.bad("%s@%s: %s: blob %s missing", name, rev, e.Path, e.Digest)
		return
	}
	if _, ok := f.records[e.Digest]; !ok {
		f.bad("%s@%s: %s: blob %s has no index record", name, rev, e.Path, e.Digest)
	}
	if bfi.Size() != e.Size {
		f.bad("%s@%s: %s: blob is %d bytes, the manifest says %d", name, rev, e.Path, bfi.Size(), e.Size)
	}
	tfi, err := os.Lstat(filepath.Join(tree, filepath.FromSlash(e.Path)))
	if err != nil {
		f.bad("%s@%s: %s is missing from the tree", name, rev, e.Path)
		return
	}
	if !os.SameFile(bfi, tfi) {
		f.bad("%s@%s: %s is not the blob %s (not a hardlink to it)", name, rev, e.Path, e.Digest)
	}
}

// current checks that an artifact's current revision is a Ready version.
func (f *fscker) current(a Artifact) {
	if a.Current == "" {
		return
	}
	for _, v := range a.Versions {
		if v.Revision == a.Current && v.State == StateReady {
			return
		}
	}
	f.bad("%s: current revision %s is not a Ready version", a.Name, a.Current)
}

// unknownTrees finds trees and current links on disk that the index does
// not know.
func (f *fscker) unknownTrees() {
	for _, b := range f.s.artifactBases() {
		base, dir := b.dir, b.rel(f.s.root)
		names, _ := os.ReadDir(base)
		for _, n := range names {
			revs, _ := os.ReadDir(filepath.Join(base, n.Name()))
			for _, r := range revs {
				p := filepath.Join(base, n.Name(), r.Name())
				if r.Name() == currentLink {
					target, err := os.Readlink(p)
					if err != nil || !f.known[filepath.Join(base, n.Name(), target)] {
						f.bad("%s/%s/current points at %q, which the index does not know", dir, n.Name(), target)
					}
					continue
				}
				if !f.known[p] {
					f.bad("%s/%s/%s is on disk but not in the index", dir, n.Name(), r.Name())
				}
			}
		}
	}
}

// xetTerms checks that the chunk terms of recorded blobs are readable and
// lie within their blob.
func (f *fscker) xetTerms() error {
	return f.s.db.View(func(tx *bolt.Tx) error {
		xb := tx.Bucket(bucketXet)
		return xb.ForEachBucket(func(x []byte) error {
			return xb.Bucket(x).ForEach(func(k, v []byte) error {
				if len(k) <= 8 {
					f.bad("xet term %x of xorb %s has a malformed key", k, x)
					return nil
				}
				blob := string(k[8:])
				size, ok := f.records[blob]
				if !ok {
					return nil
				}
				var p xetPlace
				n, err := int64(0), json.Unmarshal(v, &p)
				if err == nil {
					n, err = spanLen(p.ChunkLens)
				}
				first, end := binary.BigEndian.Uint32(k), binary.BigEndian.Uint32(k[4:])
				switch {
				case err != nil || len(p.ChunkLens) != int(end-first) || p.Offset < 0:
					f.bad("blob %s: xet term of xorb %s chunks [%d, %d) is unreadable (%v)", blob, x, first, end, err)
				case p.Offset+n > size:
					f.bad("blob %s: xet term of xorb %s chunks [%d, %d) ends at byte %d of a %d-byte blob", blob, x, first, end, p.Offset+n, size)
				}
				return nil
			})
		})
	})
}
