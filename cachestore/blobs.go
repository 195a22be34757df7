package cachestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	bolt "go.etcd.io/bbolt"
)

// BlobPath is where the blob with digest d lives (whether or not it exists).
func (s *Store) BlobPath(d string) (string, error) {
	h, err := ParseDigest(d)
	if err != nil {
		return "", err
	}
	return filepath.Join(s.root, dirBlobs, h[:2], h), nil
}

// HasBlob reports whether the blob is present on disk.
func (s *Store) HasBlob(d string) bool {
	p, err := s.BlobPath(d)
	if err != nil {
		return false
	}
	_, err = os.Lstat(p)
	return err == nil
}

// OpenBlob opens a blob for reading; the caller closes it.
func (s *Store) OpenBlob(d string) (*os.File, error) {
	p, err := s.BlobPath(d)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("blob %s: %w", d, ErrNotFound)
	}
	return f, err
}

// adoptIngest moves verified data into blobs/. Errors after the rename are
// logged, not returned: the blob is in place and Open adopts its record.
func (s *Store) adoptIngest(ctx context.Context, data, d string, size int64, l *Lease) error {
	if l != nil {
		l.Hold(d)
	} else {
		s.held.hold(d) // until recorded: GC must not take it in between
		defer s.held.unhold(d)
	}
	isNew, err := s.placeBlob(data, d)
	if err != nil {
		return err
	}
	if isNew {
		dst, _ := s.BlobPath(d)
		if err := syncDir(filepath.Dir(dst)); err != nil {
			s.log.Warn("fsync blob dir", "digest", d, "err", err)
		}
		s.hit("blob.after-rename")
	}
	if err := s.putBlobRecords(map[string]int64{d: size}); err != nil {
		if !isNew {
			return err
		}
		s.log.Warn("record blob; startup repair will adopt it", "digest", d, "err", err)
	}
	return nil
}

// placeBlob moves the durable data file into blobs/ as d, read-only; the
// caller holds d until it is recorded. It reports whether the blob is
// new: identical content already there is stored once.
func (s *Store) placeBlob(data, d string) (bool, error) {
	dst, err := s.BlobPath(d)
	if err != nil {
		return false, err
	}
	if _, err := os.Lstat(dst); err == nil {
		return false, nil // dedup: identical content stored once
	}
	if err := os.Chmod(data, 0o444); err != nil {
		return false, fmt.Errorf("blob %s: %w", d, err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return false, fmt.Errorf("blob %s: %w", d, err)
	}
	if err := os.Rename(data, dst); err != nil {
		return false, fmt.Errorf("blob %s: %w", d, err)
	}
	s.growing.notify(d)
	return true, nil
}

// putBlobRecords records blobs (digest → size) in one transaction; a
// blob already recorded keeps its record.
func (s *Store) putBlobRecords(sizes map[string]int64) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketBlobs)
		for d, size := range sizes {
			if b.Get([]byte(d)) != nil {
				continue
			}
			raw, _ := json.Marshal(blobRecord{Size: size, Created: s.now().UTC()})
			if err := b.Put([]byte(d), raw); err != nil {
				return err
			}
		}
		return nil
	})
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// Lease protects blobs from GC while a pull that wants them is in flight.
// The zero value is not usable; get one from Store.NewLease. Safe for
// concurrent use.
type Lease struct {
	held  *heldBlobs
	mu    sync.Mutex
	blobs map[string]bool
}

// NewLease returns an empty lease; Release it when the pull is done.
func (s *Store) NewLease() *Lease { return &Lease{held: &s.held, blobs: map[string]bool{}} }

// Hold protects blob d until Release. Hold before checking HasBlob, so a
// concurrent GC cannot delete a blob between the check and the commit.
func (l *Lease) Hold(d string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.blobs[d] {
		l.blobs[d] = true
		l.held.hold(d)
	}
}

// Release drops every hold of the lease.
func (l *Lease) Release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for d := range l.blobs {
		l.held.unhold(d)
	}
	l.blobs = map[string]bool{}
}

// heldBlobs counts what holds each blob from GC: leases, and adoptions
// between the rename into blobs/ and the index record. GC holds mu while
// it deletes, so no hold is taken on a blob it is removing.
type heldBlobs struct {
	mu sync.Mutex
	n  map[string]int // blob digest → holds
}

func (h *heldBlobs) hold(d string) {
	h.mu.Lock()
	h.n[d]++
	h.mu.Unlock()
}

func (h *heldBlobs) unhold(d string) {
	h.mu.Lock()
	if h.n[d]--; h.n[d] <= 0 {
		delete(h.n, d)
	}
	h.mu.Unlock()
}
