package cachestore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// ErrIngestEnded: the Writer behind a Growing stopped before the blob was
// whole (closed for a later resume, aborted, failed, or its size or
// digest did not match): no more bytes come through that view.
var ErrIngestEnded = errors.New("ingest ended before the blob was whole")

// Growing is a read-only view of a blob that a Writer is still writing
// (Store.OpenGrowing): the first Written bytes were written to the
// ingest's data file and hashed into the digest Commit will check, and
// do not change after. They are not verified: the digest is known only
// once the blob is whole, so whoever takes them must check the whole
// blob's digest before trusting it (a peer's Commit does). The view
// reads through its own open file, so the writer's commit (a rename) or
// its end does not cut what is readable. Safe for concurrent use; Close
// it.
type Growing struct {
	p *progress
	f *os.File
}

// Digest is the digest the writer expects (WriterOpts.Digest).
func (g *Growing) Digest() string { return g.p.digest }

// Size is the whole blob's size in bytes (WriterOpts.Size).
func (g *Growing) Size() int64 { return g.p.size }

// Written is how many bytes from the start may be read now.
func (g *Growing) Written() int64 {
	n, _, _, _ := g.p.state()
	return n
}

// Wait returns once more than have bytes are readable, have is Size or
// more, the writer ended, or ctx ended; n is how many are readable then.
// The error is ctx's; one wrapping ErrIngestEnded when the writer ended
// before the blob was whole and no more than have bytes are readable;
// or, whatever is readable, one wrapping ErrDigestMismatch or
// ErrSizeMismatch when the writer's commit found the bytes wrong (pass
// none of them on). It polls nothing: the writer wakes its readers after
// each buffer it writes.
func (g *Growing) Wait(ctx context.Context, have int64) (n int64, err error) {
	for {
		n, ended, why, changed := g.p.state()
		switch {
		case ended && (errors.Is(why, ErrDigestMismatch) || errors.Is(why, ErrSizeMismatch)):
			return n, fmt.Errorf("blob %s: %w", g.p.digest, why)
		case n > have || have >= g.p.size:
			return n, nil
		case ended:
			return n, fmt.Errorf("blob %s: %w at byte %d of %d: %v", g.p.digest, ErrIngestEnded, n, g.p.size, why)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return n, ctx.Err()
		}
	}
}

// Whole waits until the writer checked the whole blob (its size and
// digest: before its fsync and commit) or ended: nil when it checked or
// committed it, else an error wrapping
// ErrDigestMismatch or ErrSizeMismatch (the bytes were wrong) or
// ErrIngestEnded (it stopped before committing), or ctx's. A server that
// streams the view sends its last byte only after Whole: a receiver that
// got every byte then got bytes the writer's commit checked.
func (g *Growing) Whole(ctx context.Context) error {
	for {
		n, ended, why, changed := g.p.state()
		switch {
		case g.p.checked() || (ended && why == nil):
			return nil
		case ended && (errors.Is(why, ErrDigestMismatch) || errors.Is(why, ErrSizeMismatch)):
			return fmt.Errorf("blob %s: %w", g.p.digest, why)
		case ended:
			return fmt.Errorf("blob %s: %w at byte %d of %d: %v", g.p.digest, ErrIngestEnded, n, g.p.size, why)
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// ReadAt reads the bytes at off, up to what is written: a read that
// reaches past Written returns what is before it and io.EOF.
func (g *Growing) ReadAt(b []byte, off int64) (int, error) {
	n := g.Written()
	if off >= n {
		return 0, io.EOF
	}
	short := false
	if int64(len(b)) > n-off {
		b, short = b[:n-off], true
	}
	k, err := g.f.ReadAt(b, off)
	if err == nil && short {
		err = io.EOF
	}
	return k, err
}

// Close closes the view's file.
func (g *Growing) Close() error { return g.f.Close() }

// OpenGrowing opens the blob digest that a Writer opened with
// WriterOpts.Digest (and a known Size) is writing now, the one furthest
// along where two are; an error wrapping ErrNotFound when none is (it
// may have been committed in between: a caller that looked for the
// committed blob first looks again).
func (s *Store) OpenGrowing(digest string) (*Growing, error) {
	d, err := NormalizeDigest(digest)
	if err != nil {
		return nil, err
	}
	p := s.growing.best(d)
	if p == nil {
		return nil, fmt.Errorf("blob %s: no ingest writing it: %w", d, ErrNotFound)
	}
	f, err := os.Open(p.path)
	if errors.Is(err, os.ErrNotExist) {
		// Committed (renamed into blobs/) or dropped between the lookup
		// and the open.
		return nil, fmt.Errorf("blob %s: no ingest writing it: %w", d, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", d, err)
	}
	return &Growing{p: p, f: f}, nil
}

// WatchBlob returns a channel that is closed the next time a blob of
// digest may have become openable: committed into blobs/ (OpenBlob), a
// Writer opened to write it (WriterOpts.Digest, OpenGrowing), or such a
// Writer's bytes grown. Take the watch before looking, so that nothing
// is missed in between. stop ends the watch; call it once, whether or
// not the channel closed. A digest nobody watches costs its writers one
// map lookup per buffer.
func (s *Store) WatchBlob(digest string) (changed <-chan struct{}, stop func()) {
	return s.growing.watch(digest)
}

// errClosed is why a growing blob ends when its Writer is closed or
// aborted.
var errClosed = errors.New("writer closed")

// release ends the Writer's hold on its ref, once: its growing blob (if
// any) ends with why (nil: committed whole) and the ref is unlocked.
func (w *Writer) release(why error) {
	if w.released {
		return
	}
	w.released = true
	if w.prog != nil {
		w.s.growing.remove(w.prog, why)
	}
	w.s.refs.unlock(w.opts.Ref)
}

// progress is what a Writer opened with WriterOpts.Digest tells its
// readers: how many bytes from 0 are written and hashed, and whether it
// ended and why.
type progress struct {
	digest string
	size   int64
	path   string // the ingest's data file

	mu       sync.Mutex
	written  int64
	verified bool // the whole blob's size and digest checked (before its commit)
	ended    bool
	why      error         // why it ended; nil when committed whole
	changed  chan struct{} // closed and replaced at each change
}

func newProgress(digest string, size int64, path string, written int64) *progress {
	return &progress{digest: digest, size: size, path: path, written: written, changed: make(chan struct{})}
}

func (p *progress) state() (written int64, ended bool, why error, changed <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.written, p.ended, p.why, p.changed
}

// advance says that the bytes up to n are written (and were hashed
// before).
func (p *progress) advance(n int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n > p.written {
		p.written = n
		close(p.changed)
		p.changed = make(chan struct{})
	}
}

// streamEvery is how long ReadFrom keeps bytes of a blob that others
// read as it lands (a Writer with WriterOpts.Digest) in a buffer that
// is not full: a slow source then shows its bytes to those readers this
// often, not once per buffer (2 MiB by default: 8 s at 256 KiB/s), and a
// stream crossing many nodes, each holding a buffer back, does not wait
// a buffer's time at each.
const streamEvery = 50 * time.Millisecond

// handOff hands ReadFrom's current buffer on to be hashed and written
// when it is full, or, for a blob readers follow, when streamEvery
// passed since the last hand-off: then what it holds goes, less, under
// O_DIRECT (whose writes are whole blocks), the last partial block,
// which starts the next buffer.
func (w *Writer) handOff() {
	full := w.cur.n == len(w.cur.mem)
	if !full && (w.prog == nil || w.cur.n < ioAlign || time.Since(w.handed) < streamEvery) {
		return
	}
	w.handed = time.Now()
	var tail []byte
	if keep := w.cur.n % ioAlign; !full && w.direct && keep > 0 {
		tail = append(tail, w.cur.mem[w.cur.n-keep:w.cur.n]...)
		w.cur.n -= keep
	}
	w.submit()
	if len(tail) > 0 {
		w.next()
		w.cur.pos -= int64(len(tail)) // next took the offset past the kept bytes
		w.cur.n = copy(w.cur.mem, tail)
	}
}

// verify says that the whole blob's size and digest are checked (none:
// a writer with no readers).
func (p *progress) verify() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.verified {
		p.verified = true
		close(p.changed)
		p.changed = make(chan struct{})
	}
}

func (p *progress) checked() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.verified
}

// end says that the writer ended (committed when why is nil); only the
// first end counts.
func (p *progress) end(why error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.ended {
		p.ended, p.why = true, why
		close(p.changed)
		p.changed = make(chan struct{})
	}
}

// growingSet is a store's writers that serve readers (by digest), and
// the watches of digests (WatchBlob).
type growingSet struct {
	mu      sync.Mutex
	by      map[string][]*progress
	watches map[string]*blobWatch
}

type blobWatch struct {
	ch chan struct{}
	n  int // watchers not stopped
}

func (g *growingSet) add(p *progress) {
	g.mu.Lock()
	if g.by == nil {
		g.by = map[string][]*progress{}
	}
	g.by[p.digest] = append(g.by[p.digest], p)
	g.mu.Unlock()
	g.notify(p.digest)
}

// remove ends p with why and takes it out of the set.
func (g *growingSet) remove(p *progress, why error) {
	p.end(why)
	g.mu.Lock()
	defer g.mu.Unlock()
	list := g.by[p.digest]
	for i, q := range list {
		if q == p {
			list = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(list) == 0 {
		delete(g.by, p.digest)
	} else {
		g.by[p.digest] = list
	}
}

// best is the writer of d furthest along, nil when none.
func (g *growingSet) best(d string) *progress {
	g.mu.Lock()
	defer g.mu.Unlock()
	var best *progress
	var most int64 = -1
	for _, p := range g.by[d] {
		if n, _, _, _ := p.state(); n > most {
			best, most = p, n
		}
	}
	return best
}

func (g *growingSet) watch(d string) (<-chan struct{}, func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.watches == nil {
		g.watches = map[string]*blobWatch{}
	}
	w := g.watches[d]
	if w == nil {
		w = &blobWatch{ch: make(chan struct{})}
		g.watches[d] = w
	}
	w.n++
	var once sync.Once
	return w.ch, func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if w.n--; w.n == 0 && g.watches[d] == w {
				delete(g.watches, d)
			}
		})
	}
}

// notify wakes the watches of d.
func (g *growingSet) notify(d string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if w := g.watches[d]; w != nil {
		close(w.ch)
		delete(g.watches, d)
	}
}
