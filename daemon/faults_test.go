package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
)

// changingServer serves one file whose content (and ETag) the test
// replaces between two requests, as when a release is re-uploaded. It can
// cut the body of the next GET after a number of bytes, or refuse GETs.
type changingServer struct {
	*httptest.Server
	mu      sync.Mutex
	version int
	bodies  [][]byte
	cutNext int64 // >0: the next GET sends this many bytes and drops the connection
	refuse  bool  // GETs answer 404
	onCut   func()
	gets    []string // "Range|If-Range" of each GET
}

func newChangingServer(t *testing.T, bodies ...[]byte) *changingServer {
	cs := &changingServer{bodies: bodies}
	cs.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cs.mu.Lock()
		body, etag := cs.bodies[cs.version], fmt.Sprintf(`"v%d"`, cs.version)
		cut, refuse := int64(0), cs.refuse && r.Method == http.MethodGet
		if r.Method == http.MethodGet && !refuse {
			cs.gets = append(cs.gets, r.Header.Get("Range")+"|"+r.Header.Get("If-Range"))
			cut, cs.cutNext = cs.cutNext, 0
		}
		onCut := cs.onCut
		cs.mu.Unlock()
		if refuse {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("ETag", etag)
		if cut > 0 {
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			w.WriteHeader(http.StatusOK)
			w.Write(body[:cut])
			w.(http.Flusher).Flush()
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			if onCut != nil {
				onCut()
			}
			return
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
	}))
	t.Cleanup(cs.Close)
	return cs
}

func (cs *changingServer) setVersion(v int) {
	cs.mu.Lock()
	cs.version = v
	cs.mu.Unlock()
}

// whichVersion says which of the bodies got is, or describes the splice.
func whichVersion(got string, bodies ...[]byte) (int, string) {
	for i, b := range bodies {
		if got == string(b) {
			return i, ""
		}
	}
	if len(bodies) == 2 && len(got) == len(bodies[0]) {
		for i := range got {
			if got[i] != bodies[0][i] {
				return -1, fmt.Sprintf("bytes [0,%d) are version 0, byte %d on differs (version 1: %v)", i, i, got[i:] == string(bodies[1][i:]))
			}
		}
	}
	return -1, fmt.Sprintf("%d bytes, neither version", len(got))
}

// An https source without #sha256 replaced between the cut of a download
// and its resume: the committed file is all one version, never the old
// version's head spliced onto the new version's tail.
func TestHTTPResumeNeverMixesVersions(t *testing.T) {
	const size, cut = 3 << 20, 2<<20 + 777
	v0, v1 := data(size, 40), data(size, 41)

	t.Run("within one pull", func(t *testing.T) {
		srv := newChangingServer(t, v0, v1)
		srv.cutNext = cut
		srv.onCut = func() { srv.setVersion(1) }
		h := start(t, testConfig(t))
		a, err := h.pull(api.PullRequest{Name: "m", URI: srv.URL + "/w.bin"})
		if err != nil || a.Phase != api.PhaseReady {
			t.Fatalf("pull: %+v %v", a, err)
		}
		if v, why := whichVersion(h.read("m", "w.bin"), v0, v1); v < 0 {
			t.Fatalf("committed file mixes two versions: %s (GETs: %q)", why, srv.gets)
		}
		srv.mu.Lock()
		defer srv.mu.Unlock()
		if len(srv.gets) < 2 || !strings.HasPrefix(srv.gets[1], fmt.Sprintf("bytes=%d-|", cut)) || !strings.HasSuffix(srv.gets[1], `|"v0"`) {
			t.Fatalf("GETs %q: want the resume from byte %d asked with If-Range: \"v0\"", srv.gets, cut)
		}
	})

	t.Run("across pulls", func(t *testing.T) {
		// The first pull keeps its partial data of version 0 and fails; the
		// next pull resolves version 1 and must not continue that data.
		srv := newChangingServer(t, v0, v1)
		srv.cutNext = cut
		srv.onCut = func() { srv.mu.Lock(); srv.refuse = true; srv.mu.Unlock() }
		h := start(t, testConfig(t))
		if _, err := h.pull(api.PullRequest{Name: "m", URI: srv.URL + "/w.bin"}); !errors.Is(err, api.ErrFailed) {
			t.Fatalf("first pull: %v, want Failed", err)
		}
		srv.mu.Lock()
		srv.version, srv.refuse = 1, false
		srv.mu.Unlock()
		a, err := h.pull(api.PullRequest{Name: "m", URI: srv.URL + "/w.bin"})
		if err != nil || a.Phase != api.PhaseReady {
			t.Fatalf("second pull: %+v %v", a, err)
		}
		if v, why := whichVersion(h.read("m", "w.bin"), v0, v1); v != 1 {
			t.Fatalf("second pull committed version %d: %s (GETs: %q)", v, why, srv.gets)
		}
	})
}

// A source that does not exist fails the pull for good: no retry every
// few minutes for ever, until the desire changes or a pull asks again.
func TestPermanentFailureIsNotRetried(t *testing.T) {
	w := data(1000, 42)
	srv := newFileServer(t, map[string][]byte{})
	var requests atomic.Int64
	srv.hook = func(http.ResponseWriter, *http.Request) bool { requests.Add(1); return false }
	h := start(t, testConfig(t))                                              // retries after 50ms..200ms
	req := api.PullRequest{Name: "typo", URI: srv.URL + "/w.bin", Keep: true} // kept: a first failure without --keep leaves nothing
	if _, err := h.pull(req); !errors.Is(err, api.ErrFailed) {
		t.Fatalf("pull of a missing file: %v, want Failed", err)
	}
	after := requests.Load()
	a, err := h.c.Get(context.Background(), "typo")
	if err != nil {
		t.Fatal(err)
	}
	if a.Phase != api.PhaseFailed || a.NextRetry != nil || a.Reason != api.ReasonSourceNotFound || a.Attempts != 1 {
		t.Fatalf("artifact %+v: want Failed, reason %s, one attempt, no next retry", a, api.ReasonSourceNotFound)
	}
	// A pass of the reconciler, as its timer makes after any retry
	// period, starts no pull (one it started is awaited, then counted).
	h.passAndSettle(t)
	if n := requests.Load() - after; n != 0 {
		t.Fatalf("a 404 source was asked %d more times after the pull failed", n)
	}
	// Asked again, it tries again; once the file exists, it is Ready.
	srv.mu.Lock()
	srv.files["w.bin"] = w
	srv.mu.Unlock()
	if a, err := h.pull(req); err != nil || a.Phase != api.PhaseReady {
		t.Fatalf("pull asked again: %+v %v", a, err)
	}
}

// TestTypoedHostGivesUp: a host DNS denies is retried (a resolver down at
// boot says so too), then, after a few pulls in a row, it is a permanent
// SourceNotFound like a typo'd repo.
func TestTypoedHostGivesUp(t *testing.T) {
	dns := fmt.Errorf("resolve https://hf.c0/x: %w", &net.DNSError{Err: "no such host", Name: "hf.c0", IsNotFound: true})
	for attempt := 1; attempt < unknownHostAttempts; attempt++ {
		if r := failureReason(dns, attempt); r != "" {
			t.Fatalf("attempt %d of an unknown host: %s, want a retry", attempt, r)
		}
	}
	if r := failureReason(dns, unknownHostAttempts); r != api.ReasonSourceNotFound {
		t.Fatalf("attempt %d of an unknown host: %q, want %s", unknownHostAttempts, r, api.ReasonSourceNotFound)
	}
	flaky := &net.DNSError{Err: "server misbehaving", Name: "hf.co", IsTemporary: true}
	if r := failureReason(flaky, 10); r != "" {
		t.Fatalf("a resolver failure: %q, want a retry", r)
	}
}
