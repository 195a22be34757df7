package peer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/peer"
)

// origin serves data from any offset and records the offsets asked.
type origin struct {
	data    []byte
	mu      sync.Mutex
	offsets []int64
}

func (o *origin) open(_ context.Context, off int64) (io.ReadCloser, error) {
	o.mu.Lock()
	o.offsets = append(o.offsets, off)
	o.mu.Unlock()
	return io.NopCloser(bytes.NewReader(o.data[off:])), nil
}

func (o *origin) asked() []int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]int64(nil), o.offsets...)
}

// opener opens the partial ingest of b in s, as the daemon does.
func opener(s *cachestore.Store, b peer.Blob) peer.OpenPartial {
	return func(ctx context.Context) (peer.Partial, error) {
		return s.Writer(ctx, cachestore.WriterOpts{Ref: "blob:" + b.Digest, Size: b.Size})
	}
}

func newFetcher(t testing.TB, tok *peer.TokenFile, m *peer.Metrics, opts ...peer.FetcherOption) *peer.Fetcher {
	t.Helper()
	f, err := peer.NewFetcher(tok, append([]peer.FetcherOption{peer.WithFetcherMetrics(m)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// assertCommitted checks that s holds exactly data as b, and no partial
// ingest is left.
func assertCommitted(t *testing.T, s *cachestore.Store, b peer.Blob, data []byte, got string) {
	t.Helper()
	if got != b.Digest {
		t.Fatalf("committed %s, want %s", got, b.Digest)
	}
	f, err := s.OpenBlob(b.Digest)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	have, _ := io.ReadAll(f)
	if !bytes.Equal(have, data) {
		t.Fatalf("the committed blob differs from the data")
	}
	if ing, _ := s.ListIngests(); len(ing) != 0 {
		t.Errorf("partial ingests left: %v", ing)
	}
}

// hostile serves one blob's headers as a good peer would, with handle
// writing the body (or answering something else entirely).
func hostile(t *testing.T, handle http.HandlerFunc) string {
	hs := httptest.NewServer(handle)
	t.Cleanup(hs.Close)
	return hs.URL
}

// A peer that sends the right length with one byte flipped: the commit's
// digest check fails, nothing wrong is committed, the blob comes from the
// origin whole, and the peer is set aside.
func TestFlippedBytesPeerFallsBackToTheOrigin(t *testing.T) {
	data, b := blobOf(300<<10, 10)
	bad := bytes.Clone(data)
	bad[200<<10] ^= 0x01
	liar := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(bad)))
		w.Write(bad)
	})
	s := openStore(t)
	m := peer.NewMetrics()
	f := newFetcher(t, tokenFile(t, "secret"), m)
	o := &origin{data: data}
	got, res, err := f.Ingest(context.Background(), b, []string{liar}, opener(s, b), o.open)
	if err != nil {
		t.Fatal(err)
	}
	assertCommitted(t, s, b, data, got)
	if s.HasBlob(cachestore.DigestBytes(bad)) {
		t.Error("the flipped content was committed")
	}
	if fmt.Sprint(o.asked()) != "[0]" {
		t.Errorf("origin asked from %v, want [0] (the whole blob again)", o.asked())
	}
	if res.Bytes(liar) != b.Size || res.Bytes(peer.SourceOrigin) != b.Size {
		t.Errorf("result %+v: want the peer's %d bytes and the origin's", res, b.Size)
	}
	if avoided, why := f.Avoided(liar); !avoided || why != peer.AvoidDigest {
		t.Errorf("the liar is avoided: %v (%q), want true (digest)", avoided, why)
	}
	if v := testutil.ToFloat64(m.Avoided(peer.AvoidDigest)); v != 1 {
		t.Errorf("avoided{reason=digest} = %v", v)
	}
	// Set aside: the next blob does not ask it.
	_, res, err = f.Ingest(context.Background(), b, []string{liar}, opener(s, b), o.open)
	if err != nil || len(res.Peers()) != 0 {
		t.Errorf("second ingest: %v, peers %v; want the set-aside peer skipped", err, res.Peers())
	}
}

// Without an origin (the node may not use it yet), a peer's flipped
// bytes fail no fetch: the liar is set aside and the blob comes, from
// byte 0, from the next peer; with every peer a liar the error is
// ErrNoSource (wait for another), never the mismatch, which would be
// the origin's.
func TestFlippedBytesWithoutOriginGoOnAtTheNextPeer(t *testing.T) {
	data, b := blobOf(200<<10, 12)
	bad := bytes.Clone(data)
	bad[100<<10] ^= 0x01
	liar := func() string {
		return hostile(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", strconv.Itoa(len(bad)))
			w.Write(bad)
		})
	}
	src, dst := openStore(t), openStore(t)
	commit(t, src, data)
	tok := tokenFile(t, "secret")
	honest, _ := servePeer(t, src, tok)
	f := newFetcher(t, tok, nil)
	l1, l2 := liar(), liar()
	got, res, err := f.Ingest(context.Background(), b, []string{l1, l2, honest.URL}, opener(dst, b), nil)
	if err != nil {
		t.Fatalf("liars then an honest peer, no origin: %v", err)
	}
	assertCommitted(t, dst, b, data, got)
	if res.Bytes(honest.URL) != b.Size {
		t.Errorf("result %+v: want the honest peer's %d bytes", res, b.Size)
	}
	for _, l := range []string{l1, l2} {
		if avoided, why := f.Avoided(l); !avoided || why != peer.AvoidDigest {
			t.Errorf("liar %s avoided %v (%q), want digest", l, avoided, why)
		}
	}
	other, ob := blobOf(50<<10, 13)
	obad := bytes.Clone(other)
	obad[0] ^= 0xff
	l3 := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(obad)))
		w.Write(obad)
	})
	_, _, err = f.Ingest(context.Background(), ob, []string{l3}, opener(dst, ob), nil)
	if !errors.Is(err, peer.ErrNoSource) || errors.Is(err, cachestore.ErrDigestMismatch) {
		t.Fatalf("only a liar, no origin: %v, want ErrNoSource and not a digest mismatch", err)
	}
}

// A blob's Wait goes to the first peer asked (HeaderWait, in seconds),
// not to the next.
func TestWaitGoesToTheFirstPeer(t *testing.T) {
	_, b := blobOf(1000, 14)
	b.Wait = 30 * time.Second
	var mu sync.Mutex
	var waits []string
	lacking := func() string {
		return hostile(t, func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			waits = append(waits, r.Header.Get(peer.HeaderWait))
			mu.Unlock()
			http.NotFound(w, r)
		})
	}
	f := newFetcher(t, tokenFile(t, "secret"), nil)
	_, _, err := f.Ingest(context.Background(), b, []string{lacking(), lacking()}, opener(openStore(t), b), nil)
	if !errors.Is(err, peer.ErrNoSource) {
		t.Fatalf("no peer holds it, no origin: %v, want ErrNoSource", err)
	}
	if fmt.Sprint(waits) != "[30 ]" {
		t.Fatalf("wait headers %q, want 30 to the first peer and none to the second", waits)
	}
}

// The origin's own bad bytes are the origin's error: no peer is blamed
// and the pull fails as it would without peers.
func TestOriginMismatchIsTheOriginsError(t *testing.T) {
	data, b := blobOf(10000, 11)
	bad := bytes.Clone(data)
	bad[0] ^= 0xff
	s := openStore(t)
	f := newFetcher(t, tokenFile(t, "secret"), nil)
	o := &origin{data: bad}
	_, _, err := f.Ingest(context.Background(), b, nil, opener(s, b), o.open)
	if !errors.Is(err, cachestore.ErrDigestMismatch) || len(o.asked()) != 1 {
		t.Fatalf("err %v after %d origin requests: want one request and ErrDigestMismatch", err, len(o.asked()))
	}
}

// A peer that drips bytes under the progress floor is left for the next
// peer, which continues from the offset reached.
func TestSlowPeerIsLeftForTheNext(t *testing.T) {
	data, b := blobOf(1<<20, 12)
	slow := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		w.WriteHeader(200)
		for i := 0; i < len(data); i++ {
			if _, err := w.Write(data[i : i+1]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	})
	holder := openStore(t)
	commit(t, holder, data)
	tok := tokenFile(t, "secret")
	good, _ := servePeer(t, holder, tok)
	s := openStore(t)
	m := peer.NewMetrics()
	f := newFetcher(t, tok, m, peer.WithProgressFloor(64<<10, 100*time.Millisecond))
	o := &origin{data: data}
	got, res, err := f.Ingest(context.Background(), b, []string{slow, good.URL}, opener(s, b), o.open)
	if err != nil {
		t.Fatal(err)
	}
	assertCommitted(t, s, b, data, got)
	if avoided, why := f.Avoided(slow); !avoided || why != peer.AvoidStall {
		t.Errorf("the slow peer is avoided: %v (%q), want true (stall)", avoided, why)
	}
	if len(o.asked()) != 0 || res.Bytes(good.URL)+res.Bytes(slow) != b.Size {
		t.Errorf("origin asked %v, result %+v: want the blob from the peers alone", o.asked(), res)
	}
	if v := testutil.ToFloat64(m.Fetched("peer")); v != float64(b.Size) {
		t.Errorf("fetched{source=peer} = %v, want %d", v, b.Size)
	}
}

// A peer that answers 200 to everything: a wrong length is refused
// before a byte is taken, the right length with wrong content fails the
// digest, a 200 to a Range request is refused; the origin serves.
func TestPeerThatAnswers200ToEverything(t *testing.T) {
	data, b := blobOf(64<<10, 13)
	for _, tc := range []struct {
		name   string
		body   []byte
		offset int // bytes already held (a resumed ingest), 4 KiB aligned
		why    string
	}{
		{"short body", []byte("OK"), 0, peer.AvoidWrongLength},
		{"long body", append(bytes.Clone(data), 'x'), 0, peer.AvoidWrongLength},
		{"right length, wrong bytes", make([]byte, len(data)), 0, peer.AvoidDigest},
		{"200 to a Range", data, 8192, peer.AvoidWrongLength},
	} {
		t.Run(tc.name, func(t *testing.T) {
			yes := hostile(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Length", strconv.Itoa(len(tc.body)))
				w.Write(tc.body)
			})
			s := openStore(t)
			if tc.offset > 0 {
				w, _ := s.Writer(context.Background(), cachestore.WriterOpts{Ref: "blob:" + b.Digest, Size: b.Size})
				w.Write(data[:tc.offset])
				w.Close()
			}
			f := newFetcher(t, tokenFile(t, "secret"), nil)
			o := &origin{data: data}
			got, _, err := f.Ingest(context.Background(), b, []string{yes}, opener(s, b), o.open)
			if err != nil {
				t.Fatal(err)
			}
			assertCommitted(t, s, b, data, got)
			if avoided, why := f.Avoided(yes); !avoided || why != tc.why {
				t.Errorf("avoided %v (%q), want true (%s)", avoided, why, tc.why)
			}
		})
	}
}

// A body longer than the blob, sent without a Content-Length, is cut off
// at the blob's size and refused.
func TestChunkedOverlongBodyIsRefused(t *testing.T) {
	data, b := blobOf(10000, 14)
	long := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200) // no Content-Length: chunked
		w.Write(data)
		w.(http.Flusher).Flush()
		w.Write([]byte("and more"))
	})
	var pe bytes.Buffer
	f := newFetcher(t, tokenFile(t, "secret"), nil)
	_, err := f.Fetch(context.Background(), b, []string{long}, &bufPartial{Buffer: &pe}, nil)
	if !errors.Is(err, peer.ErrNoSource) {
		t.Fatalf("err %v, want ErrNoSource", err)
	}
	if avoided, why := f.Avoided(long); !avoided || why != peer.AvoidWrongLength {
		t.Errorf("avoided %v (%q)", avoided, why)
	}
}

// bufPartial is a Partial in memory (Fetch alone: no commit).
type bufPartial struct{ *bytes.Buffer }

func (p *bufPartial) Offset() int64                                         { return int64(p.Len()) }
func (p *bufPartial) Commit(context.Context, int64, string) (string, error) { return "", nil }
func (p *bufPartial) Close() error                                          { return nil }
func (p *bufPartial) Abort()                                                {}

// A redirecting peer is not followed (its target never asked) and is set
// aside.
func TestRedirectingPeerIsRefused(t *testing.T) {
	data, b := blobOf(10000, 15)
	var targetHits int
	var mu sync.Mutex
	target := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		targetHits++
		mu.Unlock()
		w.Write(data)
	})
	redir := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target+r.URL.Path, http.StatusTemporaryRedirect)
	})
	s := openStore(t)
	f := newFetcher(t, tokenFile(t, "secret"), nil)
	o := &origin{data: data}
	got, _, err := f.Ingest(context.Background(), b, []string{redir}, opener(s, b), o.open)
	if err != nil {
		t.Fatal(err)
	}
	assertCommitted(t, s, b, data, got)
	if avoided, why := f.Avoided(redir); !avoided || why != peer.AvoidRedirect {
		t.Errorf("avoided %v (%q), want true (redirect)", avoided, why)
	}
	mu.Lock()
	defer mu.Unlock()
	if targetHits != 0 {
		t.Errorf("the redirect's target was asked %d times", targetHits)
	}
}

// A peer that refuses our token is set aside; a peer that lacks the blob
// (404) is not; the origin serves.
func TestRefusingPeers(t *testing.T) {
	data, b := blobOf(10000, 16)
	holder := openStore(t)
	commit(t, holder, data)
	other, _ := servePeer(t, holder, tokenFile(t, "another cluster's token"))
	empty, _ := servePeer(t, openStore(t), tokenFile(t, "secret"))
	s := openStore(t)
	f := newFetcher(t, tokenFile(t, "secret"), nil)
	o := &origin{data: data}
	got, _, err := f.Ingest(context.Background(), b, []string{other.URL, empty.URL, "ftp://10.0.0.1/"}, opener(s, b), o.open)
	if err != nil {
		t.Fatal(err)
	}
	assertCommitted(t, s, b, data, got)
	for _, tc := range []struct {
		peer, why string
	}{{other.URL, peer.AvoidUnauthorized}, {empty.URL, ""}, {"ftp://10.0.0.1/", peer.AvoidBadURL}} {
		if avoided, why := f.Avoided(tc.peer); avoided != (tc.why != "") || why != tc.why {
			t.Errorf("%s: avoided %v (%q), want %q", tc.peer, avoided, why, tc.why)
		}
	}
}

// A transfer cut short by one peer goes on from the offset reached at
// the next; one cut with no source left keeps its partial ingest, and the
// next attempt resumes it (at the store's 4 KiB boundary) at the origin.
func TestResumeFromTheVerifiedOffsetAcrossSources(t *testing.T) {
	data, b := blobOf(256<<10, 17)
	const cut = 100000
	cutter := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(data)))
		w.Write(data[:cut]) // and hang up
	})
	holder := openStore(t)
	commit(t, holder, data)
	tok := tokenFile(t, "secret")
	_, srv := servePeer(t, holder, tok)
	var ranges []string
	var mu sync.Mutex
	good := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		ranges = append(ranges, r.Header.Get("Range"))
		mu.Unlock()
		srv.ServeHTTP(w, r)
	})
	s := openStore(t)
	f := newFetcher(t, tok, nil)
	got, res, err := f.Ingest(context.Background(), b, []string{cutter, good}, opener(s, b), nil)
	if err != nil {
		t.Fatal(err)
	}
	assertCommitted(t, s, b, data, got)
	if fmt.Sprint(ranges) != fmt.Sprintf("[bytes=%d-]", cut) || res.Bytes(cutter) != cut || res.Bytes(good) != b.Size-cut {
		t.Errorf("ranges asked of the second peer %q, result %+v; want bytes=%d- and the rest", ranges, res, cut)
	}
	if avoided, why := f.Avoided(cutter); !avoided || why != peer.AvoidShort {
		t.Errorf("the cutting peer: avoided %v (%q), want short", avoided, why)
	}

	// No second source: the partial stays; the origin resumes it later.
	s2 := openStore(t)
	f2 := newFetcher(t, tok, nil)
	if _, _, err := f2.Ingest(context.Background(), b, []string{cutter}, opener(s2, b), nil); !errors.Is(err, peer.ErrNoSource) {
		t.Fatalf("err %v, want ErrNoSource", err)
	}
	o := &origin{data: data}
	got, res, err = f2.Ingest(context.Background(), b, []string{cutter}, opener(s2, b), o.open)
	if err != nil {
		t.Fatal(err)
	}
	assertCommitted(t, s2, b, data, got)
	want := int64(cut &^ 4095)
	if fmt.Sprint(o.asked()) != fmt.Sprint([]int64{want}) || res.Resumed != want {
		t.Errorf("origin asked from %v, resumed %d; want %d", o.asked(), res.Resumed, want)
	}
}

// A failure of the partial ingest itself (more bytes than it takes) is
// the caller's error, and sets no peer aside.
func TestSinkFailureBlamesNoPeer(t *testing.T) {
	data, b := blobOf(10000, 18)
	holder := openStore(t)
	commit(t, holder, data)
	tok := tokenFile(t, "secret")
	good, _ := servePeer(t, holder, tok)
	f := newFetcher(t, tok, nil)
	_, err := f.Fetch(context.Background(), b, []string{good.URL}, failingPartial{&bufPartial{Buffer: &bytes.Buffer{}}}, nil)
	if !errors.Is(err, errDiskFull) {
		t.Fatalf("err %v, want the sink's", err)
	}
	if avoided, _ := f.Avoided(good.URL); avoided {
		t.Error("a good peer was set aside for the sink's failure")
	}
}

var errDiskFull = errors.New("no space left on device")

type failingPartial struct{ *bufPartial }

func (failingPartial) Offset() int64 { return 0 }
func (failingPartial) ReadFrom(r io.Reader) (int64, error) {
	r.Read(make([]byte, 10))
	return 10, errDiskFull
}

func TestNewFetcherValidates(t *testing.T) {
	tok := tokenFile(t, "x")
	for _, opts := range [][]peer.FetcherOption{
		{peer.WithProgressFloor(-1, time.Second)},
		{peer.WithProgressFloor(1, 0)},
		{peer.AvoidFor(0, time.Second)},
		{peer.AvoidFor(time.Minute, time.Second)},
	} {
		if _, err := peer.NewFetcher(tok, opts...); err == nil {
			t.Error("a bad setting was accepted")
		}
	}
	if _, err := peer.NewFetcher(nil); err == nil {
		t.Error("a fetcher without a token source was accepted")
	}
	f := newFetcher(t, tok, nil)
	for _, b := range []peer.Blob{{Digest: "sha256:abc", Size: 1}, {Digest: cachestore.DigestBytes(nil), Size: -1}} {
		if _, err := f.Fetch(context.Background(), b, nil, &bufPartial{Buffer: &bytes.Buffer{}}, nil); err == nil {
			t.Errorf("blob %+v accepted", b)
		}
	}
}

// A peer set aside comes back after its time; each failure in a row
// doubles it; a Retry-After lengthens it.
func TestAvoidanceBacksOff(t *testing.T) {
	now := time.Unix(1e9, 0)
	busy := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "120")
		w.WriteHeader(503)
	})
	broken := hostile(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) })
	data, b := blobOf(100, 19)
	f := newFetcher(t, tokenFile(t, "secret"), nil, peer.AvoidFor(10*time.Second, 35*time.Second), peer.WithClock(func() time.Time { return now }))
	o := &origin{data: data}
	fetch := func() {
		if _, err := f.Fetch(context.Background(), b, []string{busy, broken}, &bufPartial{Buffer: &bytes.Buffer{}}, o.open); err != nil {
			t.Fatal(err)
		}
	}
	fetch()
	for _, step := range []struct {
		after         time.Duration
		busy, broken  bool
		fetchAfterall bool
	}{
		{9 * time.Second, true, true, false},
		{1 * time.Second, true, false, true}, // broken back after 10s; fails again: 20s
		{19 * time.Second, true, true, false},
		{1 * time.Second, true, false, true}, // then 35s (the cap)
		{34 * time.Second, true, true, false},
		{56 * time.Second, false, false, false}, // busy's Retry-After of 120s is over
	} {
		now = now.Add(step.after)
		a, _ := f.Avoided(busy)
		c, _ := f.Avoided(broken)
		if a != step.busy || c != step.broken {
			t.Fatalf("at +%s: busy avoided %v, broken %v; want %v, %v", step.after, a, c, step.busy, step.broken)
		}
		if step.fetchAfterall {
			fetch()
		}
	}
}

// A busy peer (its upload slots full) is set aside for its Retry-After
// only, however often it answers 503: it is asked again as soon as it
// said, not after a backoff of minutes, since it may be the one peer that
// holds a fresh blob.
func TestBusyPeerIsAskedAgainAfterItsRetryAfter(t *testing.T) {
	now := time.Unix(1e9, 0)
	busy := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "2")
		w.WriteHeader(503)
	})
	data, b := blobOf(100, 21)
	f := newFetcher(t, tokenFile(t, "secret"), nil, peer.AvoidFor(30*time.Second, 10*time.Minute), peer.WithClock(func() time.Time { return now }))
	o := &origin{data: data}
	for i := range 5 {
		if _, err := f.Fetch(context.Background(), b, []string{busy}, &bufPartial{Buffer: &bytes.Buffer{}}, o.open); err != nil {
			t.Fatal(err)
		}
		if a, why := f.Avoided(busy); !a || why != peer.AvoidBusy {
			t.Fatalf("after 503 #%d: avoided %v (%s); want set aside as busy", i+1, a, why)
		}
		now = now.Add(2 * time.Second)
		if a, _ := f.Avoided(busy); a {
			t.Fatalf("after 503 #%d: still set aside 2s later, past its Retry-After", i+1)
		}
	}
}

// An origin that cannot continue the partial blob (its file changed)
// gets it from byte 0: the partial is dropped, not resumed for ever.
func TestOriginThatCannotResumeStartsOver(t *testing.T) {
	data, b := blobOf(64<<10, 20)
	s := openStore(t)
	w, _ := s.Writer(context.Background(), cachestore.WriterOpts{Ref: "blob:" + b.Digest, Size: b.Size})
	w.Write(data[:8192])
	w.Close()
	o := &origin{data: data}
	open := func(ctx context.Context, off int64) (io.ReadCloser, error) {
		if off > 0 {
			o.open(ctx, off)
			return nil, fmt.Errorf("validator changed: %w", fetchers.ErrCannotResume)
		}
		return o.open(ctx, off)
	}
	f := newFetcher(t, tokenFile(t, "secret"), nil)
	got, _, err := f.Ingest(context.Background(), b, nil, opener(s, b), open)
	if err != nil {
		t.Fatal(err)
	}
	assertCommitted(t, s, b, data, got)
	if fmt.Sprint(o.asked()) != "[8192 0]" {
		t.Errorf("origin asked from %v, want [8192 0]", o.asked())
	}
}

// Without a readable token the peers are not asked (nor blamed): the
// origin serves.
func TestNoTokenGoesToTheOrigin(t *testing.T) {
	data, b := blobOf(10000, 21)
	holder := openStore(t)
	commit(t, holder, data)
	good, _ := servePeer(t, holder, tokenFile(t, "secret"))
	s := openStore(t)
	f := newFetcher(t, peer.NewTokenFile(t.TempDir()+"/missing"), nil)
	o := &origin{data: data}
	got, res, err := f.Ingest(context.Background(), b, []string{good.URL}, opener(s, b), o.open)
	if err != nil {
		t.Fatal(err)
	}
	assertCommitted(t, s, b, data, got)
	if res.Bytes(peer.SourceOrigin) != b.Size {
		t.Errorf("result %+v: want all from the origin", res)
	}
	if avoided, _ := f.Avoided(good.URL); avoided {
		t.Error("a peer was set aside for our own missing token")
	}
}

// A peer whose upload rate bound is under the fetcher's progress floor
// is a slow peer: set aside, the origin serves the rest.
func TestRateBoundedPeerUnderTheFloorIsLeft(t *testing.T) {
	data, b := blobOf(1<<20, 22)
	holder := openStore(t)
	commit(t, holder, data)
	tok := tokenFile(t, "secret")
	slow, _ := servePeer(t, holder, tok, peer.WithUploadRate(32<<10))
	s := openStore(t)
	f := newFetcher(t, tok, nil, peer.WithProgressFloor(256<<10, 100*time.Millisecond))
	o := &origin{data: data}
	got, res, err := f.Ingest(context.Background(), b, []string{slow.URL}, opener(s, b), o.open)
	if err != nil {
		t.Fatal(err)
	}
	assertCommitted(t, s, b, data, got)
	if avoided, why := f.Avoided(slow.URL); !avoided || why != peer.AvoidStall {
		t.Errorf("avoided %v (%q), want stall", avoided, why)
	}
	if len(o.asked()) != 1 || o.asked()[0] != res.Bytes(slow.URL) {
		t.Errorf("origin asked from %v after the peer's %d bytes", o.asked(), res.Bytes(slow.URL))
	}
}

// A peer's Retry-After longer than WithMaxRetryAfter (the daemon's
// --peer-wait) is capped: a peer that says "come back tomorrow" is asked
// again after the node's own wait, not a day later.
func TestRetryAfterIsCapped(t *testing.T) {
	now := time.Unix(1e9, 0)
	busy := hostile(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "86400")
		w.WriteHeader(503)
	})
	data, b := blobOf(100, 22)
	f := newFetcher(t, tokenFile(t, "secret"), nil, peer.WithMaxRetryAfter(5*time.Minute), peer.WithClock(func() time.Time { return now }))
	if _, err := f.Fetch(context.Background(), b, []string{busy}, &bufPartial{Buffer: &bytes.Buffer{}}, (&origin{data: data}).open); err != nil {
		t.Fatal(err)
	}
	if a, why := f.Avoided(busy); !a || why != peer.AvoidBusy {
		t.Fatalf("after a 503: avoided %v (%s); want set aside as busy", a, why)
	}
	now = now.Add(5*time.Minute - time.Second)
	if a, _ := f.Avoided(busy); !a {
		t.Fatal("back before the cap of 5m")
	}
	now = now.Add(time.Second)
	if a, _ := f.Avoided(busy); a {
		t.Fatal("still set aside after 5m for a Retry-After of a day; want it capped at WithMaxRetryAfter")
	}
	if _, err := peer.NewFetcher(tokenFile(t, "x"), peer.WithMaxRetryAfter(0)); err == nil {
		t.Error("a longest Retry-After of 0 was accepted")
	}
}
