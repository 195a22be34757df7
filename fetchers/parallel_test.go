package fetchers

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// origin serves data with Range support and counts its requests; its
// ranged reader counts the responses the reader holds open at once (the
// origin's own handlers may outlive a body the reader closed). perConn > 0
// limits each response to about that many bytes per second, as CDNs and
// S3 limit a connection.
type origin struct {
	*httptest.Server
	requests, inFlight, most atomic.Int64
}

type countedBody struct {
	io.ReadCloser
	o    *origin
	once sync.Once
}

func (c *countedBody) Close() error {
	c.once.Do(func() { c.o.inFlight.Add(-1) })
	return c.ReadCloser.Close()
}

func newOrigin(t *testing.T, data []byte, perConn int) *origin {
	o := &origin{}
	o.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o.requests.Add(1)
		var out http.ResponseWriter = w
		if perConn > 0 {
			out = &throttled{ResponseWriter: w, perConn: perConn}
		}
		http.ServeContent(out, r, "blob", time.Time{}, bytes.NewReader(data))
	}))
	t.Cleanup(o.Close)
	return o
}

// throttled writes 16 KiB at a time, each followed by the pause that
// holds the connection to perConn bytes per second.
type throttled struct {
	http.ResponseWriter
	perConn int
}

func (t *throttled) Write(p []byte) (int, error) {
	const piece = 16 << 10
	var done int
	for len(p) > 0 {
		n, err := t.ResponseWriter.Write(p[:min(piece, len(p))])
		done += n
		if err != nil {
			return done, err
		}
		p = p[n:]
		time.Sleep(time.Duration(float64(n) / float64(t.perConn) * float64(time.Second)))
	}
	return done, nil
}

func (o *origin) ranged(size int64) Ranged {
	return Ranged{
		Open: func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, o.URL, nil)
			switch {
			case n >= 0:
				req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, off+n-1))
			case off > 0:
				req.Header.Set("Range", fmt.Sprintf("bytes=%d-", off))
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return nil, err
			}
			if resp.StatusCode/100 != 2 {
				resp.Body.Close()
				return nil, fmt.Errorf("status %s", resp.Status)
			}
			k := o.inFlight.Add(1)
			for {
				m := o.most.Load()
				if k <= m || o.most.CompareAndSwap(m, k) {
					break
				}
			}
			return &countedBody{ReadCloser: resp.Body, o: o}, nil
		},
		Size: size, Chunk: 256 << 10, Conns: 4, Below: 32 << 20,
		Backoff: Backoff{Initial: time.Millisecond, Max: time.Millisecond, Attempts: 2},
	}
}

// readFrom reads the file through AdaptiveReader from off and checks
// the bytes.
func readFrom(t *testing.T, r Ranged, data []byte, off int64) {
	t.Helper()
	rc, err := AdaptiveReader(context.Background(), r, off)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data[off:]) {
		t.Fatalf("from %d: %d bytes, %v: not the file", off, len(got), err)
	}
}

func testData(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31 + i>>10)
	}
	return b
}

// TestAdaptiveStaysOnOneConnection: an origin faster than Below is read
// on the one stream, whole, from 0 and from an offset. Below is 1 MiB/s
// here: an unthrottled loopback origin in this process can fall under
// the 32 MiB/s of the other tests when both cores are busy (the reader
// counts the time its server waits for a CPU as time spent on the
// source), and never under this.
func TestAdaptiveStaysOnOneConnection(t *testing.T) {
	data := testData(3 << 20)
	o := newOrigin(t, data, 0)
	for _, off := range []int64{0, 300<<10 + 7} {
		before := o.requests.Load()
		r := o.ranged(int64(len(data)))
		r.Below = 1 << 20
		readFrom(t, r, data, off)
		if n := o.requests.Load() - before; n != 1 {
			t.Fatalf("from %d: %d requests to an origin that is not the limit; want the one stream", off, n)
		}
	}
}

// TestAdaptiveAddsConnectionsWhenOneIsTheLimit: an origin that limits
// each connection far below Below gets Range requests, never more than
// Conns at once, and the bytes come back in order.
func TestAdaptiveAddsConnectionsWhenOneIsTheLimit(t *testing.T) {
	data := testData(3 << 20)
	o := newOrigin(t, data, 4<<20)
	for _, off := range []int64{0, 300<<10 + 7} {
		before := o.requests.Load()
		o.most.Store(0)
		readFrom(t, o.ranged(int64(len(data))), data, off)
		if n := o.requests.Load() - before; n < 4 {
			t.Fatalf("from %d: %d requests to an origin that limits each connection; want Range requests", off, n)
		}
		if m := o.most.Load(); m < 2 || m > 4 {
			t.Fatalf("from %d: at most %d requests at once; want 2..4 (Conns)", off, m)
		}
	}
}

// TestAdaptiveOneConnMeansOneStream: Conns 1 never adds a connection,
// however slow the origin.
func TestAdaptiveOneConnMeansOneStream(t *testing.T) {
	data := testData(2 << 20)
	o := newOrigin(t, data, 8<<20)
	r := o.ranged(int64(len(data)))
	r.Conns = 1
	readFrom(t, r, data, 0)
	if n := o.requests.Load(); n != 1 {
		t.Fatalf("%d requests; want the file on one", n)
	}
}
