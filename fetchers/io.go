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

// ErrTooSlow is returned when a stream delivers less than its floor.
var ErrTooSlow = errors.New("stream too slow")

// MinRate wraps a body that must deliver at least floor bytes in every
// window of time spent waiting on it: a source that drips a byte now and
// then (never idle long enough for IdleTimeout) fails the attempt instead
// of holding a pull slot for ever. Only the time spent inside Read counts,
// so the caller's own waits (a bandwidth limit, a slow disk) never make a
// source look slow. A stall inside one Read is IdleTimeout's to end. floor
// <= 0 or window <= 0 returns rc unchanged. Not safe for concurrent Reads.
func MinRate(rc io.ReadCloser, floor int64, window time.Duration) io.ReadCloser {
	if floor <= 0 || window <= 0 {
		return rc
	}
	return &minRate{rc: rc, floor: floor, window: window, now: time.Now}
}

type minRate struct {
	rc     io.ReadCloser
	floor  int64
	window time.Duration
	now    func() time.Time
	spent  time.Duration // time inside Read in this window
	got    int64         // bytes in this window
}

func (m *minRate) Read(p []byte) (int, error) {
	start := m.now()
	n, err := m.rc.Read(p)
	m.spent += m.now().Sub(start)
	m.got += int64(n)
	if m.spent >= m.window {
		if m.got < m.floor && err == nil {
			rate := float64(m.got) / m.spent.Seconds()
			return n, fmt.Errorf("%w: %d bytes in %s (%s/s), below the floor of %d bytes per %s (%s/s)",
				ErrTooSlow, m.got, m.spent.Round(time.Millisecond), formatRate(rate), m.floor, m.window, formatRate(float64(m.floor)/m.window.Seconds()))
		}
		m.spent, m.got = 0, 0
	}
	return n, err
}

func (m *minRate) Close() error { return m.rc.Close() }

// formatRate writes bytes per second with a binary unit.
func formatRate(b float64) string {
	units := []string{"B", "KiB", "MiB", "GiB"}
	i := 0
	for b >= 1024 && i < len(units)-1 {
		b /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.1f B", b)
	}
	return fmt.Sprintf("%.1f %s", b, units[i])
}
