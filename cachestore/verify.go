package cachestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	bolt "go.etcd.io/bbolt"
)

// VerifyReport says what a scrub found.
type VerifyReport struct {
	BlobsChecked int      `json:"blobsChecked"`
	BytesChecked int64    `json:"bytesChecked"`
	Corrupt      []string `json:"corrupt,omitempty"`     // digests quarantined
	Missing      []string `json:"missing,omitempty"`     // digests referenced but absent
	Affected     []string `json:"affected,omitempty"`    // name@rev marked Missing
	Quarantine   []string `json:"quarantined,omitempty"` // where the corrupt bytes went
}

// Verify re-hashes blobs: those of the named artifacts, or every blob on
// disk when names is empty. A blob whose bytes do not match its digest is
// moved to quarantine/; every version that uses a corrupt or missing blob
// loses its tree and is marked Missing, so the daemon re-fetches it.
// progress, when not nil, is called after each blob.
func (s *Store) Verify(ctx context.Context, names []string, progress func(done, total int)) (*VerifyReport, error) {
	arts, err := s.List()
	if err != nil {
		return nil, err
	}
	want, err := s.verifyTargets(arts, names)
	if err != nil {
		return nil, err
	}
	digests := make([]string, 0, len(want))
	for d := range want {
		digests = append(digests, d)
	}
	sort.Strings(digests)

	rep := &VerifyReport{}
	bad := map[string]bool{}
	buf := make([]byte, 1<<20)
	for i, d := range digests {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		p, _ := s.BlobPath(d)
		ok, n, err := hashMatches(p, d, want[d], buf)
		rep.BytesChecked += n
		rep.BlobsChecked++
		switch {
		case os.IsNotExist(err):
			rep.Missing = append(rep.Missing, d)
			bad[d] = true
		case err != nil:
			return rep, fmt.Errorf("verify blob %s: %w", d, err)
		case !ok:
			q, err := s.quarantine(d)
			if err != nil {
				return rep, err
			}
			rep.Corrupt = append(rep.Corrupt, d)
			rep.Quarantine = append(rep.Quarantine, q)
			bad[d] = true
		}
		if progress != nil {
			progress(i+1, len(digests))
		}
	}
	if len(bad) == 0 {
		return rep, nil
	}
	return rep, s.dropBadVersions(arts, bad, rep)
}

// verifyTargets is what Verify rehashes, digest → size: the blobs of the
// named artifacts (ErrNotFound for a name the index lacks), or every blob
// on disk when names is empty.
func (s *Store) verifyTargets(arts []Artifact, names []string) (map[string]int64, error) {
	want := map[string]int64{}
	if len(names) == 0 {
		onDisk, err := blobsOnDisk(s.root, s.log)
		if err != nil {
			return nil, err
		}
		for d, size := range onDisk {
			want[d] = size
		}
	}
	sel := map[string]bool{}
	for _, n := range names {
		sel[n] = true
		if _, err := s.Get(n); err != nil {
			return nil, err
		}
	}
	for _, a := range arts {
		if len(names) > 0 && !sel[a.Name] {
			continue
		}
		for _, v := range a.Versions {
			for _, e := range v.Manifest {
				want[e.Digest] = e.Size
			}
		}
	}
	return want, nil
}

// dropBadVersions marks every version that uses a bad blob Missing and
// takes its tree (and current link, and HF view) down; it lists them in
// rep.Affected.
func (s *Store) dropBadVersions(arts []Artifact, bad map[string]bool, rep *VerifyReport) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range arts {
		for _, v := range a.Versions {
			for _, e := range v.Manifest {
				if !bad[e.Digest] {
					continue
				}
				msg := fmt.Sprintf("blob %s of %s failed verification and was quarantined; re-fetch needed", e.Digest, e.Path)
				if err := s.SetState(a.Name, v.Revision, StateMissing, msg); err != nil {
					return err
				}
				base, _ := s.treeBase(v.Kind, a.Name)
				if a.Current == v.Revision {
					s.setCurrentLink(filepath.Join(base, a.Name), "")
				}
				removeTree(s.root, s.log, filepath.Join(base, a.Name, v.Revision))
				rep.Affected = append(rep.Affected, a.Name+"@"+v.Revision)
				if v.HFRepo != "" {
					s.syncHFView(v.HFRepo) // the corrupt inode leaves the view too
				}
				break
			}
		}
	}
	return nil
}

func hashMatches(path, d string, size int64, buf []byte) (bool, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, 0, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.CopyBuffer(h, f, buf)
	if err != nil {
		return false, n, err
	}
	return n == size && DigestPrefix+hex.EncodeToString(h.Sum(nil)) == d, n, nil
}

func (s *Store) quarantine(d string) (string, error) {
	p, _ := s.BlobPath(d)
	q := filepath.Join(s.root, dirQuarantine, fmt.Sprintf("%s-%d", d[len(DigestPrefix):], s.now().Unix()))
	if err := os.Rename(p, q); err != nil {
		return "", fmt.Errorf("quarantine blob %s: %w", d, err)
	}
	syncDir(filepath.Dir(p))
	err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketBlobs).Delete([]byte(d)) })
	return q, err
}
