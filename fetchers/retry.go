package fetchers

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"time"
)

// RetryAfterError asks the caller to wait before the next attempt; a
// fetcher returns it for 429 and 503 with the server's Retry-After.
type RetryAfterError struct {
	After  time.Duration
	Status int
}

func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("server answered %d %s; retry after %s", e.Status, http.StatusText(e.Status), e.After)
}

// ParseRetryAfter reads a Retry-After header (seconds or an HTTP date);
// zero when absent or unreadable.
func ParseRetryAfter(h string, now time.Time) time.Duration {
	if h == "" {
		return 0
	}
	if s, err := strconv.Atoi(h); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(h); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// Backoff is a retry policy: exponential from Initial to Max with equal
// jitter (each wait is half its delay plus a random part of the other
// half), at most Attempts tries (0: until ctx ends). A server's
// Retry-After overrides the computed delay, capped at MaxRetryAfter.
type Backoff struct {
	Initial       time.Duration
	Max           time.Duration
	Attempts      int
	MaxRetryAfter time.Duration
	// Sleep waits for d or until ctx ends; nil means a real timer. Tests
	// replace it to observe delays without sleeping.
	Sleep func(ctx context.Context, d time.Duration) error
}

// DefaultBackoff is used by fetchers unless told otherwise.
var DefaultBackoff = Backoff{Initial: 500 * time.Millisecond, Max: 30 * time.Second, Attempts: 8, MaxRetryAfter: 5 * time.Minute}

// Delay is the wait before attempt n+1 (n counts from 1) after err.
func (b Backoff) Delay(n int, err error) time.Duration {
	var ra *RetryAfterError
	if errors.As(err, &ra) && ra.After > 0 {
		if b.MaxRetryAfter > 0 && ra.After > b.MaxRetryAfter {
			return b.MaxRetryAfter
		}
		return ra.After
	}
	d := b.Initial << min(n-1, 20)
	if d > b.Max || d <= 0 {
		d = b.Max
	}
	return d/2 + rand.N(d/2+1) // half fixed, half jitter: never a thundering herd
}

// UnknownHost reports whether err says DNS has no such host: asking again
// within seconds gets the same answer, so Do returns it at once and the
// pull fails fast, saying so (the daemon still retries the pull a few
// times before it calls the host a typo: a resolver at boot may deny a
// host for a moment).
func UnknownHost(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de) && de.IsNotFound
}

// SleepCtx waits d, or until ctx ends (its error then).
func SleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Do calls fn until it succeeds, returns a Permanent error, ctx ends or
// the attempts run out; it returns the last error. onRetry, if not nil,
// is told about each failed attempt and the wait before the next.
func (b Backoff) Do(ctx context.Context, fn func(attempt int) error, onRetry func(attempt int, err error, wait time.Duration)) error {
	sleep := b.Sleep
	if sleep == nil {
		sleep = SleepCtx
	}
	for n := 1; ; n++ {
		err := fn(n)
		if err == nil || IsPermanent(err) || ctx.Err() != nil || UnknownHost(err) {
			return err
		}
		if b.Attempts > 0 && n >= b.Attempts {
			// The error alone: the pull that called this counts its own
			// attempts, and one counter in a message is enough.
			return err
		}
		wait := b.Delay(n, err)
		if onRetry != nil {
			onRetry(n, err, wait)
		}
		if serr := sleep(ctx, wait); serr != nil {
			return err
		}
	}
}
