package hubtest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// readFromRecorder is a ResponseWriter with its own ReadFrom, as
// net/http's response has (sendfile(2) for a file).
type readFromRecorder struct {
	*httptest.ResponseRecorder
	readFroms int
}

func (r *readFromRecorder) ReadFrom(src io.Reader) (int64, error) {
	r.readFroms++
	return io.Copy(r.ResponseRecorder, src)
}

// A file served through a CountingWriter reaches the response's own
// ReadFrom (the bench's origin sends with sendfile, not through a user
// buffer), and every byte is counted whichever way it is written.
func TestCountingWriterKeepsReadFrom(t *testing.T) {
	body := strings.Repeat("weights!", 100000)
	p := filepath.Join(t.TempDir(), "shard")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n atomic.Int64
	rec := &readFromRecorder{ResponseRecorder: httptest.NewRecorder()}
	cw := &CountingWriter{ResponseWriter: rec, N: &n}
	req := httptest.NewRequest(http.MethodGet, "/shard", nil)
	req.Header.Set("Range", "bytes=8-")
	http.ServeContent(cw, req, "shard", time.Time{}, f)
	if rec.readFroms == 0 {
		t.Fatal("ServeContent wrote through Write: CountingWriter hides the response's ReadFrom")
	}
	if got := rec.Body.String(); got != body[8:] {
		t.Fatalf("served %d bytes, want %d from offset 8", len(got), len(body)-8)
	}
	if n.Load() != int64(len(body)-8) {
		t.Fatalf("counted %d bytes, want %d", n.Load(), len(body)-8)
	}
	if _, err := cw.Write([]byte("tail")); err != nil || n.Load() != int64(len(body)-4) {
		t.Fatalf("Write: err %v, counted %d, want %d", err, n.Load(), len(body)-4)
	}
}
