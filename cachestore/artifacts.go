package cachestore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	bolt "go.etcd.io/bbolt"
)

// Get returns one artifact with its manifests, ErrNotFound when the
// index has none.
func (s *Store) Get(name string) (*Artifact, error) { return s.get(name, true) }

// Summary is Get without the manifests.
func (s *Store) Summary(name string) (*Artifact, error) { return s.get(name, false) }

func (s *Store) get(name string, manifests bool) (*Artifact, error) {
	var a *Artifact
	err := s.db.View(func(tx *bolt.Tx) error {
		ab := tx.Bucket(bucketArtifacts).Bucket([]byte(name))
		if ab == nil {
			return fmt.Errorf("artifact %s: %w", name, ErrNotFound)
		}
		got, err := readArtifact(name, ab, manifests)
		a = &got
		return err
	})
	return a, err
}

// List returns every artifact with its manifests, sorted by name.
func (s *Store) List() ([]Artifact, error) {
	var out []Artifact
	err := s.db.View(func(tx *bolt.Tx) (err error) {
		out, err = readArtifacts(tx, true)
		return err
	})
	return out, err
}

// ListSummaries returns every artifact sorted by name, without manifests:
// the cheap read behind listing thousands of artifacts. The summaries are
// decoded once per state of the index (per committed write transaction)
// and kept; each call gets its own slices, but Metadata and Annotations
// are shared with the next caller: read them, never modify them in place.
func (s *Store) ListSummaries() ([]Artifact, error) {
	var out []Artifact
	err := s.db.View(func(tx *bolt.Tx) error {
		arts, err := s.sums.at(tx)
		if err != nil {
			return err
		}
		out = make([]Artifact, len(arts))
		for i, a := range arts {
			a.Versions = append([]Version(nil), a.Versions...)
			out[i] = a
		}
		return nil
	})
	return out, err
}

// summaryCache keeps the summaries of every artifact as of one committed
// state of the index (one write transaction's id), decoded once.
type summaryCache struct {
	mu   sync.Mutex
	arts []Artifact
	tx   int
}

// at returns the summaries as tx sees them, decoding them only when the
// index has changed since they were kept. Callers copy before changing.
func (c *summaryCache) at(tx *bolt.Tx) ([]Artifact, error) {
	c.mu.Lock()
	arts, ok := c.arts, c.tx == tx.ID() && c.arts != nil
	c.mu.Unlock()
	if ok {
		return arts, nil
	}
	arts, err := readArtifacts(tx, false)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.arts, c.tx = arts, tx.ID()
	c.mu.Unlock()
	return arts, nil
}

// readArtifacts reads every artifact in one transaction, sorted by name
// (bbolt's key order, which is Go's string order).
func readArtifacts(tx *bolt.Tx, manifests bool) ([]Artifact, error) {
	var out []Artifact
	arts := tx.Bucket(bucketArtifacts)
	err := arts.ForEachBucket(func(k []byte) error {
		a, err := readArtifact(string(k), arts.Bucket(k), manifests)
		out = append(out, a)
		return err
	})
	return out, err
}

// TreePath is where the tree of name@rev is (or would be) visible.
func (s *Store) TreePath(kind, name, rev string) string {
	base, err := s.treeBase(kind, name)
	if err != nil {
		return ""
	}
	return filepath.Join(base, name, rev)
}

// updateVersions applies fn to each version of name (all versions when rev
// is empty) in one transaction.
func (s *Store) updateVersions(name, rev string, fn func(v *Version) error) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		ab := tx.Bucket(bucketArtifacts).Bucket([]byte(name))
		if ab == nil {
			return fmt.Errorf("artifact %s: %w", name, ErrNotFound)
		}
		if rev == "" {
			rev = string(ab.Get(keyCurrent))
		}
		vb := ab.Bucket(bucketVersions)
		v, err := getSummary(vb, rev)
		if err != nil {
			return err
		}
		if v == nil {
			return fmt.Errorf("artifact %s@%s: %w", name, rev, ErrNotFound)
		}
		if err := fn(v); err != nil {
			return err
		}
		return putSummary(vb, v)
	})
}

// SetPinned pins or unpins a version (the current one when rev is empty).
// A pinned version is never evicted by policy.
func (s *Store) SetPinned(name, rev string, pinned bool) error {
	return s.updateVersions(name, rev, func(v *Version) error { v.Pinned = pinned; return nil })
}

// HideHFView takes a version out of the hf/ view, which is world-readable
// (an artifact that became private: tenancy): its record forgets the hub
// repo, and that repo's view is synced without it. No-op for a version
// that has no view.
func (s *Store) HideHFView(name, rev string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var repo string
	err := s.updateVersions(name, rev, func(v *Version) error { repo, v.HFRepo, v.HFRef = v.HFRepo, "", ""; return nil })
	if err != nil || repo == "" {
		return err
	}
	return s.syncHFView(repo)
}

// Touch records a use of a version (the current one when rev is empty).
func (s *Store) Touch(name, rev string) error {
	return s.updateVersions(name, rev, func(v *Version) error { v.LastUsed = s.now().UTC(); return nil })
}

// SetState records a state and message on a version, e.g. Failed after a
// re-fetch of a Missing version failed.
func (s *Store) SetState(name, rev string, st State, msg string) error {
	return s.updateVersions(name, rev, func(v *Version) error { v.State, v.Message = st, msg; return nil })
}

// Evict removes a version's tree and record (every version when rev is
// empty). Pinned versions are refused with ErrPinned unless force is set.
// Blobs stay until GC.
func (s *Store) Evict(ctx context.Context, name, rev string, force bool) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, err := s.Get(name)
	if err != nil {
		return nil, err
	}
	var victims []Version
	for _, v := range a.Versions {
		if rev == "" || v.Revision == rev {
			if v.Pinned && !force {
				return nil, fmt.Errorf("artifact %s@%s: %w; unpin it first", name, v.Revision, ErrPinned)
			}
			victims = append(victims, v)
		}
	}
	if len(victims) == 0 {
		return nil, fmt.Errorf("artifact %s@%s: %w", name, rev, ErrNotFound)
	}
	base, _ := s.treeBase(victims[0].Kind, name)
	parent := filepath.Join(base, name)
	current := a.Current
	for _, v := range victims {
		if v.Revision == current {
			current = ""
		}
	}
	// Take the current link down first, so nothing points at a removed tree.
	if current == "" {
		if err := s.setCurrentLink(parent, ""); err != nil {
			return nil, err
		}
	}
	var out []string
	err = s.db.Update(func(tx *bolt.Tx) error {
		arts := tx.Bucket(bucketArtifacts)
		ab := arts.Bucket([]byte(name))
		vb := ab.Bucket(bucketVersions)
		for _, v := range victims {
			if err := deleteVersion(ab, v.Revision); err != nil {
				return err
			}
			out = append(out, v.Revision)
		}
		if vb.Stats().KeyN == len(victims) && len(victims) == len(a.Versions) {
			return arts.DeleteBucket([]byte(name))
		}
		if current == "" {
			return ab.Delete(keyCurrent)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.hit("evict.after-index")
	for _, v := range victims {
		removeTree(s.root, s.log, filepath.Join(parent, v.Revision))
	}
	if len(victims) == len(a.Versions) {
		os.Remove(parent)
	}
	for _, v := range victims {
		if v.HFRepo != "" {
			if err := s.syncHFView(v.HFRepo); err != nil {
				s.log.Warn("hf cache view after evict", "repo", v.HFRepo, "err", err)
			}
		}
	}
	return out, nil
}
