package cachestore

import (
	"context"
	"encoding/json"
	"os"
	"sort"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// GCReport says what GC removed.
type GCReport struct {
	BlobsRemoved int      `json:"blobsRemoved"`
	BytesFreed   int64    `json:"bytesFreed"`
	BlobsKept    int      `json:"blobsKept"`
	Removed      []string `json:"removed,omitempty"` // digests removed (or, dry run, that would be)
	// IngestsRemoved and IngestBytesFreed count the partial downloads
	// removed because no pull will resume them (see WithAbandoned).
	IngestsRemoved   int   `json:"ingestsRemoved,omitempty"`
	IngestBytesFreed int64 `json:"ingestBytesFreed,omitempty"`
}

// GC removes every blob that no artifact version references and no lease
// holds, and every partial ingest that no writer holds open and that the
// store's abandoned predicate gives up on. Shared blobs stay while any
// version uses them. The Xet chunk terms of blobs without a record that
// no lease holds go too (xetchunks.go).
func (s *Store) GC(ctx context.Context) (*GCReport, error) { return s.gc(ctx, false, nil) }

// GCDryRun reports what GC would remove, removing nothing.
func (s *Store) GCDryRun(ctx context.Context) (*GCReport, error) { return s.gc(ctx, true, nil) }

// GCBlobs is GC of the named blobs only (a download that was only ever
// needed during a pull, such as an archive once unpacked): each is removed
// unless a version references it or a lease holds it. Ingests are left
// alone.
func (s *Store) GCBlobs(ctx context.Context, digests ...string) (*GCReport, error) {
	only := map[string]bool{}
	for _, d := range digests {
		only[d] = true
	}
	return s.gc(ctx, false, only)
}

func (s *Store) gc(ctx context.Context, dry bool, only map[string]bool) (*GCReport, error) {
	// Ingests first, outside s.mu: the predicate may take the caller's locks.
	var in int
	var inBytes int64
	if only == nil {
		in, inBytes = s.removeAbandoned(dry)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	arts, err := s.List()
	if err != nil {
		return nil, err
	}
	ref := map[string]bool{}
	for _, a := range arts {
		for _, v := range a.Versions {
			for _, e := range v.Manifest {
				ref[e.Digest] = true
			}
		}
	}
	var onDisk map[string]int64
	if only == nil {
		onDisk, err = blobsOnDisk(s.root, s.log)
	} else {
		onDisk = map[string]int64{}
		for d := range only {
			p, perr := s.BlobPath(d)
			if perr != nil {
				return nil, perr
			}
			if fi, serr := os.Stat(p); serr == nil {
				onDisk[d] = fi.Size()
			}
		}
	}
	if err != nil {
		return nil, err
	}
	rep := &GCReport{IngestsRemoved: in, IngestBytesFreed: inBytes}
	s.held.mu.Lock()
	defer s.held.mu.Unlock()
	var gone [][]byte
	for d, size := range onDisk {
		if err := ctx.Err(); err != nil {
			break
		}
		if ref[d] || s.held.n[d] > 0 {
			rep.BlobsKept++
			continue
		}
		if !dry {
			p, _ := s.BlobPath(d)
			if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
				s.log.Warn("gc remove blob", "digest", d, "err", err)
				continue
			}
		}
		gone = append(gone, []byte(d))
		rep.Removed = append(rep.Removed, d)
		rep.BlobsRemoved++
		rep.BytesFreed += size
	}
	sort.Strings(rep.Removed)
	if dry {
		return rep, nil
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketBlobs)
		for _, k := range gone {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		// The chunk terms of blobs gone, and of blobs never committed that
		// no pull holds any more (s.held.mu is held).
		_, err := pruneXet(tx, func(d string) bool { return b.Get([]byte(d)) != nil || s.held.n[d] > 0 })
		return err
	})
	return rep, err
}

// ArtifactUsage is the disk use of one artifact, counting each blob once:
// Unique bytes are in blobs no other artifact uses, Shared in blobs others use too.
type ArtifactUsage struct {
	Name   string `json:"name"`
	Bytes  int64  `json:"bytes"`
	Unique int64  `json:"uniqueBytes"`
	Shared int64  `json:"sharedBytes"`
}

// Usage is the disk use of the store and its filesystem.
type Usage struct {
	StoreBytes int64           `json:"storeBytes"` // sum of blob sizes
	Blobs      int             `json:"blobs"`
	Artifacts  []ArtifactUsage `json:"artifacts"`
	FSCapacity int64           `json:"fsCapacityBytes"`
	FSFree     int64           `json:"fsFreeBytes"` // available to unprivileged users
}

// StoreBytes is the sum of the sizes of the blobs in the index.
func (s *Store) StoreBytes() (int64, error) {
	n, _, err := s.BlobStats()
	return n, err
}

// BlobStats returns the bytes and the number of blobs in the index; it
// reads the blob records only (no manifests), cheap enough for every scrape.
func (s *Store) BlobStats() (bytes int64, count int, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketBlobs).ForEach(func(_, raw []byte) error {
			var r blobRecord
			if json.Unmarshal(raw, &r) == nil {
				bytes += r.Size
				count++
			}
			return nil
		})
	})
	return bytes, count, err
}

// FSStat returns capacity and available bytes of the root's filesystem.
func (s *Store) FSStat() (capacity, free int64, err error) {
	var st unix.Statfs_t
	if err := unix.Statfs(s.root, &st); err != nil {
		return 0, 0, err
	}
	return int64(st.Blocks) * st.Bsize, int64(st.Bavail) * st.Bsize, nil
}

// Usage accounts bytes per artifact (unique vs shared), the store total and
// the filesystem's capacity and free space.
func (s *Store) Usage() (*Usage, error) {
	u := &Usage{}
	var err error
	if u.StoreBytes, u.Blobs, err = s.BlobStats(); err != nil {
		return nil, err
	}
	arts, err := s.List()
	if err != nil {
		return nil, err
	}
	users := map[string]int{}
	per := make([]map[string]int64, len(arts))
	for i, a := range arts {
		per[i] = map[string]int64{}
		for _, v := range a.Versions {
			for _, e := range v.Manifest {
				per[i][e.Digest] = e.Size
			}
		}
		for d := range per[i] {
			users[d]++
		}
	}
	for i, a := range arts {
		au := ArtifactUsage{Name: a.Name}
		for d, size := range per[i] {
			au.Bytes += size
			if users[d] > 1 {
				au.Shared += size
			} else {
				au.Unique += size
			}
		}
		u.Artifacts = append(u.Artifacts, au)
	}
	u.FSCapacity, u.FSFree, err = s.FSStat()
	return u, err
}
