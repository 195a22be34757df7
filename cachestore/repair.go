package cachestore

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// RepairReport says what startup repair found and did.
type RepairReport struct {
	TmpRemoved      int      `json:"tmpRemoved"`
	IngestsKept     int      `json:"ingestsKept"`
	IngestsRemoved  int      `json:"ingestsRemoved"`
	BlobsAdopted    int      `json:"blobsAdopted"`
	BlobsDropped    int      `json:"blobRecordsDropped"`
	TreesRemoved    int      `json:"treesRemoved"`
	TreesRebuilt    int      `json:"treesRebuilt"`
	LinksFixed      int      `json:"linksFixed"`
	VersionsMissing []string `json:"versionsMissing,omitempty"` // name@rev marked for re-fetch
	// HoldsRestored counts hold records put back into the index from
	// their copies under holds/ (the index was lost or rebuilt).
	HoldsRestored int `json:"holdsRestored,omitempty"`
	// IndexRebuilt is set when the index was found new or empty over a
	// store that holds trees, and was rebuilt from them.
	IndexRebuilt *RebuildReport `json:"indexRebuilt,omitempty"`
	// AfterCleanShutdown is set when the store was closed cleanly and
	// nothing wrote to the index since: only tmp/ and ingest/ were looked
	// at, not every blob and tree (doc.go: Clean shutdown).
	AfterCleanShutdown bool `json:"afterCleanShutdown,omitempty"`
}

// Clean reports whether repair had nothing to do but keep ingests.
func (r *RepairReport) Clean() bool {
	return r.TmpRemoved == 0 && r.IngestsRemoved == 0 && r.BlobsAdopted == 0 && r.BlobsDropped == 0 &&
		r.TreesRemoved == 0 && r.TreesRebuilt == 0 && r.LinksFixed == 0 && len(r.VersionsMissing) == 0 && r.IndexRebuilt == nil && r.HoldsRestored == 0
}

// blobsOnDisk lists blobs by walking blobs/sha256 (names and sizes only; no
// hashing). Files that cannot be blobs are removed.
func (s *Store) blobsOnDisk() (map[string]int64, error) {
	out := map[string]int64{}
	top := filepath.Join(s.root, dirBlobs)
	prefixes, err := os.ReadDir(top)
	if err != nil {
		return nil, err
	}
	for _, p := range prefixes {
		dir := filepath.Join(top, p.Name())
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			d := DigestPrefix + e.Name()
			h, err := ParseDigest(d)
			if err != nil || h[:2] != p.Name() || !e.Type().IsRegular() {
				s.log.Warn("removing a file that is not a blob", "path", filepath.Join(dir, e.Name()))
				os.RemoveAll(filepath.Join(dir, e.Name()))
				continue
			}
			fi, err := e.Info()
			if err != nil {
				continue
			}
			out[d] = fi.Size()
		}
	}
	return out, nil
}

// Repair brings disk and index back into agreement without rehashing:
// temp files go, stale ingests go (recent ones stay to be resumed), blob
// records follow the blobs on disk, trees without a Ready record go, Ready
// records whose blobs are gone become Missing, missing trees of Ready
// versions are rebuilt from their blobs, and current links follow the
// index. Open runs it; it is safe to run again. With full false (after a
// clean shutdown) it does the first two only and deletes the clean record.
func (s *Store) repair(ctx context.Context, ingestMaxAge time.Duration, full bool) (*RepairReport, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rep := &RepairReport{}

	tmp := filepath.Join(s.root, dirTmp)
	if ents, err := os.ReadDir(tmp); err == nil {
		for _, e := range ents {
			os.RemoveAll(filepath.Join(tmp, e.Name()))
			rep.TmpRemoved++
		}
	}

	ing := filepath.Join(s.root, dirIngest)
	if ents, err := os.ReadDir(ing); err == nil {
		for _, e := range ents {
			dir := filepath.Join(ing, e.Name())
			ref, rerr := os.ReadFile(filepath.Join(dir, ingestRef))
			fi, derr := os.Stat(filepath.Join(dir, ingestData))
			if rerr != nil || derr != nil || ingestDirName(string(ref)) != e.Name() || s.now().Sub(fi.ModTime()) > ingestMaxAge {
				os.RemoveAll(dir)
				rep.IngestsRemoved++
				continue
			}
			rep.IngestsKept++
		}
	}

	if !full {
		rep.AfterCleanShutdown = true
		return rep, s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(keyClean) })
	}
	onDisk, err := s.blobsOnDisk()
	if err != nil {
		return nil, err
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketMeta).Delete(keyClean); err != nil {
			return err
		}
		b := tx.Bucket(bucketBlobs)
		var drop [][]byte
		recorded := map[string]bool{}
		b.ForEach(func(k, _ []byte) error {
			if _, ok := onDisk[string(k)]; !ok {
				drop = append(drop, append([]byte(nil), k...))
			}
			recorded[string(k)] = true
			return nil
		})
		for _, k := range drop {
			if err := b.Delete(k); err != nil {
				return err
			}
			rep.BlobsDropped++
		}
		for d, size := range onDisk {
			if !recorded[d] {
				raw, _ := json.Marshal(blobRecord{Size: size, Created: s.now().UTC()})
				if err := b.Put([]byte(d), raw); err != nil {
					return err
				}
				rep.BlobsAdopted++
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}

	arts, err := s.List()
	if err != nil {
		return nil, err
	}
	known := map[string]map[string]Version{}
	for _, a := range arts {
		known[a.Name] = map[string]Version{}
		for _, v := range a.Versions {
			if v.State == StateReady {
				for _, e := range v.Manifest {
					if size, ok := onDisk[e.Digest]; !ok || size != e.Size {
						v.State, v.Message = StateMissing, fmt.Sprintf("blob %s of %s is missing after restart; re-fetch needed", e.Digest, e.Path)
						if err := s.SetState(a.Name, v.Revision, v.State, v.Message); err != nil {
							return nil, err
						}
						rep.VersionsMissing = append(rep.VersionsMissing, a.Name+"@"+v.Revision)
						break
					}
				}
			}
			known[a.Name][v.Revision] = v
			base, err := s.kindDir(v.Kind)
			if err != nil {
				continue
			}
			tree := filepath.Join(base, a.Name, v.Revision)
			_, serr := os.Lstat(tree)
			switch {
			case v.State == StateReady && serr != nil:
				if err := s.materialize(base, a.Name, v.Revision, v.Manifest, 0o755); err != nil {
					return nil, fmt.Errorf("rebuild %s@%s: %w", a.Name, v.Revision, err)
				}
				rep.TreesRebuilt++
			case v.State != StateReady && serr == nil:
				s.removeTree(tree)
				rep.TreesRemoved++
			}
		}
		if len(a.Versions) > 0 {
			base, _ := s.kindDir(a.Versions[0].Kind)
			want := a.Current
			if v, ok := known[a.Name][want]; !ok || v.State != StateReady {
				want = ""
			}
			link := filepath.Join(base, a.Name, currentLink)
			if got, _ := os.Readlink(link); got != want {
				if err := s.setCurrentLink(filepath.Join(base, a.Name), want); err != nil {
					return nil, err
				}
				rep.LinksFixed++
			}
		}
	}

	// Trees on disk that the index does not know as Ready.
	for kind, d := range kindDirs {
		base := filepath.Join(s.root, d)
		names, _ := os.ReadDir(base)
		for _, n := range names {
			revs, ok := known[n.Name()]
			if !ok {
				s.removeTree(filepath.Join(base, n.Name()))
				rep.TreesRemoved++
				continue
			}
			ents, _ := os.ReadDir(filepath.Join(base, n.Name()))
			for _, e := range ents {
				if e.Name() == currentLink {
					continue
				}
				if v, ok := revs[e.Name()]; !ok || v.State != StateReady || v.Kind != kind {
					s.removeTree(filepath.Join(base, n.Name(), e.Name()))
					rep.TreesRemoved++
				}
			}
		}
	}
	// The HF cache view follows the index: rebuilt where missing, trimmed
	// where it serves nothing.
	repos := s.hfRepos()
	if ents, err := os.ReadDir(filepath.Join(s.root, dirHF)); err == nil {
		for _, e := range ents {
			known := false
			for r := range repos {
				known = known || HFRepoDir(r) == e.Name()
			}
			if !known {
				os.RemoveAll(filepath.Join(s.root, dirHF, e.Name()))
				rep.TreesRemoved++
			}
		}
	}
	for r := range repos {
		if err := s.syncHFView(r); err != nil {
			s.log.Warn("rebuild hf cache view", "repo", r, "err", err)
		}
	}
	return rep, ctx.Err()
}
