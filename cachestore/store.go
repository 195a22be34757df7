package cachestore

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/renameio/v2"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
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

	mu     sync.Mutex // serialises tree and version mutations and GC
	sumMu  sync.Mutex
	sums   []Artifact // ListSummaries as of the index's transaction sumsTx
	sumsTx int
	refMu  sync.Mutex
	refs   map[string]bool // open ingest refs
	holdMu sync.Mutex
	holds  map[string]int // blob digest → leases holding it

	abandoned func(IngestInfo) bool // see WithAbandoned
}

type options struct {
	log          *slog.Logger
	hook         func(string)
	directIO     bool
	writeBuffer  int
	lockTimeout  time.Duration
	now          func() time.Time
	ingestMaxAge time.Duration
	abandoned    func(IngestInfo) bool
}

// Option configures Open.
type Option func(*options)

// WithLogger sets the logger; default: none (silent).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithDirectIO sets whether blobs are written with O_DIRECT where the
// filesystem allows it; default true. O_DIRECT bypasses the page cache: it
// is faster on page-cache-bound nodes and does not evict the pages of the
// inference processes on the same node. Filesystems that refuse it (tmpfs)
// get buffered writes either way.
func WithDirectIO(on bool) Option { return func(o *options) { o.directIO = on } }

// WithWriteBuffer sets the size of each of a Writer's two pipeline
// buffers, which is the size of its writes to disk; default
// DefaultWriteBuffer (2 MiB). Open refuses a size ValidWriteBuffer
// refuses. Smaller buffers hold less memory per pull and lose less of
// what was read to a crash; larger ones cost less CPU per byte.
func WithWriteBuffer(n int) Option { return func(o *options) { o.writeBuffer = n } }

// DirectIOBytes is how many bytes of blob data this store has written
// with O_DIRECT since Open: 0 when WithDirectIO(false) or when the
// filesystem refused O_DIRECT; the unaligned tail of each blob is always
// written buffered. Safe for concurrent use.
func (s *Store) DirectIOBytes() int64 { return s.directBytes.Load() }

// WithLockTimeout bounds how long Open waits for another process to release
// the index; default 1s.
func WithLockTimeout(d time.Duration) Option { return func(o *options) { o.lockTimeout = d } }

// WithClock sets the time source; default time.Now.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithIngestMaxAge sets how old a partial ingest may be before Open deletes
// it instead of keeping it for a resume; default 7 days.
func WithIngestMaxAge(d time.Duration) Option { return func(o *options) { o.ingestMaxAge = d } }

// WithAbandoned tells GC which partial ingests no pull will resume: GC
// removes those for which abandoned returns true, unless a Writer holds
// them open. It is called without any lock of the store held (it may take
// the caller's own locks) and only after Open returns. Default: none is
// abandoned; Open still removes ingests older than the ingest max age.
func WithAbandoned(abandoned func(IngestInfo) bool) Option {
	return func(o *options) { o.abandoned = abandoned }
}

// WithHook calls fn at named points of the commit protocols ("ingest.write",
// "blob.after-rename", "tree.after-rename", "commit.after-index"), and
// before HoldTree links a composed tree ("holdtree.link"). It exists for
// crash and concurrency tests; default none.
func WithHook(fn func(point string)) Option { return func(o *options) { o.hook = fn } }

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
	for _, d := range []string{"", dirBlobs, dirIngest, dirTmp, dirQuarantine, dirHolds, dirHF, kindDirs[KindModel], kindDirs[KindKernelCache]} {
		if err := os.MkdirAll(filepath.Join(abs, d), 0o755); err != nil {
			return nil, nil, fmt.Errorf("store root %q: %w", abs, err)
		}
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
		refs: map[string]bool{}, holds: map[string]int{}, abandoned: o.abandoned,
	}
	var rebuilt *RebuildReport
	if fresh && s.storeHasTrees() {
		// The index was lost (emptied or deleted), not the store: what is on
		// disk is rebuilt into it, never deleted for want of a record.
		s.log.Warn("index.db is new or empty but the store holds trees; rebuilding the index from disk", "index", dbPath)
		if rebuilt, err = s.rebuildIndex(ctx); err != nil {
			db.Close()
			return nil, nil, fmt.Errorf("store root %q: %w", abs, err)
		}
		s.log.Warn("index rebuilt from disk; sources, pins and modelctl pull desires are lost (see docs/operator.md)",
			"versions", len(rebuilt.Versions), "quarantined", len(rebuilt.Quarantined), "hf_versions", rebuilt.HFVersions)
	}
	rep, err := s.repair(ctx, o.ingestMaxAge, !clean || rebuilt != nil)
	if err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("store root %q: startup repair: %w", abs, err)
	}
	rep.IndexRebuilt = rebuilt
	if rep.HoldsRestored, err = s.syncHolds(); err != nil {
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
	fd, err := unix.Open(s.root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	err = unix.Syncfs(fd)
	unix.Close(fd)
	if err != nil {
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
		s.hold(d) // until recorded: GC must not take it in between
		defer s.unhold(d)
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
	if err := s.putBlobRecord(d, size); err != nil {
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
	return true, nil
}

// putBlobRecords records many blobs in one transaction.
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

func (s *Store) putBlobRecord(d string, size int64) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketBlobs)
		if b.Get([]byte(d)) != nil {
			return nil
		}
		raw, _ := json.Marshal(blobRecord{Size: size, Created: s.now().UTC()})
		return b.Put([]byte(d), raw)
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
	s     *Store
	mu    sync.Mutex
	blobs map[string]bool
}

// NewLease returns an empty lease; Release it when the pull is done.
func (s *Store) NewLease() *Lease { return &Lease{s: s, blobs: map[string]bool{}} }

// Hold protects blob d until Release. Hold before checking HasBlob, so a
// concurrent GC cannot delete a blob between the check and the commit.
func (l *Lease) Hold(d string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.blobs[d] {
		l.blobs[d] = true
		l.s.hold(d)
	}
}

// Release drops every hold of the lease.
func (l *Lease) Release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for d := range l.blobs {
		l.s.unhold(d)
	}
	l.blobs = map[string]bool{}
}

func (s *Store) hold(d string) {
	s.holdMu.Lock()
	s.holds[d]++
	s.holdMu.Unlock()
}

func (s *Store) unhold(d string) {
	s.holdMu.Lock()
	if s.holds[d]--; s.holds[d] <= 0 {
		delete(s.holds, d)
	}
	s.holdMu.Unlock()
}

// VersionSpec is what a pull hands to CommitVersion.
type VersionSpec struct {
	Name     string
	Kind     string // KindModel (default) or KindKernelCache
	Source   string
	Revision string // immutable revision; empty: the manifest digest's hex
	Manifest Manifest
	// ExpectedDigest, when set, must equal the manifest digest or nothing
	// is committed (the "folder checksum" a user demanded).
	ExpectedDigest string
	Pin            bool
	// Spec is an opaque fingerprint of what produced this version (the
	// daemon's desire), recorded so a changed desire can be told apart.
	Spec string
	// HFRepo ("org/name") and HFRef (the revision asked for) put the
	// version in the HF cache view too; Revision must then be the commit.
	HFRepo string
	HFRef  string
	// Annotations is what the caller checked of the version (a kernel
	// cache's signature and compatibility), kept with it as given.
	Annotations json.RawMessage
	// Private makes the version's tree directory 0700 from its creation:
	// only root (the daemon) reaches its files by a path; a pod reads it
	// through a tree of its own volume. Not recorded: the caller keeps
	// the modes of its trees (a tree that repair rebuilds is 0755).
	Private bool
	// Stage commits the version (verified, Ready, its tree in place)
	// without moving current: a rollout's prefetch. Activate moves
	// current to it later. An artifact with no current yet gets none.
	Stage bool
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

// CommitVersion makes an artifact version visible: it checks the manifest
// and every blob, builds the tree of hardlinks under tmp/, renames it to
// <kind dir>/<name>/<revision>, records the version Ready and current in
// one transaction, and swaps the current symlink (spec.Stage: records it
// Ready and leaves current alone). Re-committing a revision rebuilds its
// tree (repair), unless it is Ready, its tree is in place and only
// current is to move. On any error before the rename nothing is visible.
func (s *Store) CommitVersion(ctx context.Context, spec VersionSpec) (*Version, error) {
	if err := ValidateName(spec.Name); err != nil {
		return nil, err
	}
	m := append(Manifest(nil), spec.Manifest...)
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("artifact %s: %w", spec.Name, err)
	}
	md := m.Digest()
	if spec.ExpectedDigest != "" {
		want, err := NormalizeDigest(spec.ExpectedDigest)
		if err != nil {
			return nil, fmt.Errorf("artifact %s: expected digest: %w", spec.Name, err)
		}
		if want != md {
			return nil, fmt.Errorf("artifact %s: %w: manifest digest is %s, expected %s", spec.Name, ErrDigestMismatch, md, want)
		}
	}
	rev := spec.Revision
	if rev == "" {
		rev = md[len(DigestPrefix):]
	}
	if err := ValidateName(rev); err != nil {
		return nil, fmt.Errorf("artifact %s: revision: %w", spec.Name, err)
	}
	base, err := s.kindDir(spec.Kind)
	if err != nil {
		return nil, err
	}
	if spec.Kind == "" {
		spec.Kind = KindModel
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range m {
		p, _ := s.BlobPath(e.Digest)
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("artifact %s: path %s: blob %s: %w", spec.Name, e.Path, e.Digest, ErrNotFound)
		}
		if fi.Size() != e.Size {
			return nil, fmt.Errorf("artifact %s: path %s: blob %s: %w: %d bytes on disk, manifest says %d", spec.Name, e.Path, e.Digest, ErrSizeMismatch, fi.Size(), e.Size)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	mode := os.FileMode(0o755)
	if spec.Private {
		mode = 0o700
	}
	if err := s.materialize(base, spec.Name, rev, m, mode); err != nil {
		return nil, fmt.Errorf("artifact %s@%s: %w", spec.Name, rev, err)
	}
	now := s.now().UTC()
	v := &Version{
		Name: spec.Name, Kind: spec.Kind, Source: spec.Source, Revision: rev,
		Manifest: m, ManifestDigest: md, State: StateReady, Pinned: spec.Pin,
		Created: now, LastUsed: now, Bytes: m.Bytes(), Spec: spec.Spec,
		HFRepo: spec.HFRepo, HFRef: spec.HFRef, Metadata: s.readMetadata(m), Annotations: spec.Annotations,
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		ab, err := tx.Bucket(bucketArtifacts).CreateBucketIfNotExists([]byte(spec.Name))
		if err != nil {
			return err
		}
		vb, err := ab.CreateBucketIfNotExists(bucketVersions)
		if err != nil {
			return err
		}
		if old, err := getSummary(vb, rev); err != nil {
			return err
		} else if old != nil {
			v.Created = old.Created
			v.Pinned = v.Pinned || old.Pinned
		}
		if err := putVersion(ab, v); err != nil {
			return err
		}
		if spec.Stage {
			return nil
		}
		return ab.Put(keyCurrent, []byte(rev))
	})
	if err != nil {
		// The tree has no record: take it down again so nothing unrecorded is visible.
		s.removeTree(filepath.Join(base, spec.Name, rev))
		return nil, fmt.Errorf("artifact %s@%s: index: %w", spec.Name, rev, err)
	}
	s.hit("commit.after-index")
	if !spec.Stage {
		if err := s.setCurrentLink(filepath.Join(base, spec.Name), rev); err != nil {
			s.log.Warn("swap current link; startup repair will fix it", "artifact", spec.Name, "err", err)
		}
	}
	if spec.HFRepo != "" {
		if err := s.syncHFView(spec.HFRepo); err != nil {
			s.log.Warn("hf cache view; startup repair will rebuild it", "repo", spec.HFRepo, "err", err)
		}
	}
	return v, nil
}

// Activate makes a Ready version current (a rollout's flip after a Stage
// commit): one index transaction, then the current symlink is swapped
// with renameio. Nothing is fetched or rebuilt. ErrNotFound when the
// version is not recorded; an error naming the state when it is not
// Ready or its tree is gone (pull it again).
func (s *Store) Activate(name, rev string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var kind, repo string
	err := s.db.Update(func(tx *bolt.Tx) error {
		ab := tx.Bucket(bucketArtifacts).Bucket([]byte(name))
		if ab == nil {
			return fmt.Errorf("artifact %s: %w", name, ErrNotFound)
		}
		v, err := getSummary(ab.Bucket(bucketVersions), rev)
		if err != nil {
			return err
		}
		if v == nil {
			return fmt.Errorf("artifact %s@%s: %w", name, rev, ErrNotFound)
		}
		if v.State != StateReady {
			return fmt.Errorf("artifact %s@%s is %s, not Ready: %s", name, rev, v.State, v.Message)
		}
		base, err := s.kindDir(v.Kind)
		if err != nil {
			return err
		}
		if _, err := os.Stat(filepath.Join(base, name, rev)); err != nil {
			return fmt.Errorf("artifact %s@%s: tree: %w", name, rev, err)
		}
		kind, repo = v.Kind, v.HFRepo
		return ab.Put(keyCurrent, []byte(rev))
	})
	if err != nil {
		return err
	}
	s.hit("activate.after-index")
	base, _ := s.kindDir(kind)
	if err := s.setCurrentLink(filepath.Join(base, name), rev); err != nil {
		s.log.Warn("swap current link; startup repair will fix it", "artifact", name, "err", err)
	}
	if repo != "" {
		if err := s.syncHFView(repo); err != nil {
			s.log.Warn("hf cache view; startup repair will rebuild it", "repo", repo, "err", err)
		}
	}
	return nil
}

// materialize builds the tree for (name, rev) under tmp/ and renames it
// into place, replacing an existing tree atomically where the kernel
// supports RENAME_EXCHANGE; its top directory has mode (0755, or 0700
// for a private version) before it is in place. Called with s.mu held, or (HoldTree) with
// the blobs of m leased and base owned by the caller.
func (s *Store) materialize(base, name, rev string, m Manifest, mode os.FileMode) error {
	tmp, err := os.MkdirTemp(filepath.Join(s.root, dirTmp), "tree-")
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	made := map[string]bool{"": true}
	for _, e := range m {
		if dir := parentDir(e.Path); !made[dir] {
			if err := os.MkdirAll(filepath.Join(tmp, filepath.FromSlash(dir)), 0o755); err != nil {
				return err
			}
			for d := dir; d != "" && !made[d]; d = parentDir(d) {
				made[d] = true
			}
		}
		src, _ := s.BlobPath(e.Digest)
		if err := os.Link(src, filepath.Join(tmp, filepath.FromSlash(e.Path))); err != nil {
			return fmt.Errorf("link %s: %w", e.Path, err)
		}
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return err
	}
	parent := filepath.Join(base, name)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	dst := filepath.Join(parent, rev)
	if _, err := os.Lstat(dst); err == nil {
		// Swap the new tree in, then remove the old one from tmp/.
		if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dst, unix.RENAME_EXCHANGE); err != nil {
			s.removeTree(dst)
			if err := os.Rename(tmp, dst); err != nil {
				return err
			}
		} else {
			os.RemoveAll(tmp)
		}
	} else if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	ok = true
	if err := syncDir(parent); err != nil {
		s.log.Warn("fsync tree parent", "dir", parent, "err", err)
	}
	s.hit("tree.after-rename")
	return nil
}

// removeTree takes a tree out of view with one rename, then deletes it.
func (s *Store) removeTree(dir string) {
	trash, err := os.MkdirTemp(filepath.Join(s.root, dirTmp), "trash-")
	if err == nil {
		if err := os.Rename(dir, filepath.Join(trash, "t")); err == nil {
			dir = trash
		} else {
			os.Remove(trash)
		}
	}
	if err := os.RemoveAll(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		s.log.Warn("remove tree", "dir", dir, "err", err)
	}
}

func (s *Store) setCurrentLink(parent, rev string) error {
	link := filepath.Join(parent, currentLink)
	if rev == "" {
		err := os.Remove(link)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	if cur, err := os.Readlink(link); err == nil && cur == rev {
		return nil
	}
	if err := renameio.Symlink(rev, link); err != nil {
		return err
	}
	return syncDir(parent)
}

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
func (s *Store) List() ([]Artifact, error) { return s.list(true) }

// ListSummaries returns every artifact sorted by name, without manifests:
// the cheap read behind listing thousands of artifacts. The summaries are
// decoded once per state of the index (per committed write transaction)
// and kept; each call gets its own slices, but Metadata and Annotations
// are shared with the next caller: read them, never modify them in place.
func (s *Store) ListSummaries() ([]Artifact, error) {
	var out []Artifact
	err := s.db.View(func(tx *bolt.Tx) error {
		s.sumMu.Lock()
		arts, ok := s.sums, s.sumsTx == tx.ID() && s.sums != nil
		s.sumMu.Unlock()
		if !ok {
			var err error
			if arts, err = readArtifacts(tx, false); err != nil {
				return err
			}
			s.sumMu.Lock()
			s.sums, s.sumsTx = arts, tx.ID()
			s.sumMu.Unlock()
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

func (s *Store) list(manifests bool) ([]Artifact, error) {
	var out []Artifact
	err := s.db.View(func(tx *bolt.Tx) (err error) {
		out, err = readArtifacts(tx, manifests)
		return err
	})
	return out, err
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
	base, err := s.kindDir(kind)
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
	base, _ := s.kindDir(victims[0].Kind)
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
		s.removeTree(filepath.Join(parent, v.Revision))
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

// PutDesire stores the daemon's opaque desired-state record for name.
func (s *Store) PutDesire(name string, raw []byte) error {
	return s.putRecord(bucketDesires, name, raw)
}

// DeleteDesire removes the desired-state record for name.
func (s *Store) DeleteDesire(name string) error { return s.deleteRecord(bucketDesires, name) }

// Desires returns every desired-state record.
func (s *Store) Desires() (map[string][]byte, error) { return s.records(bucketDesires) }

// putRecord, deleteRecord and records keep the daemon's opaque records
// of a top-level bucket (desires, holds).
func (s *Store) putRecord(bucket []byte, key string, raw []byte) error {
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put([]byte(key), raw) })
}

func (s *Store) deleteRecord(bucket []byte, key string) error {
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Delete([]byte(key)) })
}

func (s *Store) records(bucket []byte) (map[string][]byte, error) {
	out := map[string][]byte{}
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).ForEach(func(k, v []byte) error {
			out[string(k)] = append([]byte(nil), v...)
			return nil
		})
	})
	return out, err
}
