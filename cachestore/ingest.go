package cachestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

func ingestDirName(ref string) string {
	sum := sha256.Sum256([]byte(ref))
	return hex.EncodeToString(sum[:])
}

// Writer opens or resumes the ingest named by opts.Ref. A resumed ingest
// continues at Offset(), which is the length already on disk rounded down
// to 4 KiB (the bytes before it are re-hashed from disk, not re-fetched).
// Only one Writer per ref may be open at a time (ErrLocked).
func (s *Store) Writer(ctx context.Context, opts WriterOpts) (*Writer, error) {
	if opts.Ref == "" {
		return nil, errors.New("ingest: empty ref")
	}
	if err := s.refs.lock(opts.Ref); err != nil {
		return nil, err
	}
	w, err := s.openWriter(ctx, opts)
	if err != nil {
		s.refs.unlock(opts.Ref)
		return nil, err
	}
	return w, nil
}

// CommitBatch commits many small blobs (archive members) together: their
// data is made durable by one syncfs(2) instead of an fsync each, the
// renames into blobs/ follow, one more syncfs makes the directory entries
// durable, and one index transaction records every blob. Each blob keeps
// Commit's order (data durable, rename, entry durable, record), so a crash
// leaves what Commit's would: ingests, or blobs startup repair adopts.
// sizes[i] is ws[i]'s expected size (-1: unknown). It returns one digest
// per writer; on an error every writer not yet committed is aborted.
func (s *Store) CommitBatch(ctx context.Context, ws []*Writer, sizes []int64) ([]string, error) {
	digests := make([]string, len(ws))
	abort := func(from int) {
		for _, w := range ws[from:] {
			w.Abort()
		}
	}
	for i, w := range ws {
		d, err := w.finish(ctx, sizes[i], "", false)
		if err != nil {
			abort(i + 1)
			for _, w := range ws[:i] {
				os.RemoveAll(w.dir)
				w.release(err)
			}
			return nil, err
		}
		digests[i] = d
	}
	// The refs stay locked (their ingests open) until each is adopted or
	// removed: a sweep of abandoned ingests must not take one in between.
	cleanup := func(why error) {
		for _, w := range ws {
			os.RemoveAll(w.dir)
			w.release(why)
		}
	}
	s.hit("batch.sync")
	if err := syncfs(s.root); err != nil {
		err = fmt.Errorf("ingest: syncfs: %w", err)
		cleanup(err)
		return nil, err
	}
	var placed []string
	sizeOf := map[string]int64{}
	for i, w := range ws {
		if l := w.opts.Lease; l != nil {
			l.Hold(digests[i])
		} else {
			s.held.hold(digests[i]) // until recorded: GC must not take it in between
			defer s.held.unhold(digests[i])
		}
		isNew, err := s.placeBlob(filepath.Join(w.dir, ingestData), digests[i])
		if err != nil {
			cleanup(err)
			return nil, err
		}
		sizeOf[digests[i]] = w.offset
		if isNew {
			placed = append(placed, digests[i])
		}
	}
	if len(placed) > 0 {
		if err := syncfs(s.root); err != nil {
			s.log.Warn("syncfs after renaming blobs", "err", err)
		}
		s.hit("blob.after-rename")
	}
	if err := s.putBlobRecords(sizeOf); err != nil {
		s.log.Warn("record blobs; startup repair will adopt them", "err", err)
	}
	cleanup(nil)
	return digests, nil
}

// syncfs flushes the filesystem that holds root.
func syncfs(root string) error {
	f, err := os.Open(root)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Syncfs(int(f.Fd()))
}

// Ingest is a convenience: it writes all of r under ref and commits it.
func (s *Store) Ingest(ctx context.Context, ref string, r io.Reader, size int64, expected string) (string, error) {
	w, err := s.Writer(ctx, WriterOpts{Ref: ref, Size: size})
	if err != nil {
		return "", err
	}
	if _, err := w.ReadFrom(ctxReader{ctx, r}); err != nil {
		w.Close()
		return "", err
	}
	return w.Commit(ctx, size, expected)
}

// refLocks are the refs of the ingests a Writer holds open: one Writer
// per ref at a time.
type refLocks struct {
	mu   sync.Mutex
	open map[string]bool
}

// lock takes ref, ErrLocked when it is open.
func (r *refLocks) lock(ref string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.open[ref] {
		return fmt.Errorf("ingest %s: %w", ref, ErrLocked)
	}
	r.open[ref] = true
	return nil
}

func (r *refLocks) unlock(ref string) {
	r.mu.Lock()
	delete(r.open, ref)
	r.mu.Unlock()
}

func (r *refLocks) isOpen(ref string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.open[ref]
}

// Ingests lists the refs of partial ingests on disk and their sizes.
func (s *Store) Ingests() (map[string]int64, error) {
	list, err := s.ListIngests()
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, in := range list {
		out[in.Ref] = in.Size
	}
	return out, nil
}

// IngestInfo describes one partial ingest on disk.
type IngestInfo struct {
	Ref      string
	Owner    string // WriterOpts.Owner of the last writer; "" when none was given
	Size     int64  // bytes of partial data
	Modified time.Time
	Open     bool // a Writer holds it now (it cannot be removed)
}

// ListIngests lists the partial ingests on disk, oldest first.
func (s *Store) ListIngests() ([]IngestInfo, error) {
	dir := filepath.Join(s.root, dirIngest)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []IngestInfo
	for _, e := range ents {
		ref, err := os.ReadFile(filepath.Join(dir, e.Name(), ingestRef))
		if err != nil {
			continue
		}
		fi, err := os.Stat(filepath.Join(dir, e.Name(), ingestData))
		if err != nil {
			continue
		}
		owner, _ := os.ReadFile(filepath.Join(dir, e.Name(), ingestOwner))
		in := IngestInfo{Ref: string(ref), Owner: string(owner), Size: fi.Size(), Modified: fi.ModTime()}
		in.Open = s.refs.isOpen(in.Ref)
		out = append(out, in)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Modified.Before(out[j].Modified) })
	return out, nil
}

// RemoveIngest deletes a partial ingest that no pull wants any more. It
// fails with ErrLocked while a Writer holds the ref open.
func (s *Store) RemoveIngest(ref string) error {
	if err := s.refs.lock(ref); err != nil {
		return err
	}
	defer s.refs.unlock(ref)
	return os.RemoveAll(filepath.Join(s.root, dirIngest, ingestDirName(ref)))
}

// RemoveAbandoned removes the partial ingests that no writer holds open
// and that the abandoned predicate (WithAbandoned) gives up on, as GC does
// without touching blobs, and returns how many and their bytes.
func (s *Store) RemoveAbandoned() (n int, bytes int64) { return s.removeAbandoned(false) }

// removeAbandoned is RemoveAbandoned; dry only counts.
func (s *Store) removeAbandoned(dry bool) (n int, bytes int64) {
	if s.abandoned == nil {
		return 0, 0
	}
	list, err := s.ListIngests()
	if err != nil {
		return 0, 0
	}
	for _, in := range list {
		if in.Open || !s.abandoned(in) {
			continue
		}
		if !dry {
			if err := s.RemoveIngest(in.Ref); err != nil {
				if !errors.Is(err, ErrLocked) {
					s.log.Warn("gc remove ingest", "owner", in.Owner, "err", err)
				}
				continue
			}
		}
		n++
		bytes += in.Size
	}
	return n, bytes
}
