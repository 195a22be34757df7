package cachestore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

const (
	dirBlobs      = "blobs/sha256"
	dirIngest     = "ingest"
	dirTmp        = "tmp"
	dirQuarantine = "quarantine"
	dirHolds      = "holds"
	indexFile     = "index.db"

	// KindModel artifacts live under models/, KindKernelCache under kernels/.
	// They are api.KindModel and api.KindKernelCache, the same values
	// (this package imports no project package; TestArtifactKindsAgree).
	KindModel       = "model"
	KindKernelCache = "kernelcache"
)

var kindDirs = map[string]string{KindModel: "models", KindKernelCache: "kernels"}

// Store is the content-addressed store under one root. Its methods are safe
// for concurrent use. Only one process may open a root at a time (the index
// is locked).
type Store struct {
	root     string
	db       *bolt.DB
	log      *slog.Logger
	hook     func(point string)
	directIO bool
	now      func() time.Time
	bufs     *ioBufPool // the Writers' pipeline buffers

	directBytes atomic.Int64 // blob bytes written with O_DIRECT since Open

	mu      sync.Mutex   // serialises tree and version mutations and GC
	sums    summaryCache // ListSummaries as of one state of the index
	refs    refLocks     // open ingest refs
	held    heldBlobs    // blobs that leases (and adoptions in flight) keep from GC
	growing growingSet   // the ingests readers may follow (WriterOpts.Digest), the watches of digests

	records   *Records              // the daemon's records in the same index
	abandoned func(IngestInfo) bool // see WithAbandoned
}

// DirectIOBytes is how many bytes of blob data this store has written
// with O_DIRECT since Open: 0 when WithDirectIO(false) or when the
// filesystem refused O_DIRECT; the unaligned tail of each blob is always
// written buffered. Safe for concurrent use.
func (s *Store) DirectIOBytes() int64 { return s.directBytes.Load() }

// Open opens (creating if needed) the store at root, migrates the index,
// and repairs what a crash may have left half-done (see Repair).
func Open(ctx context.Context, root string, opts ...Option) (*Store, *RepairReport, error) {
	o := options{directIO: true, writeBuffer: DefaultWriteBuffer, lockTimeout: time.Second, now: time.Now, ingestMaxAge: 7 * 24 * time.Hour}
	for _, opt := range opts {
		opt(&o)
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	if err := ValidWriteBuffer(int64(o.writeBuffer)); err != nil {
		return nil, nil, err
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, nil, fmt.Errorf("store root %q: %w", root, err)
	}
	for _, d := range append([]string{"", dirBlobs, dirIngest, dirTmp, dirQuarantine, dirHolds, dirHF, kindDirs[KindModel], kindDirs[KindKernelCache]}, privateDirs...) {
		if err := os.MkdirAll(filepath.Join(abs, d), 0o755); err != nil {
			return nil, nil, fmt.Errorf("store root %q: %w", abs, err)
		}
	}
	// private/ (private.go): passed through, never listed.
	for _, d := range privateDirs {
		os.Chmod(filepath.Join(abs, d), privateMode)
	}
	// holds/ names pods; a pod reaches a hold's tree through its bind
	// mount, never through these directories. blobs/ is reached through
	// the trees only: a private artifact's blobs by no path but its tree's
	// (0700), so a local user cannot read them by digest.
	for _, d := range []string{dirBlobs, dirIngest, dirTmp, dirQuarantine, dirHolds} {
		os.Chmod(filepath.Join(abs, d), 0o700)
	}
	dbPath := filepath.Join(abs, indexFile)
	db, fresh, err := openIndex(dbPath, o.lockTimeout)
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, nil, fmt.Errorf("store root %q: index.db is locked by another process (is another modelcached running on this root?)", abs)
		}
		return nil, nil, fmt.Errorf("store root %q: open index: %w", abs, err)
	}
	// Before migrate, whose transaction makes the clean record stale.
	clean, err := closedCleanly(db)
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("store root %q: %w", abs, err)
	}
	if err := guard(dbPath, func() error { return migrate(db, migrations) }); err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("store root %q: %w", abs, err)
	}
	s := &Store{
		root: abs, db: db, log: o.log, hook: o.hook, directIO: o.directIO, now: o.now, bufs: newBufPool(o.writeBuffer),
		refs: refLocks{open: map[string]bool{}}, held: heldBlobs{n: map[string]int{}}, abandoned: o.abandoned,
		records: &Records{db: db, root: abs, log: o.log},
	}
	var rebuilt *RebuildReport
	if fresh && storeHasTrees(abs) {
		// The index was lost (emptied or deleted), not the store: what is on
		// disk is rebuilt into it, never deleted for want of a record.
		s.log.Warn("index.db is new or empty but the store holds trees; rebuilding the index from disk", "index", dbPath)
		if rebuilt, err = s.rebuildIndex(ctx); err != nil {
			db.Close()
			return nil, nil, fmt.Errorf("store root %q: %w", abs, err)
		}
		s.log.Warn("index rebuilt from disk; sources, pins and modelctl pull desires are lost (see docs/configuration.md: A damaged or lost index)",
			"versions", len(rebuilt.Versions), "quarantined", len(rebuilt.Quarantined), "hf_versions", rebuilt.HFVersions)
	}
	rep, err := s.repair(ctx, o.ingestMaxAge, !clean || rebuilt != nil)
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("store root %q: startup repair: %w", abs, err)
	}
	rep.IndexRebuilt = rebuilt
	if rep.HoldsRestored, err = s.records.syncHolds(); err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("store root %q: holds: %w", abs, err)
	}
	return s, rep, nil
}

// Close closes the index. Writers still open keep their partial data.
// Called when every mutation has finished (it waits for the store lock),
// it first records a clean shutdown (doc.go: Clean shutdown), so that the
// next Open skips the walk of every blob and tree; when that cannot be
// recorded the next Open repairs as after a crash.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bufs.close()
	if err := s.markClean(); err != nil {
		s.log.Warn("clean shutdown not recorded; the next start walks the whole store", "err", err)
	}
	return s.db.Close()
}

// markClean syncs the filesystem of the root, so that every rename and
// link before it is durable, then records meta/clean as the id of the
// transaction that writes it.
func (s *Store) markClean() error {
	if err := syncfs(s.root); err != nil {
		return fmt.Errorf("syncfs %s: %w", s.root, err)
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		var buf [8]byte
		binary.BigEndian.PutUint64(buf[:], uint64(tx.ID()))
		return tx.Bucket(bucketMeta).Put(keyClean, buf[:])
	})
}

// closedCleanly reports whether the last transaction committed to the
// index is the one a clean Close wrote: nothing has written since, so disk
// and index agree as they did then.
func closedCleanly(db *bolt.DB) (bool, error) {
	clean := false
	err := db.View(func(tx *bolt.Tx) error {
		if meta := tx.Bucket(bucketMeta); meta != nil {
			raw := meta.Get(keyClean)
			clean = len(raw) == 8 && binary.BigEndian.Uint64(raw) == uint64(tx.ID())
		}
		return nil
	})
	return clean, err
}

// Check reports whether the index answers and the root is reachable; the
// daemon's health check and watchdog call it.
func (s *Store) Check() error {
	if err := s.db.View(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketMeta) == nil {
			return errors.New("index: meta bucket missing")
		}
		return nil
	}); err != nil {
		return err
	}
	_, err := os.Stat(filepath.Join(s.root, dirBlobs))
	return err
}

// Root is the absolute store root.
func (s *Store) Root() string { return s.root }

func (s *Store) hit(point string) {
	if s.hook != nil {
		s.hook(point)
	}
}
func (s *Store) kindDir(kind string) (string, error) {
	if kind == "" {
		kind = KindModel
	}
	d, ok := kindDirs[kind]
	if !ok {
		return "", fmt.Errorf("unknown artifact kind %q", kind)
	}
	return filepath.Join(s.root, d), nil
}
