package fetchers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// CountingReader adds every byte read to N.
type CountingReader struct {
	R io.Reader
	N *atomic.Int64
}

func (c CountingReader) Read(p []byte) (int, error) {
	n, err := c.R.Read(p)
	c.N.Add(int64(n))
	return n, err
}

// RateLimited limits reads from r to the limiter's rate. A nil limiter
// returns r unchanged. The limiter may be shared to bound a whole daemon.
func RateLimited(ctx context.Context, r io.Reader, l *rate.Limiter) io.Reader {
	if l == nil {
		return r
	}
	return &limited{ctx: ctx, r: r, l: l}
}

type limited struct {
	ctx context.Context
	r   io.Reader
	l   *rate.Limiter
}

func (l *limited) Read(p []byte) (int, error) {
	if b := l.l.Burst(); len(p) > b {
		p = p[:b]
	}
	n, err := l.r.Read(p)
	if n > 0 {
		if werr := l.l.WaitN(l.ctx, n); werr != nil {
			return n, werr
		}
	}
	return n, err
}

// ErrIdle is returned when a stream delivers nothing for too long.
var ErrIdle = errors.New("stream idle")

// IdleTimeout wraps a body whose reads must each make progress within d:
// a slow-drip server cannot hold a pull forever. cancel aborts the request
// underneath (close of the body) when the timer fires.
func IdleTimeout(rc io.ReadCloser, d time.Duration) io.ReadCloser {
	if d <= 0 {
		return rc
	}
	it := &idle{rc: rc, d: d}
	it.t = time.AfterFunc(d, func() { it.fired.Store(true); rc.Close() })
	return it
}

type idle struct {
	rc    io.ReadCloser
	d     time.Duration
	t     *time.Timer
	fired atomic.Bool
}

func (i *idle) Read(p []byte) (int, error) {
	n, err := i.rc.Read(p)
	if i.fired.Load() {
		return n, fmt.Errorf("%w: no data for %s", ErrIdle, i.d)
	}
	if n > 0 {
		i.t.Reset(i.d)
	}
	return n, err
}

func (i *idle) Close() error {
	i.t.Stop()
	return i.rc.Close()
}
