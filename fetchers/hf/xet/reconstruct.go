package xet

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Options say what file Open reconstructs and how.
type Options struct {
	Client *http.Client // CAS and transfer requests (required)
	Tokens *TokenSource // read tokens (required)
	FileID string       // the file's Xet hash (X-Xet-Hash)
	Size   int64        // the file's size
	// Store, when set, answers chunks the node holds; they are not
	// fetched. OID (the file's sha256, hex) is the key Remember records
	// the fetched terms under once the file is whole; "" records nothing.
	Store ChunkStore
	OID   string
	// Window is how many file bytes one reconstruction request covers
	// (download-protocol.md: "request the reconstruction in batches");
	// Conns windows are prepared ahead, which bounds memory (their
	// fetched chunks, and up to 3 assembled windows on their way to the
	// reader). Default 8 MiB.
	Window int64
	// Conns is how many windows are prepared at once (each with up to
	// Conns ranged requests); default 4.
	Conns int
	// Attempts per window (a short range, a corrupt chunk, an expired URL
	// or token ask a new reconstruction: new URLs); default 4.
	Attempts int
}

// Stats counts what a reconstruction moved. Safe for concurrent use.
type Stats struct {
	Fetched  atomic.Int64 // xorb bytes received from the CAS's transfer URLs
	Reused   atomic.Int64 // file bytes answered by the ChunkStore
	Requests atomic.Int64 // ranged xorb requests
}

// Open streams the file from offset, reconstructed per
// download-protocol.md: terms in order, offset_into_first_range skipped,
// the last window cut at the file's end. Errors come from Read; one that
// wraps ErrUnsupported means this client cannot read the file over Xet
// (the caller falls back); others mean the attempts ran out. Closing the
// reader stops the work. The bytes are not verified whole here: the
// caller checks the file's digest.
func Open(ctx context.Context, o Options, offset int64, st *Stats) io.ReadCloser {
	if o.Window <= 0 {
		o.Window = 8 << 20
	}
	if o.Conns <= 0 {
		o.Conns = 4
	}
	if o.Attempts <= 0 {
		o.Attempts = 4
	}
	if st == nil {
		st = &Stats{}
	}
	ctx, cancel := context.WithCancel(ctx)
	r := &windowReader{ch: make(chan []byte, 2), free: make(chan []byte, 3), cancel: cancel}
	go func() {
		defer close(r.ch)
		r.err = o.run(ctx, offset, &windowWriter{ctx: ctx, ch: r.ch, free: r.free}, st)
	}()
	return r
}

// windowReader hands out the file a window at a time: run assembles each
// window whole and sends it, a couple ahead, so the reader copies from
// memory rather than waiting on a pipe's handoff per chunk.
type windowReader struct {
	ch     chan []byte
	free   chan []byte // windows read, for run to fill again
	cur    []byte
	buf    []byte // the window cur is in
	err    error  // run's result, read once ch is closed
	cancel context.CancelFunc
	closed atomic.Bool
}

func (r *windowReader) Read(p []byte) (int, error) {
	for len(r.cur) == 0 {
		if r.closed.Load() {
			return 0, io.ErrClosedPipe
		}
		if r.buf != nil {
			select {
			case r.free <- r.buf[:0]:
			default:
			}
			r.buf = nil
		}
		b, ok := <-r.ch
		if !ok {
			if r.err != nil {
				return 0, r.err
			}
			return 0, io.EOF
		}
		r.cur, r.buf = b, b
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

func (r *windowReader) Close() error {
	r.closed.Store(true)
	r.cancel()
	return nil
}

// windowWriter gathers a window's bytes; flush sends them to the reader.
type windowWriter struct {
	ctx  context.Context
	ch   chan<- []byte
	free <-chan []byte
	buf  []byte
}

// reset starts a window of n bytes, in a buffer the reader is done with
// when one is (fresh pages for each window cost more than the copy).
func (w *windowWriter) reset(n int64) {
	select {
	case b := <-w.free:
		if int64(cap(b)) >= n {
			w.buf = b[:0]
			return
		}
	default:
	}
	w.buf = make([]byte, 0, n)
}

func (w *windowWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	return len(p), nil
}

func (w *windowWriter) flush() error {
	if len(w.buf) == 0 {
		return nil
	}
	select {
	case w.ch <- w.buf:
		w.buf = nil
		return nil
	case <-w.ctx.Done():
		return w.ctx.Err()
	}
}

// prepared is a window ready to emit: its reconstruction, which terms
// the store holds, the chunks fetched for the others.
type prepared struct {
	start, end int64
	rec        *Reconstruction
	held       []bool
	chunks     map[chunkKey][]byte
	err        error
}

// run emits the file from pos. Windows are prepared ahead, Conns at a
// time, and emitted in order; a window that fails is prepared again
// from the byte reached, Attempts times.
func (o *Options) run(ctx context.Context, pos int64, out *windowWriter, st *Stats) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var w io.Writer = out
	futures := make(chan chan prepared, o.Conns)
	go func() {
		defer close(futures)
		for s := pos; s < o.Size; s += o.Window {
			f := make(chan prepared, 1)
			select {
			case futures <- f:
			case <-ctx.Done():
				return
			}
			go func(s, e int64) { f <- o.prepare(ctx, s, e, st) }(s, min(s+o.Window, o.Size))
		}
	}()
	// Remember only what a whole, checked file placed: the terms are
	// recorded under OID, and a file whose bytes do not hash to it (a
	// wrong chunk the CAS served, a misread held chunk) must not teach
	// the store wrong places. A read resumed past 0 cannot check the
	// whole and records nothing.
	whole := sha256.New()
	if pos == 0 {
		w = io.MultiWriter(w, whole)
	}
	checked := pos == 0
	var placed []Placed
	for f := range futures {
		p := <-f
		for attempt := 1; pos < p.end; attempt++ {
			err := p.err
			if err == nil {
				var n int64
				out.reset(p.end - pos)
				n, err = o.emit(ctx, p, w, st, &placed)
				pos += n
				if ferr := out.flush(); ferr != nil {
					return ferr
				}
			}
			if err == nil {
				break
			}
			if errors.Is(err, ErrUnsupported) || ctx.Err() != nil || attempt >= o.Attempts {
				return err
			}
			if errors.Is(err, ErrExpired) {
				o.Tokens.Invalidate()
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
			}
			p = o.prepare(ctx, pos, p.end, st)
		}
	}
	if pos < o.Size {
		return ctx.Err()
	}
	if checked && o.Store != nil && o.OID != "" && len(placed) > 0 && hex.EncodeToString(whole.Sum(nil)) == o.OID {
		// Best effort: a node that cannot remember only fetches more later.
		_ = o.Store.Remember(ctx, o.OID, dedupPlaced(placed))
	}
	return nil
}

type chunkKey struct {
	xorb string
	idx  uint32
}

// prepare asks the reconstruction of file bytes [start, end) and fetches
// the chunks of the terms the store does not hold.
func (o *Options) prepare(ctx context.Context, start, end int64, st *Stats) prepared {
	p := prepared{start: start, end: end}
	tok, err := o.Tokens.Get(ctx)
	if err != nil {
		p.err = err
		return p
	}
	if p.rec, p.err = GetReconstruction(ctx, o.Client, tok, o.FileID, uint64(start), uint64(end-1)); p.err != nil {
		return p
	}
	p.held = o.probe(ctx, p.rec.Terms)
	need := map[string][]ChunkRange{}
	for i, t := range p.rec.Terms {
		if !p.held[i] {
			need[t.Hash] = append(need[t.Hash], t.Range)
		}
	}
	p.chunks, p.err = o.fetchAll(ctx, p.rec, need, st)
	return p
}

// probe says which terms the ChunkStore holds whole.
func (o *Options) probe(ctx context.Context, terms []Term) []bool {
	held := make([]bool, len(terms))
	if o.Store == nil {
		return held
	}
	for i, t := range terms {
		if r, ok := o.Store.Chunks(ctx, t.Hash, t.Range.Start, t.Range.End); ok {
			r.Close()
			held[i] = true
		}
	}
	return held
}

// emit writes the terms in order: offset_into_first_range skipped from
// the first, the whole cut at end-start bytes (download-protocol.md,
// "Stage 3").
func (o *Options) emit(ctx context.Context, p prepared, w io.Writer, st *Stats, placed *[]Placed) (int64, error) {
	rec, held, chunks, start, end := p.rec, p.held, p.chunks, p.start, p.end
	skip := int64(rec.OffsetIntoFirstRange)
	fileOff := start - skip // where the first term's first chunk sits in the file
	var written int64
	want := end - start
	for i, t := range rec.Terms {
		if written == want {
			break
		}
		n := int64(t.UnpackedLength)
		if skip >= n {
			skip -= n
			fileOff += n
			continue
		}
		take := min(n-skip, want-written)
		if held[i] {
			r, ok := o.Store.Chunks(ctx, t.Hash, t.Range.Start, t.Range.End)
			if !ok {
				return written, fmt.Errorf("xet: xorb %s chunks [%d, %d) left the store", t.Hash, t.Range.Start, t.Range.End)
			}
			_, err := io.CopyN(io.Discard, r, skip)
			var k int64
			if err == nil {
				k, err = io.CopyN(w, r, take)
			}
			r.Close()
			written += k
			st.Reused.Add(k)
			if err != nil {
				return written, fmt.Errorf("xet: reading held chunks of xorb %s: %w", t.Hash, err)
			}
		} else {
			p := Placed{Xorb: t.Hash, First: t.Range.Start, End: t.Range.End, Offset: fileOff}
			var total int64
			for idx := t.Range.Start; idx < t.Range.End; idx++ {
				c, ok := chunks[chunkKey{t.Hash, idx}]
				if !ok {
					return written, fmt.Errorf("%w: xorb %s chunk %d: fetched nowhere", ErrUnsupported, t.Hash, idx)
				}
				p.ChunkLens = append(p.ChunkLens, uint32(len(c)))
				total += int64(len(c))
			}
			if total != n {
				return written, fmt.Errorf("%w: xorb %s chunks [%d, %d): %d bytes, the term says %d", ErrCorrupt, t.Hash, t.Range.Start, t.Range.End, total, n)
			}
			for idx := t.Range.Start; idx < t.Range.End && take > 0; idx++ {
				c := chunks[chunkKey{t.Hash, idx}]
				if skip >= int64(len(c)) {
					skip -= int64(len(c))
					continue
				}
				c = c[skip:]
				skip = 0
				c = c[:min(int64(len(c)), take)]
				k, err := w.Write(c)
				written += int64(k)
				take -= int64(k)
				if err != nil {
					return written, err
				}
			}
			if fileOff >= 0 && fileOff+n <= o.Size {
				*placed = append(*placed, p)
			}
		}
		skip = 0
		fileOff += n
	}
	if written < want {
		return written, fmt.Errorf("%w: reconstruction of [%d, %d) holds %d bytes", ErrCorrupt, start, end, written)
	}
	return written, nil
}

// dedupPlaced drops repeats (a term cut at a window's end comes again
// at the start of the next) and sorts by offset.
func dedupPlaced(p []Placed) []Placed {
	sort.SliceStable(p, func(i, j int) bool { return p[i].Offset < p[j].Offset })
	out := p[:0]
	for i, x := range p {
		if i > 0 {
			y := out[len(out)-1]
			if y.Offset == x.Offset && y.Xorb == x.Xorb && y.First == x.First && y.End == x.End {
				continue
			}
		}
		out = append(out, x)
	}
	return out
}

// job is one ranged request: a signed URL and the ranges of it needed.
type job struct {
	xorb   string
	url    string
	ranges []RangeDescriptor
}

// fetchAll fetches the chunks of need from the fetches rec offers,
// merged per signed URL into one multi-range request, Conns at a time.
func (o *Options) fetchAll(ctx context.Context, rec *Reconstruction, need map[string][]ChunkRange, st *Stats) (map[chunkKey][]byte, error) {
	var jobs []job
	for x, ranges := range need {
		covered := make([]bool, len(ranges))
		for _, f := range rec.Xorbs[x] {
			j := job{xorb: x, url: f.URL}
			for _, d := range f.Ranges {
				use := false
				for i, r := range ranges {
					if r.Start < d.Chunks.End && d.Chunks.Start < r.End {
						use = true
					}
					if d.Chunks.Start <= r.Start && r.End <= d.Chunks.End {
						covered[i] = true
					}
				}
				if use {
					j.ranges = append(j.ranges, d)
				}
			}
			if len(j.ranges) > 0 {
				jobs = append(jobs, j)
			}
		}
		for i, c := range covered {
			if !c {
				return nil, fmt.Errorf("%w: no fetch covers xorb %s chunks [%d, %d)", ErrUnsupported, x, ranges[i].Start, ranges[i].End)
			}
		}
	}
	out := map[chunkKey][]byte{}
	var mu sync.Mutex
	var first error
	sem := make(chan struct{}, o.Conns)
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func(j job) {
			defer func() { <-sem; wg.Done() }()
			err := fetchRanges(ctx, o.Client, j, need[j.xorb], st, func(idx uint32, c []byte) {
				mu.Lock()
				out[chunkKey{j.xorb, idx}] = c
				mu.Unlock()
			})
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
					cancel()
				}
				mu.Unlock()
			}
		}(j)
	}
	wg.Wait()
	return out, first
}
