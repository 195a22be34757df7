package xettest

import (
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

type timeDuration = time.Duration

const defaultURLTTL = 10 * time.Minute

func timeUnix(s int64) time.Time { return time.Unix(s, 0) }

// take counts n down by one and says whether it was positive.
func take(n *atomic.Int64) bool {
	for {
		v := n.Load()
		if v <= 0 {
			return false
		}
		if n.CompareAndSwap(v, v-1) {
			return true
		}
	}
}

// parseRange reads "bytes=a-b" (api.md: end inclusive; "bytes=a-" to the end).
func parseRange(h string) (int64, int64, bool) {
	rs, ok := parseRanges(h)
	if !ok || len(rs) != 1 {
		return 0, 0, false
	}
	return rs[0][0], rs[0][1], true
}

// parseRanges reads "bytes=a-b,c-d"; an open end is the largest int64.
func parseRanges(h string) ([][2]int64, bool) {
	rest, ok := strings.CutPrefix(h, "bytes=")
	if !ok {
		return nil, false
	}
	var out [][2]int64
	for _, p := range strings.Split(rest, ",") {
		a, b, ok := strings.Cut(strings.TrimSpace(p), "-")
		if !ok {
			return nil, false
		}
		x, err := strconv.ParseInt(a, 10, 64)
		if err != nil {
			return nil, false
		}
		y := int64(1<<63 - 1)
		if b != "" {
			if y, err = strconv.ParseInt(b, 10, 64); err != nil {
				return nil, false
			}
		}
		if y < x {
			return nil, false
		}
		out = append(out, [2]int64{x, y})
	}
	return out, true
}

// within says whether every range asked lies inside one allowed range.
func within(asked, allowed [][2]int64) bool {
	for _, a := range asked {
		ok := false
		for _, b := range allowed {
			if b[0] <= a[0] && a[1] <= b[1] {
				ok = true
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

type countingWriter struct {
	w http.ResponseWriter
	c *CAS
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.c.Sent.Add(int64(n))
	return n, err
}
