package fetchers

import (
	"context"
	"fmt"
	"io"
	"math"
	"sync"
	"time"
)

// RangeFunc opens bytes [off, off+n) of a file; n < 0 means to its end.
type RangeFunc func(ctx context.Context, off, n int64) (io.ReadCloser, error)

// DefaultRangeBelow is the rate, in bytes per second spent waiting on the
// source, under which one connection is taken to be the limit of a file's
// transfer, so more Range connections pay: the per-connection limits of
// CDNs and object stores are well below it, while a source faster than it
// leaves the node's own pipeline (hashing, the disk) as the bound, where
// more connections only add copies and requests.
const DefaultRangeBelow = 256 << 20

// DefaultChunk is the bytes of one Range request of the hf, s3 and ngc
// fetchers unless set otherwise: the unit they fetch a large file in.
const DefaultChunk = 8 << 20

// Ranged is a file that can be read in byte ranges.
type Ranged struct {
	Open  RangeFunc
	Size  int64 // the whole file's; < 0 (unknown) reads one stream
	Chunk int64 // bytes of one Range request
	Conns int   // the most connections at once; 1 reads one stream
	// Below: Range connections are added when the stream delivers less
	// than this many bytes per second spent inside its Read (the time the
	// caller spends with the bytes does not count). 0 means
	// DefaultRangeBelow; +Inf adds connections after the first chunks
	// whatever the rates (tests of the ranges).
	Below   float64
	Backoff Backoff // for each Range request
}

// AdaptiveReader streams the file from offset on one connection straight
// into the caller's buffers, and measures it: after a first chunk (TCP's
// slow start) it checks at every chunk how fast the stream delivers per
// second spent waiting on it, and how much of the time the caller spends
// waiting on it. While the rate is at least r.Below, or the caller spends
// more than a quarter of its time on its own work (a pipeline waiting for
// its hashing or disk, or a loopback origin starved of CPU by it), the
// source is not what bounds the transfer and the file stays on one
// connection. Otherwise, with at least two chunks left, the stream serves one more chunk while
// Range requests of r.Chunk bytes take the rest, up to r.Conns at once
// (the stream's connection counts until it ends). A chunk that fails is
// retried with r.Backoff; when it cannot be had, Read returns the error
// and the caller resumes from what it has. Close stops the requests in
// flight. An error opening the stream is returned at once.
func AdaptiveReader(ctx context.Context, r Ranged, offset int64) (io.ReadCloser, error) {
	stream, err := r.Open(ctx, offset, -1)
	if err != nil || r.Conns <= 1 || r.Size < 0 || r.Size-offset < 4*r.Chunk {
		return stream, err
	}
	if r.Below <= 0 {
		r.Below = DefaultRangeBelow
	}
	return &adaptive{ctx: ctx, r: r, stream: stream, pos: offset, end: r.Size,
		warm: offset + r.Chunk, check: offset + 2*r.Chunk}, nil
}

type adaptive struct {
	ctx    context.Context
	r      Ranged
	stream io.ReadCloser // nil once it served its part
	pos    int64         // the next byte the caller gets
	end    int64         // the stream serves up to here: the size, until the switch

	warm   int64         // measuring starts here
	check  int64         // the next position the rate is judged at
	got    int64         // bytes since warm
	waited time.Duration // spent inside the stream's Read since warm
	since  time.Time     // when measuring started

	par     io.ReadCloser // the Range requests from end on, once switched
	handoff chan struct{} // closed when the stream ends: its connection is the ranges'
	once    sync.Once
}

func (a *adaptive) Read(p []byte) (int, error) {
	if a.stream != nil && a.pos >= a.end {
		a.endStream()
	}
	if a.stream == nil {
		if a.par == nil {
			return 0, io.EOF
		}
		return a.par.Read(p)
	}
	if left := a.end - a.pos; int64(len(p)) > left {
		p = p[:left]
	}
	t0 := time.Now()
	n, err := a.stream.Read(p)
	d := time.Since(t0)
	a.pos += int64(n)
	if a.par == nil {
		a.observe(n, d)
	}
	if a.par != nil && err == io.EOF {
		if a.pos < a.end {
			return n, fmt.Errorf("stream ended at byte %d, before %d: %w", a.pos, a.end, io.ErrUnexpectedEOF)
		}
		err = nil // the ranges go on
	}
	return n, err
}

// observe measures the stream and switches to Range requests when it is
// the bound.
func (a *adaptive) observe(n int, d time.Duration) {
	if a.pos <= a.warm {
		return
	}
	if a.since.IsZero() {
		a.since = time.Now().Add(-d)
	}
	a.got += int64(n)
	a.waited += d
	if a.pos < a.check {
		return
	}
	a.check += a.r.Chunk
	slow := a.waited > 0 && float64(a.got)/a.waited.Seconds() < a.r.Below
	waiting := 4*a.waited >= 3*time.Since(a.since) || math.IsInf(a.r.Below, 1) // the caller waits on the source, not on its own work
	if !slow || !waiting || a.r.Size-a.pos < 2*a.r.Chunk {
		return
	}
	a.end = a.pos + a.r.Chunk
	a.handoff = make(chan struct{})
	a.par = parallelReader(a.ctx, a.r.Open, a.end, a.r.Size, a.r.Chunk, a.r.Conns, a.r.Backoff, a.handoff)
}

func (a *adaptive) endStream() {
	a.stream.Close()
	a.stream = nil
	if a.handoff != nil {
		a.once.Do(func() { close(a.handoff) })
	}
}

func (a *adaptive) Close() error {
	if a.stream != nil {
		a.endStream()
	}
	if a.par != nil {
		return a.par.Close()
	}
	return nil
}

// parallelReader reads a file of size bytes from offset with up to conns
// Range requests in flight, chunk bytes each, and returns the bytes in
// order; while handoff is open, one of the conns is another's (the stream
// before it). It holds at most conns+1 chunks in memory.
func parallelReader(ctx context.Context, open RangeFunc, offset, size, chunk int64, conns int, b Backoff, handoff <-chan struct{}) io.ReadCloser {
	ctx, cancel := context.WithCancel(ctx)
	p := &parallel{cancel: cancel, results: make(chan chan chunkResult, conns)}
	sem := make(chan struct{}, conns)
	if handoff != nil {
		sem <- struct{}{}
		go func() {
			select {
			case <-handoff:
				<-sem
			case <-ctx.Done():
			}
		}()
	}
	go func() {
		defer close(p.results)
		for off := offset; off < size; off += chunk {
			n := min(chunk, size-off)
			res := make(chan chunkResult, 1)
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			select {
			case p.results <- res:
			case <-ctx.Done():
				return
			}
			go func(off, n int64) {
				defer func() { <-sem }()
				buf := getChunk(n)
				err := b.Do(ctx, func(int) error {
					rc, err := open(ctx, off, n)
					if err != nil {
						return err
					}
					defer rc.Close()
					got, err := io.ReadFull(rc, buf)
					if err != nil {
						return fmt.Errorf("range %d+%d: got %d bytes: %w", off, n, got, err)
					}
					return nil
				}, nil)
				res <- chunkResult{buf, err}
			}(off, n)
		}
	}()
	return p
}

var chunkPool sync.Pool // of *[]byte, reused across readers of the same chunk size

func getChunk(n int64) []byte {
	if p, ok := chunkPool.Get().(*[]byte); ok && int64(cap(*p)) >= n {
		return (*p)[:n]
	}
	return make([]byte, n)
}

func putChunk(b []byte) {
	if cap(b) > 0 {
		b = b[:cap(b)]
		chunkPool.Put(&b)
	}
}

type chunkResult struct {
	b   []byte
	err error
}

type parallel struct {
	cancel  context.CancelFunc
	results chan chan chunkResult
	cur     []byte
	whole   []byte // the chunk cur is a tail of, returned to the pool when read
	err     error
	once    sync.Once
}

func (p *parallel) Read(b []byte) (int, error) {
	for len(p.cur) == 0 {
		if p.whole != nil {
			putChunk(p.whole)
			p.whole = nil
		}
		if p.err != nil {
			return 0, p.err
		}
		next, ok := <-p.results
		if !ok {
			return 0, io.EOF
		}
		r := <-next
		if r.err != nil {
			p.err = r.err
			return 0, r.err
		}
		p.cur, p.whole = r.b, r.b
	}
	n := copy(b, p.cur)
	p.cur = p.cur[n:]
	return n, nil
}

func (p *parallel) Close() error {
	p.once.Do(func() {
		p.cancel()
		for next := range p.results { // let the fetchers finish and drop their buffers
			if r := <-next; r.err == nil {
				putChunk(r.b)
			}
		}
	})
	return nil
}
