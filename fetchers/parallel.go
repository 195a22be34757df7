package fetchers

import (
	"context"
	"fmt"
	"io"
	"sync"
)

// RangeFunc opens bytes [off, off+n) of a file.
type RangeFunc func(ctx context.Context, off, n int64) (io.ReadCloser, error)

// ParallelReader reads a file of size bytes from offset with up to conns
// Range requests in flight, chunk bytes each, and returns the bytes in
// order. It holds at most conns+1 chunks in memory. A chunk that fails is
// retried with b; when it cannot be had, Read returns the error and the
// caller resumes from what it has (a new reader at its offset). Close
// stops the requests in flight.
func ParallelReader(ctx context.Context, open RangeFunc, offset, size, chunk int64, conns int, b Backoff) io.ReadCloser {
	ctx, cancel := context.WithCancel(ctx)
	p := &parallel{cancel: cancel, results: make(chan chan chunkResult, conns)}
	go func() {
		defer close(p.results)
		sem := make(chan struct{}, conns)
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
