package fetchers

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// clockedReader returns n bytes per Read and advances the clock by step.
type clockedReader struct {
	clock *time.Time
	step  time.Duration
	n     int
	left  int
}

func (c *clockedReader) Read(p []byte) (int, error) {
	*c.clock = c.clock.Add(c.step)
	if c.left == 0 {
		return 0, io.EOF
	}
	n := min(c.n, len(p), c.left)
	c.left -= n
	return n, nil
}

func (c *clockedReader) Close() error { return nil }

// TestMinRate: a drip fails once a window of reading delivered less than
// the floor, naming both rates; a stream above the floor, and time spent
// outside Read, never do.
func TestMinRate(t *testing.T) {
	now := time.Unix(0, 0)
	clock := func() time.Time { return now }
	drip := &minRate{rc: &clockedReader{clock: &now, step: 2 * time.Second, n: 1, left: 1 << 20}, floor: 1 << 20, window: time.Minute, now: clock}
	reads := 0
	var err error
	for err == nil && reads < 1000 {
		_, err = drip.Read(make([]byte, 4096))
		reads++
	}
	if !errors.Is(err, ErrTooSlow) || reads != 30 {
		t.Fatalf("drip: %v after %d reads, want ErrTooSlow after 30 (one minute)", err, reads)
	}
	for _, want := range []string{"30 bytes in 1m0s (0.5 B/s)", "below the floor of 1048576 bytes per 1m0s (17.1 KiB/s)"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message %q lacks %q", err, want)
		}
	}

	// 64 KiB a second, read in 8 KiB pieces, with long pauses between reads
	// (a bandwidth limit, a slow disk): above a 1 MiB/min floor.
	fast := &minRate{rc: &clockedReader{clock: &now, step: time.Second / 8, n: 8 << 10, left: 64 << 20}, floor: 1 << 20, window: time.Minute, now: clock}
	buf := make([]byte, 8<<10)
	for {
		_, err := fast.Read(buf)
		now = now.Add(10 * time.Second) // outside Read: not the source's fault
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("a stream above the floor failed: %v", err)
		}
	}
	if r := MinRate(io.NopCloser(strings.NewReader("x")), 0, time.Minute); r == nil {
		t.Fatal("MinRate with floor 0 returned nil")
	}
}
