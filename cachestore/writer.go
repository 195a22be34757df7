package cachestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	ioAlign = 4096 // O_DIRECT alignment of offsets, lengths and memory
	// A writer has two buffers (WithWriteBuffer sizes them): one filled
	// from the network and hashed while the other is written. A crash
	// (kill -9) loses at most those two of what it read: a resume fetches
	// them again. More buffers of the same size were no faster (the size
	// of a write is what counts, not the queue: docs/benchmarks.md).
	ioBuffers  = 2        // buffers per writer
	syncEvery  = 64 << 20 // fdatasync this often while writing: Commit's fsync then has little left (docs/benchmarks.md)
	ingestData = "data"
	ingestRef  = "ref"
)

// ingestOwner holds WriterOpts.Owner beside the data.
const ingestOwner = "owner"

// WriterOpts describes one ingest.
type WriterOpts struct {
	// Ref names the ingest; reopening the same ref resumes it. Required.
	Ref string
	// Size is the expected total size, or -1 when unknown. Writes beyond it
	// fail at once, so a body longer than announced cannot fill the disk.
	Size int64
	// Lease, when set, protects the committed blob from GC until released.
	Lease *Lease
	// Check, when set, reads the complete data once more before it becomes
	// a blob (a second digest, such as a git blob sha1); an error fails the
	// commit like a digest mismatch.
	Check func(io.Reader) error
	// Owner, when set, is recorded beside the partial data (an artifact
	// name, opaque to the store): GC asks the abandoned predicate
	// (WithAbandoned) about it when no writer holds the ingest open.
	Owner string
	// Digest, when set with a known Size, is the digest the data should
	// have: while the Writer is open, readers may follow the bytes written
	// and hashed so far (Store.OpenGrowing; Store.WatchBlob tells when).
	// It checks nothing: Commit checks the digest it is given.
	Digest string
}

// Writer streams one blob into the store. The caller's goroutine copies
// from the network and hashes each buffer as it fills; another goroutine
// writes it (with O_DIRECT where the filesystem allows it), so the disk
// works while the next buffer is read and hashed. Hashing on a third
// goroutine would wake two goroutines per buffer, not one and wait for
// both: measured no faster, and more CPU (docs/benchmarks.md).
//
// A Writer is not safe for concurrent use. After Commit or Close it must not
// be used again; reopen the ref with Store.Writer to resume.
type Writer struct {
	s      *Store
	opts   WriterOpts
	dir    string
	f      *os.File
	direct bool
	offset int64 // bytes accepted so far, including the current buffer
	start  int64 // offset at which this writer resumed

	h        hash.Hash
	cur      *ioBuf
	free     chan *ioBuf
	bufs     int // buffers taken from the store's pool, at most ioBuffers
	writeCh  chan *ioBuf
	wg       sync.WaitGroup
	unsynced int64 // bytes written since the last fdatasync (write goroutine only)
	times    stageTimes
	errMu    sync.Mutex
	err      error
	closed   bool
	prog     *progress // what readers of the growing blob follow; nil without opts.Digest
	handed   time.Time // when ReadFrom last handed a buffer on (handOff)
	released bool
}

// Stages is where a Writer's time went, summed over its life: hashing
// (on the caller's goroutine, between reads), writing the data (on
// another goroutine, beside the reads), and fsync (the periodic
// fdatasyncs while writing and the one at Commit). A stage that takes as
// long as the whole transfer is the one that bounds it.
// Wait is the time the caller's Write or ReadFrom waited for a free
// buffer: the disk falling behind.
type Stages struct {
	Hash, Write, Sync, Wait time.Duration
}

type stageTimes struct{ hash, write, sync, wait atomic.Int64 } // nanoseconds

// Stages returns the time spent so far in each stage; safe to call at any
// time, final after Commit, Close or Abort.
func (w *Writer) Stages() Stages {
	return Stages{
		Hash:  time.Duration(w.times.hash.Load()),
		Write: time.Duration(w.times.write.Load()),
		Sync:  time.Duration(w.times.sync.Load()),
		Wait:  time.Duration(w.times.wait.Load()),
	}
}
func (s *Store) openWriter(ctx context.Context, opts WriterOpts) (*Writer, error) {
	dir := filepath.Join(s.root, dirIngest, ingestDirName(opts.Ref))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("ingest %s: %w", opts.Ref, err)
	}
	if err := os.WriteFile(filepath.Join(dir, ingestRef), []byte(opts.Ref), 0o600); err != nil {
		return nil, fmt.Errorf("ingest %s: %w", opts.Ref, err)
	}
	if opts.Owner != "" {
		if err := os.WriteFile(filepath.Join(dir, ingestOwner), []byte(opts.Owner), 0o600); err != nil {
			return nil, fmt.Errorf("ingest %s: %w", opts.Ref, err)
		}
	}
	path := filepath.Join(dir, ingestData)
	w := &Writer{s: s, opts: opts, dir: dir, h: sha256.New()}
	if opts.Digest != "" {
		d, err := NormalizeDigest(opts.Digest)
		if err != nil {
			return nil, fmt.Errorf("ingest %s: %w", opts.Ref, err)
		}
		w.opts.Digest = d
	}

	// Resume: keep what is on disk up to a 4 KiB boundary and re-hash it.
	var have int64
	if fi, err := os.Stat(path); err == nil {
		have = fi.Size() &^ (ioAlign - 1)
		if opts.Size >= 0 && have > opts.Size {
			have = 0 // longer than the whole blob: not ours, start over
		}
	}
	if have > 0 {
		if err := os.Truncate(path, have); err != nil {
			return nil, fmt.Errorf("ingest %s: %w", opts.Ref, err)
		}
		if err := hashFile(ctx, path, w.h); err != nil {
			return nil, fmt.Errorf("ingest %s: re-hash partial data: %w", opts.Ref, err)
		}
	} else if err := os.Truncate(path, 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("ingest %s: %w", opts.Ref, err)
	}
	w.offset, w.start = have, have

	flags := os.O_WRONLY | os.O_CREATE
	if s.directIO {
		f, err := os.OpenFile(path, flags|syscall.O_DIRECT, 0o600)
		if err == nil {
			w.f, w.direct = f, true
		}
	}
	if w.f == nil {
		f, err := os.OpenFile(path, flags, 0o600)
		if err != nil {
			return nil, fmt.Errorf("ingest %s: %w", opts.Ref, err)
		}
		w.f = f
	}

	w.free = make(chan *ioBuf, ioBuffers) // filled as needed (next): a small blob takes one buffer
	w.writeCh = make(chan *ioBuf, ioBuffers)
	w.wg.Add(1)
	go w.writeLoop()
	if w.opts.Digest != "" && opts.Size >= 0 {
		w.prog = newProgress(w.opts.Digest, opts.Size, path, have)
		s.growing.add(w.prog)
	}
	return w, nil
}

func hashFile(ctx context.Context, path string, h hash.Hash) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(h, ctxReader{ctx, f})
	return err
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

func (w *Writer) setErr(err error) {
	w.errMu.Lock()
	if w.err == nil {
		w.err = err
	}
	w.errMu.Unlock()
}

func (w *Writer) getErr() error {
	w.errMu.Lock()
	defer w.errMu.Unlock()
	return w.err
}

func (w *Writer) writeLoop() {
	defer w.wg.Done()
	for b := range w.writeCh {
		if w.getErr() == nil {
			if err := w.writeBuf(b); err != nil {
				w.setErr(fmt.Errorf("ingest %s: write: %w", w.opts.Ref, err))
			} else if w.prog != nil {
				w.prog.advance(b.pos + int64(b.n)) // written and, before it was sent here, hashed
				w.s.growing.notify(w.prog.digest)
			}
		}
		b.n = 0
		w.free <- b
	}
}

func (w *Writer) writeBuf(b *ioBuf) error {
	if w.direct && b.n%ioAlign != 0 {
		// The tail of a blob: leave O_DIRECT for the rest of this file.
		w.clearDirect()
	}
	t0 := time.Now()
	_, err := w.f.WriteAt(b.mem[:b.n], b.pos)
	if err != nil && w.direct && errors.Is(err, syscall.EINVAL) {
		// The filesystem accepted O_DIRECT at open but refuses the write.
		w.clearDirect()
		_, err = w.f.WriteAt(b.mem[:b.n], b.pos)
	}
	w.times.write.Add(int64(time.Since(t0)))
	if err == nil {
		if w.direct {
			w.s.directBytes.Add(int64(b.n))
		}
		w.unsynced += int64(b.n)
		if w.unsynced >= syncEvery && !w.direct {
			// Flush as we go, off the caller's path: the fsync at Commit
			// then has little left to do.
			t0 = time.Now()
			err = unix.Fdatasync(int(w.f.Fd()))
			w.times.sync.Add(int64(time.Since(t0)))
			w.unsynced = 0
		}
	}
	if w.s.hook != nil {
		w.s.hook("ingest.write")
	}
	return err
}

func (w *Writer) clearDirect() {
	fd := int(w.f.Fd())
	if fl, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0); err == nil {
		unix.FcntlInt(uintptr(fd), unix.F_SETFL, fl&^syscall.O_DIRECT)
	}
	w.direct = false
}

// Offset is the number of bytes the blob has so far; a fetcher resumes
// the source at this offset.
func (w *Writer) Offset() int64 { return w.offset }

// Resumed is the offset at which this writer took over from an earlier one.
func (w *Writer) Resumed() int64 { return w.start }

// Write appends p. It fails when the total would exceed the expected size.
func (w *Writer) Write(p []byte) (int, error) {
	if w.closed {
		return 0, fmt.Errorf("ingest %s: write after close", w.opts.Ref)
	}
	if err := w.getErr(); err != nil {
		return 0, err
	}
	if w.opts.Size >= 0 && w.offset+int64(len(p)) > w.opts.Size {
		return 0, fmt.Errorf("ingest %s: %w: more than the expected %d bytes", w.opts.Ref, ErrSizeMismatch, w.opts.Size)
	}
	n := 0
	for n < len(p) {
		if w.cur == nil {
			w.next()
		}
		c := copy(w.cur.mem[w.cur.n:], p[n:])
		w.cur.n += c
		w.offset += int64(c)
		n += c
		if w.cur.n == len(w.cur.mem) {
			w.submit()
		}
	}
	return n, nil
}

// ReadFrom copies from r straight into the pipeline buffers, saving a copy.
func (w *Writer) ReadFrom(r io.Reader) (int64, error) {
	var total int64
	for {
		if err := w.getErr(); err != nil {
			return total, err
		}
		if w.cur == nil {
			w.next()
		}
		room := w.cur.mem[w.cur.n:]
		if w.opts.Size >= 0 {
			left := w.opts.Size - w.offset
			if int64(len(room)) > left+1 {
				room = room[:left+1] // read one more byte to detect an overlong body
			}
		}
		n, err := r.Read(room)
		if w.opts.Size >= 0 && w.offset+int64(n) > w.opts.Size {
			return total, fmt.Errorf("ingest %s: %w: more than the expected %d bytes", w.opts.Ref, ErrSizeMismatch, w.opts.Size)
		}
		w.cur.n += n
		w.offset += int64(n)
		total += int64(n)
		w.handOff()
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// next takes a free buffer for the caller to fill, counting the wait.
func (w *Writer) next() {
	select {
	case w.cur = <-w.free:
	default:
		if w.bufs < ioBuffers {
			left := int64(-1) // a pooled buffer, but for the first of a small blob
			if w.opts.Size >= 0 && w.bufs == 0 {
				left = w.opts.Size - w.offset
			}
			w.bufs++
			w.cur = w.s.bufs.getFor(left)
			break
		}
		t0 := time.Now()
		w.cur = <-w.free
		w.times.wait.Add(int64(time.Since(t0)))
	}
	w.cur.pos = w.offset
}

func (w *Writer) submit() {
	b := w.cur
	w.cur = nil
	if b.n == 0 {
		w.free <- b
		return
	}
	t0 := time.Now()
	w.h.Write(b.mem[:b.n])
	w.times.hash.Add(int64(time.Since(t0)))
	w.writeCh <- b
}

// drain flushes the partial buffer and stops the pipeline.
func (w *Writer) drain() error {
	if w.closed {
		return w.getErr()
	}
	w.closed = true
	if w.cur != nil {
		w.submit()
	}
	close(w.writeCh)
	w.wg.Wait()
	for len(w.free) > 0 {
		w.s.bufs.put(<-w.free)
	}
	return w.getErr()
}

// Close stops writing and keeps the partial data for a later resume.
func (w *Writer) Close() error {
	if w.closed {
		return nil
	}
	err := w.drain()
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	w.release(errClosed)
	return err
}

// Abort stops writing and deletes the partial data.
func (w *Writer) Abort() {
	if !w.closed {
		w.drain()
		w.f.Close()
		w.release(errClosed)
	}
	os.RemoveAll(w.dir)
}

// Commit finishes the blob: it fsyncs, checks the size (when size >= 0)
// and the digest (when expected is not empty), and moves the data into
// blobs/ atomically. It returns the digest. When the blob already exists
// the ingest is discarded and Commit succeeds: identical content is stored
// once. On a size or digest mismatch the partial data is deleted (a resume
// could only repeat the error) and the error wraps ErrSizeMismatch or
// ErrDigestMismatch. The Writer is closed in every case.
func (w *Writer) Commit(ctx context.Context, size int64, expected string) (string, error) {
	got, err := w.finish(ctx, size, expected, true)
	if err != nil {
		return "", err
	}
	// The ingest stays open (never abandoned) until adopted.
	if err := w.s.adoptIngest(ctx, filepath.Join(w.dir, ingestData), got, w.offset, w.opts.Lease); err != nil {
		w.release(err)
		return "", err
	}
	os.RemoveAll(w.dir)
	w.release(nil)
	return got, nil
}

// finish stops writing and checks what was written: size, digest, the
// second check (then growing readers may take the last byte), fsync
// (when sync). It returns the digest; the data stays in the ingest dir
// for the caller to adopt, the ref locked (no sweep takes the ingest)
// until the caller unlocks it. On an error the ref is unlocked; on a
// mismatch the partial data is deleted.
func (w *Writer) finish(ctx context.Context, size int64, expected string, sync bool) (got string, err error) {
	if expected != "" {
		var err error
		if expected, err = NormalizeDigest(expected); err != nil {
			w.Abort()
			return "", err
		}
	}
	defer func() {
		if w.f.Close(); err != nil {
			w.release(err)
		}
	}()
	if err := w.drain(); err != nil {
		return "", err // names the ingest; the data stays for a resume
	}
	if size >= 0 && w.offset != size {
		os.RemoveAll(w.dir)
		return "", fmt.Errorf("ingest %s: %w: got %d bytes, want %d", w.opts.Ref, ErrSizeMismatch, w.offset, size)
	}
	got = DigestPrefix + hex.EncodeToString(w.h.Sum(nil))
	if expected != "" && got != expected {
		os.RemoveAll(w.dir)
		return "", fmt.Errorf("ingest %s: %w: got %s, want %s", w.opts.Ref, ErrDigestMismatch, got, expected)
	}
	if w.opts.Check != nil {
		f, err := os.Open(filepath.Join(w.dir, ingestData))
		if err != nil {
			return "", fmt.Errorf("ingest %s: %w", w.opts.Ref, err)
		}
		err = w.opts.Check(ctxReader{ctx, f})
		f.Close()
		if err != nil {
			os.RemoveAll(w.dir)
			return "", fmt.Errorf("ingest %s: %w: %v", w.opts.Ref, ErrDigestMismatch, err)
		}
	}
	w.prog.verify() // the bytes are the digest's, whatever the fsync and the adoption do
	if sync {
		w.s.hit("ingest.fsync")
		t0 := time.Now()
		err = w.f.Sync()
		w.times.sync.Add(int64(time.Since(t0)))
		if err != nil {
			return "", fmt.Errorf("ingest %s: fsync: %w", w.opts.Ref, err)
		}
	}
	return got, nil
}
