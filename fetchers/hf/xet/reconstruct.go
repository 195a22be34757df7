package xet

import (
	"context"
	"errors"
	"io"
	"net/http"
	"sort"
	"strings"
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
	// the fetched terms under once the caller says a blob of that digest
	// was committed from the whole file (Reader.Committed); "" records
	// nothing.
	Store ChunkStore
	OID   string
	// Window is how many file bytes one reconstruction request covers
	// (download-protocol.md: "request the reconstruction in batches").
	// Windows are assembled ahead, Conns at a time, each in one buffer
	// (its terms whole: the window and at most a chunk each side), which
	// bounds memory to about Conns+3 windows. Default 8 MiB.
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
// caller checks the file's digest, and tells Committed.
func Open(ctx context.Context, o Options, offset int64, st *Stats) *Reader {
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
	rctx, cancel := context.WithCancel(ctx)
	r := &Reader{ctx: ctx, o: o, ch: make(chan window, 1), free: make(chan []byte, o.Conns+3), cancel: cancel}
	go func() {
		defer close(r.ch)
		r.err = r.run(rctx, offset, st)
	}()
	return r
}

// window is one window's bytes, data, within the buffer buf that
// prepare assembled its terms in.
type window struct{ data, buf []byte }

// Reader hands out the file a window at a time: run assembles each
// window whole, several ahead, and sends it, so the reader copies from
// memory rather than waiting on a pipe's handoff per chunk.
type Reader struct {
	ctx    context.Context // Open's: Remember's after Close
	o      Options
	ch     chan window
	free   chan []byte // buffers read, for prepare to fill again
	cur    []byte
	buf    []byte // the buffer cur is in
	err    error  // run's result, read once ch is closed
	placed []Placed
	whole  atomic.Bool // read from byte 0 to the end, without error
	cancel context.CancelFunc
	closed atomic.Bool
}

func (r *Reader) Read(p []byte) (int, error) {
	for len(r.cur) == 0 {
		if r.closed.Load() {
			return 0, io.ErrClosedPipe
		}
		if r.buf != nil {
			select {
			case r.free <- r.buf:
			default:
			}
			r.buf = nil
		}
		w, ok := <-r.ch
		if !ok {
			recycle(r.free)
			if r.err != nil {
				return 0, r.err
			}
			r.whole.Store(r.placed != nil)
			return 0, io.EOF
		}
		r.cur, r.buf = w.data, w.buf
	}
	n := copy(p, r.cur)
	r.cur = r.cur[n:]
	return n, nil
}

// Close stops the work; the buffers of windows already read go to the
// next reader.
func (r *Reader) Close() error {
	r.closed.Store(true)
	r.cancel()
	recycle(r.free)
	return nil
}

// Committed is the caller's word that a blob of this digest
// ("sha256:<hex>" or bare hex) was committed from the bytes this reader
// gave, its digest checked. When the reader gave the whole file from
// byte 0 and the digest is the file's OID, the store learns where its
// terms sit, fetched and reused (ChunkStore.Remember): only a checked
// whole teaches it, so a wrong chunk the CAS served, or a wrong OID,
// teaches nothing.
// Best effort: a node that cannot remember only fetches more later.
func (r *Reader) Committed(digest string) {
	d := strings.TrimPrefix(digest, "sha256:")
	if !r.whole.Load() || len(r.placed) == 0 || r.o.Store == nil || r.o.OID == "" || d != r.o.OID {
		return
	}
	_ = r.o.Store.Remember(r.ctx, r.o.OID, r.placed)
}

// run emits the file from pos. Windows are prepared ahead, Conns at a
// time, and emitted in order; a window that fails is prepared again,
// Attempts times. A run from byte 0 that reaches the end keeps where
// the file's terms sit for Committed.
func (r *Reader) run(ctx context.Context, pos int64, st *Stats) error {
	o := &r.o
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
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
			go func(s, e int64) { f <- o.prepare(ctx, s, e, st, r.free) }(s, min(s+o.Window, o.Size))
		}
	}()
	from := pos
	placed := []Placed{}
	for f := range futures {
		p := <-f
		for attempt := 1; p.err != nil; attempt++ {
			if errors.Is(p.err, ErrUnsupported) || ctx.Err() != nil || attempt >= o.Attempts {
				return p.err
			}
			if errors.Is(p.err, ErrExpired) {
				o.Tokens.Invalidate()
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Duration(attempt) * 100 * time.Millisecond):
			}
			p = o.prepare(ctx, p.start, p.end, st, r.free)
		}
		st.Reused.Add(p.reused)
		placed = append(placed, p.placed...)
		select {
		case r.ch <- window{p.buf[p.skip : p.skip+p.end-p.start], p.buf}:
		case <-ctx.Done():
			return ctx.Err()
		}
		pos = p.end
	}
	if pos < o.Size {
		return ctx.Err()
	}
	if from == 0 {
		r.placed = dedupPlaced(placed)
	}
	return nil
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
