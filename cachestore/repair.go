package cachestore

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
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
func blobsOnDisk(root string, log *slog.Logger) (map[string]int64, error) {
	out := map[string]int64{}
	top := filepath.Join(root, dirBlobs)
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
				log.Warn("removing a file that is not a blob", "path", filepath.Join(dir, e.Name()))
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
	r := repairer{s: s, rep: &RepairReport{}}
	r.emptyTmp()
	r.sweepIngests(ingestMaxAge)
	if !full {
		r.rep.AfterCleanShutdown = true
		return r.rep, s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(keyClean) })
	}
	onDisk, err := blobsOnDisk(s.root, s.log)
	if err != nil {
		return nil, err
	}
	if err := r.blobRecords(onDisk); err != nil {
		return nil, err
	}
	known, err := r.versions(onDisk)
	if err != nil {
		return nil, err
	}
	r.unknownTrees(known)
	r.hfViews()
	return r.rep, ctx.Err()
}

// repairer is one run of repair, with the store's lock held; its steps
// count what they do in rep.
type repairer struct {
	s   *Store
	rep *RepairReport
}

// emptyTmp removes everything under tmp/.
func (r repairer) emptyTmp() {
	tmp := filepath.Join(r.s.root, dirTmp)
	if ents, err := os.ReadDir(tmp); err == nil {
		for _, e := range ents {
			os.RemoveAll(filepath.Join(tmp, e.Name()))
			r.rep.TmpRemoved++
		}
	}
}

// sweepIngests keeps the partial ingests a pull may resume and removes
// the broken and those older than maxAge.
func (r repairer) sweepIngests(maxAge time.Duration) {
	ing := filepath.Join(r.s.root, dirIngest)
	ents, err := os.ReadDir(ing)
	if err != nil {
		return
	}
	for _, e := range ents {
		dir := filepath.Join(ing, e.Name())
		ref, rerr := os.ReadFile(filepath.Join(dir, ingestRef))
		fi, derr := os.Stat(filepath.Join(dir, ingestData))
		if rerr != nil || derr != nil || ingestDirName(string(ref)) != e.Name() || r.s.now().Sub(fi.ModTime()) > maxAge {
			os.RemoveAll(dir)
			r.rep.IngestsRemoved++
			continue
		}
		r.rep.IngestsKept++
	}
}

// blobRecords makes the blob records follow the blobs on disk, in the
// transaction that deletes the clean record: records of blobs gone are
// dropped, blobs without a record adopted.
func (r repairer) blobRecords(onDisk map[string]int64) error {
	return r.s.db.Update(func(tx *bolt.Tx) error {
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
			r.rep.BlobsDropped++
		}
		for d, size := range onDisk {
			if !recorded[d] {
				raw, _ := json.Marshal(blobRecord{Size: size, Created: r.s.now().UTC()})
				if err := b.Put([]byte(d), raw); err != nil {
					return err
				}
				r.rep.BlobsAdopted++
			}
		}
		return nil
	})
}

// versions brings each recorded version's state, tree and current link
// in line with the blobs on disk, and returns every version by artifact
// and revision as it now stands.
func (r repairer) versions(onDisk map[string]int64) (map[string]map[string]Version, error) {
	arts, err := r.s.List()
	if err != nil {
		return nil, err
	}
	known := map[string]map[string]Version{}
	for _, a := range arts {
		known[a.Name] = map[string]Version{}
		for _, v := range a.Versions {
			if err := r.version(a.Name, &v, onDisk); err != nil {
				return nil, err
			}
			known[a.Name][v.Revision] = v
		}
		if err := r.currentLink(a, known[a.Name]); err != nil {
			return nil, err
		}
	}
	return known, nil
}

// version marks a Ready version whose blobs are gone Missing, rebuilds
// the missing tree of a Ready one and removes the tree of one not Ready.
func (r repairer) version(name string, v *Version, onDisk map[string]int64) error {
	if v.State == StateReady {
		for _, e := range v.Manifest {
			if size, ok := onDisk[e.Digest]; !ok || size != e.Size {
				v.State, v.Message = StateMissing, fmt.Sprintf("blob %s of %s is missing after restart; re-fetch needed", e.Digest, e.Path)
				if err := r.s.SetState(name, v.Revision, v.State, v.Message); err != nil {
					return err
				}
				r.rep.VersionsMissing = append(r.rep.VersionsMissing, name+"@"+v.Revision)
				break
			}
		}
	}
	base, err := r.s.treeBase(v.Kind, name)
	if err != nil {
		return nil
	}
	if _, err := os.Lstat(filepath.Join(base, name)); err != nil {
		// No tree of name is left: rebuilt where a private one would be,
		// as its mode is closed (below); its owner opens both.
		base, _ = r.s.kindBase(v.Kind, true)
	}
	tree := filepath.Join(base, name, v.Revision)
	_, serr := os.Lstat(tree)
	switch {
	case v.State == StateReady && serr != nil:
		// Rebuilt closed (0700): the store does not know whether the
		// version is private; its owner opens it (the daemon's tree modes,
		// before it serves anything).
		if err := r.s.materialize(base, name, v.Revision, v.Manifest, 0o700); err != nil {
			return fmt.Errorf("rebuild %s@%s: %w", name, v.Revision, err)
		}
		r.rep.TreesRebuilt++
	case v.State != StateReady && serr == nil:
		removeTree(r.s.root, r.s.log, tree)
		r.rep.TreesRemoved++
	}
	return nil
}

// currentLink points an artifact's current link at its current version
// when that is Ready, and takes it down otherwise.
func (r repairer) currentLink(a Artifact, revs map[string]Version) error {
	if len(a.Versions) == 0 {
		return nil
	}
	base, _ := r.s.treeBase(a.Versions[0].Kind, a.Name)
	want := a.Current
	if v, ok := revs[want]; !ok || v.State != StateReady {
		want = ""
	}
	link := filepath.Join(base, a.Name, currentLink)
	if got, _ := os.Readlink(link); got != want {
		if err := r.s.setCurrentLink(filepath.Join(base, a.Name), want); err != nil {
			return err
		}
		r.rep.LinksFixed++
	}
	return nil
}

// unknownTrees removes the trees on disk that the index does not know as
// Ready versions of their kind.
func (r repairer) unknownTrees(known map[string]map[string]Version) {
	for _, b := range r.s.artifactBases() {
		kind, base := b.kind, b.dir
		names, _ := os.ReadDir(base)
		for _, n := range names {
			revs, ok := known[n.Name()]
			if where, _ := r.s.treeBase(kind, n.Name()); !ok || where != base {
				// Unknown, or the public copy of a name that is private
				// too (made by hand: a rename never leaves both).
				removeTree(r.s.root, r.s.log, filepath.Join(base, n.Name()))
				r.rep.TreesRemoved++
				continue
			}
			ents, _ := os.ReadDir(filepath.Join(base, n.Name()))
			for _, e := range ents {
				if e.Name() == currentLink {
					continue
				}
				if v, ok := revs[e.Name()]; !ok || v.State != StateReady || v.Kind != kind {
					removeTree(r.s.root, r.s.log, filepath.Join(base, n.Name(), e.Name()))
					r.rep.TreesRemoved++
				}
			}
		}
	}
}

// hfViews makes the HF cache view follow the index: rebuilt where
// missing, trimmed where it serves nothing.
func (r repairer) hfViews() {
	repos := r.hfRepos()
	if ents, err := os.ReadDir(filepath.Join(r.s.root, dirHF)); err == nil {
		for _, e := range ents {
			known := false
			for repo := range repos {
				known = known || HFRepoDir(repo) == e.Name()
			}
			if !known {
				os.RemoveAll(filepath.Join(r.s.root, dirHF, e.Name()))
				r.rep.TreesRemoved++
			}
		}
	}
	for repo := range repos {
		if err := r.s.syncHFView(repo); err != nil {
			r.s.log.Warn("rebuild hf cache view", "repo", repo, "err", err)
		}
	}
}

// hfRepos lists the repos the index and the hf/ directory know.
func (r repairer) hfRepos() map[string]bool {
	out := map[string]bool{}
	if arts, err := r.s.ListSummaries(); err == nil {
		for _, a := range arts {
			for _, v := range a.Versions {
				if v.HFRepo != "" {
					out[v.HFRepo] = true
				}
			}
		}
	}
	return out
}
