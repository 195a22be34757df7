package cachestore

import (
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
// file. It holds the store's lock, so it sees no commit half-way.
// Problems are sentences naming what is wrong; none means clean.
func (s *Store) Fsck() ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	arts, err := s.list(true)
	if err != nil {
		return nil, err
	}
	var probs []string
	bad := func(f string, a ...any) { probs = append(probs, fmt.Sprintf(f, a...)) }
	records := map[string]int64{}
	if err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketBlobs).ForEach(func(k, raw []byte) error {
			var r blobRecord
			if err := json.Unmarshal(raw, &r); err != nil {
				bad("blob record %s is unreadable: %v", k, err)
				return nil
			}
			records[string(k)] = r.Size
			return nil
		})
	}); err != nil {
		return nil, err
	}
	for d, size := range records {
		p, _ := s.BlobPath(d)
		fi, err := os.Stat(p)
		switch {
		case err != nil:
			bad("blob %s is in the index but not on disk", d)
		case fi.Size() != size:
			bad("blob %s is %d bytes on disk, %d in the index", d, fi.Size(), size)
		}
	}
	known := map[string]bool{} // kind dir/name/rev
	for _, a := range arts {
		for _, v := range a.Versions {
			base, err := s.kindDir(v.Kind)
			if err != nil {
				bad("%s@%s: %v", a.Name, v.Revision, err)
				continue
			}
			tree := filepath.Join(base, a.Name, v.Revision)
			known[tree] = true
			if v.State != StateReady {
				continue
			}
			want := map[string]bool{}
			for _, e := range v.Manifest {
				want[e.Path] = true
				bp, _ := s.BlobPath(e.Digest)
				bfi, err := os.Stat(bp)
				if err != nil {
					bad("%s@%s: %s: blob %s missing", a.Name, v.Revision, e.Path, e.Digest)
					continue
				}
				if _, ok := records[e.Digest]; !ok {
					bad("%s@%s: %s: blob %s has no index record", a.Name, v.Revision, e.Path, e.Digest)
				}
				if bfi.Size() != e.Size {
					bad("%s@%s: %s: blob is %d bytes, the manifest says %d", a.Name, v.Revision, e.Path, bfi.Size(), e.Size)
				}
				tfi, err := os.Lstat(filepath.Join(tree, filepath.FromSlash(e.Path)))
				if err != nil {
					bad("%s@%s: %s is missing from the tree", a.Name, v.Revision, e.Path)
					continue
				}
				if !os.SameFile(bfi, tfi) {
					bad("%s@%s: %s is not the blob %s (not a hardlink to it)", a.Name, v.Revision, e.Path, e.Digest)
				}
			}
			filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return nil
				}
				rel, _ := filepath.Rel(tree, p)
				if !want[filepath.ToSlash(rel)] {
					bad("%s@%s: %s is in the tree but not in the manifest", a.Name, v.Revision, filepath.ToSlash(rel))
				}
				return nil
			})
		}
		if a.Current != "" {
			ready := false
			for _, v := range a.Versions {
				if v.Revision == a.Current && v.State == StateReady {
					ready = true
				}
			}
			if !ready {
				bad("%s: current revision %s is not a Ready version", a.Name, a.Current)
			}
		}
	}
	for _, kind := range []string{KindModel, KindKernelCache} {
		base, _ := s.kindDir(kind)
		names, _ := os.ReadDir(base)
		for _, n := range names {
			revs, _ := os.ReadDir(filepath.Join(base, n.Name()))
			for _, r := range revs {
				p := filepath.Join(base, n.Name(), r.Name())
				if r.Name() == currentLink {
					target, err := os.Readlink(p)
					if err != nil || !known[filepath.Join(base, n.Name(), target)] {
						bad("%s/%s/current points at %q, which the index does not know", kindDirs[kind], n.Name(), target)
					}
					continue
				}
				if !known[p] {
					bad("%s/%s/%s is on disk but not in the index", kindDirs[kind], n.Name(), r.Name())
				}
			}
		}
	}
	sort.Strings(probs)
	return probs, nil
}
