package peer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/peer"
)

// streamBuffer is the stores' write buffer in these tests: a growing
// blob is readable by whole buffers, so a small one shows the bytes
// flowing with a blob of a few hundred KiB.
const streamBuffer = 64 << 10

// patience bounds every wait of these tests: generous, for a loaded
// machine; no test asserts a time.
const patience = time.Minute

// openStreamStore opens a store with streamBuffer-sized writes.
func openStreamStore(t testing.TB) *cachestore.Store {
	t.Helper()
	s, _, err := cachestore.Open(context.Background(), t.TempDir(), cachestore.WithWriteBuffer(streamBuffer))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// gatedOrigin serves data (flipped at byte flip, when flip >= 0) from any
// offset, the bytes before first at once and the rest once gate is
// closed: a throttled origin whose pace the test sets by events.
type gatedOrigin struct {
	data  []byte
	first int64
	flip  int64
	gate  chan struct{}
	sent  atomic.Int64
}

func newGatedOrigin(data []byte, first int64) *gatedOrigin {
	return &gatedOrigin{data: data, first: first, flip: -1, gate: make(chan struct{})}
}

func (o *gatedOrigin) open(ctx context.Context, off int64) (io.ReadCloser, error) {
	return io.NopCloser(&gatedReader{ctx: ctx, o: o, pos: off}), nil
}

type gatedReader struct {
	ctx context.Context
	o   *gatedOrigin
	pos int64
}

func (r *gatedReader) Read(p []byte) (int, error) {
	if r.pos >= int64(len(r.o.data)) {
		return 0, io.EOF
	}
	if r.pos >= r.o.first {
		select {
		case <-r.o.gate:
		case <-r.ctx.Done():
			return 0, r.ctx.Err()
		}
	}
	end := int64(len(r.o.data))
	if r.pos < r.o.first {
		end = r.o.first
	}
	n := copy(p, r.o.data[r.pos:end])
	if f := r.o.flip; f >= r.pos && f < r.pos+int64(n) {
		p[f-r.pos] ^= 0xff
	}
	r.pos += int64(n)
	r.o.sent.Add(int64(n))
	return n, nil
}

// tap is a partial ingest that serves its bytes as they land (the
// daemon's: WriterOpts.Digest) and tells the test when its first byte
// came and how each commit went.
type tap struct {
	s       *cachestore.Store
	b       peer.Blob
	first   chan struct{} // closed at the first byte received
	once    sync.Once
	mu      sync.Mutex
	commits []error
}

func newTap(s *cachestore.Store, b peer.Blob) *tap {
	return &tap{s: s, b: b, first: make(chan struct{})}
}

func (tp *tap) open(ctx context.Context) (peer.Partial, error) {
	w, err := tp.s.Writer(ctx, cachestore.WriterOpts{Ref: "blob:" + tp.b.Digest, Size: tp.b.Size, Digest: tp.b.Digest})
	if err != nil {
		return nil, err
	}
	return &tapPartial{Writer: w, tp: tp}, nil
}

func (tp *tap) commitErrs() []error {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return append([]error(nil), tp.commits...)
}

type tapPartial struct {
	*cachestore.Writer
	tp *tap
}

func (p *tapPartial) ReadFrom(r io.Reader) (int64, error) {
	return p.Writer.ReadFrom(firstByte{r, p.tp})
}

func (p *tapPartial) Commit(ctx context.Context, size int64, expected string) (string, error) {
	d, err := p.Writer.Commit(ctx, size, expected)
	p.tp.mu.Lock()
	p.tp.commits = append(p.tp.commits, err)
	p.tp.mu.Unlock()
	return d, err
}

type firstByte struct {
	r  io.Reader
	tp *tap
}

func (f firstByte) Read(b []byte) (int, error) {
	n, err := f.r.Read(b)
	if n > 0 {
		f.tp.once.Do(func() { close(f.tp.first) })
	}
	return n, err
}

// ingestion is one node's Fetcher.Ingest run in the background.
type ingestion struct {
	done   chan struct{}
	digest string
	res    peer.Result
	err    error
}

func ingestAsync(ctx context.Context, f *peer.Fetcher, b peer.Blob, peers []string, open peer.OpenPartial, origin peer.Origin) *ingestion {
	in := &ingestion{done: make(chan struct{})}
	go func() {
		defer close(in.done)
		in.digest, in.res, in.err = f.Ingest(ctx, b, peers, open, origin)
	}()
	return in
}

// wait waits for in to end.
func (in *ingestion) wait(t *testing.T, who string) {
	t.Helper()
	select {
	case <-in.done:
	case <-time.After(patience):
		t.Fatalf("%s: not done within %s", who, patience)
	}
}

// streamFetcher is a Fetcher that holds a peer to no progress floor (a
// peer streaming a blob it is fetching goes at its source's pace, which
// these tests set by events).
func streamFetcher(t testing.TB, tok *peer.TokenFile, m *peer.Metrics) *peer.Fetcher {
	return newFetcher(t, tok, m, peer.WithProgressFloor(0, time.Second))
}

// waitGrowing waits, on the store's word (WatchBlob), until s is
// writing blob d and has written at least n bytes of it.
func waitGrowing(t testing.TB, s *cachestore.Store, d string, n int64) {
	t.Helper()
	deadline := time.After(patience)
	for {
		changed, stop := s.WatchBlob(d)
		g, err := s.OpenGrowing(d)
		if err == nil {
			have := g.Written()
			g.Close()
			if have >= n {
				stop()
				return
			}
		}
		select {
		case <-changed:
			stop()
		case <-deadline:
			stop()
			t.Fatalf("the store is not writing %d bytes of %s within %s", n, d, patience)
		}
	}
}

// waitFirst waits for tp's first byte, failing if any of ends comes
// first.
func waitFirst(t *testing.T, who string, tp *tap, ends ...*ingestion) {
	t.Helper()
	ended := make(chan *ingestion, len(ends))
	for _, in := range ends {
		go func() {
			<-in.done
			ended <- in
		}()
	}
	select {
	case <-tp.first:
	case in := <-ended:
		select {
		case <-tp.first: // both: the byte came first, or at once
		default:
			t.Fatalf("a fetch ended (%v) before %s received a byte", in.err, who)
		}
	case <-time.After(patience):
		t.Fatalf("%s received no byte within %s", who, patience)
	}
}

// A receiver streams a blob from a peer that is still fetching it: its
// first bytes come while the sender's origin is paused, before the
// sender commits; both then commit the right blob, and the receiver's
// bytes all came from the sender.
func TestStreamBeforeSenderCommits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*patience)
	defer cancel()
	data, b := blobOf(1<<20, 70)
	tok := tokenFile(t, "secret")
	a, recv := openStreamStore(t), openStreamStore(t)
	hsA, _ := servePeer(t, a, tok)
	origin := newGatedOrigin(data, 256<<10)

	tapA, tapB := newTap(a, b), newTap(recv, b)
	inA := ingestAsync(ctx, streamFetcher(t, tok, nil), b, nil, tapA.open, origin.open)
	waitGrowing(t, a, b.Digest, streamBuffer)
	inB := ingestAsync(ctx, streamFetcher(t, tok, nil), b, []string{hsA.URL}, tapB.open, nil)

	waitFirst(t, "the receiver", tapB, inA, inB)
	// The order of events: the receiver has bytes, the sender's origin is
	// still paused, so the sender cannot have committed.
	if a.HasBlob(b.Digest) || len(tapA.commitErrs()) != 0 {
		t.Fatal("the sender committed before the receiver's first byte")
	}
	close(origin.gate)
	inA.wait(t, "the sender")
	inB.wait(t, "the receiver")
	if inA.err != nil || inB.err != nil {
		t.Fatalf("sender: %v; receiver: %v", inA.err, inB.err)
	}
	assertCommitted(t, a, b, data, inA.digest)
	assertCommitted(t, recv, b, data, inB.digest)
	if got := inB.res.Bytes(hsA.URL); got != b.Size {
		t.Errorf("the receiver got %d bytes from the sender, want all %d (spans %+v)", got, b.Size, inB.res.Spans)
	}
	if got := origin.sent.Load(); got != b.Size {
		t.Errorf("the origin sent %d bytes, want the blob once (%d)", got, b.Size)
	}
}

// origin → A → B → C, each a peer of the next only, B and C with no
// origin of their own: C's first bytes come while A's origin is paused
// (they went through two nodes that are still fetching), and C commits
// the right blob, all of it from B; the origin sent it once.
func TestStreamChainOfThree(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*patience)
	defer cancel()
	data, b := blobOf(1<<20, 71)
	tok := tokenFile(t, "secret")
	a, nb, nc := openStreamStore(t), openStreamStore(t), openStreamStore(t)
	hsA, _ := servePeer(t, a, tok)
	hsB, _ := servePeer(t, nb, tok)
	origin := newGatedOrigin(data, 256<<10)

	tapA, tapB, tapC := newTap(a, b), newTap(nb, b), newTap(nc, b)
	inA := ingestAsync(ctx, streamFetcher(t, tok, nil), b, nil, tapA.open, origin.open)
	waitGrowing(t, a, b.Digest, streamBuffer)
	inB := ingestAsync(ctx, streamFetcher(t, tok, nil), b, []string{hsA.URL}, tapB.open, nil)
	waitGrowing(t, nb, b.Digest, streamBuffer)
	inC := ingestAsync(ctx, streamFetcher(t, tok, nil), b, []string{hsB.URL}, tapC.open, nil)

	waitFirst(t, "C", tapC, inA, inB, inC)
	if a.HasBlob(b.Digest) || nb.HasBlob(b.Digest) {
		t.Fatal("A or B committed before C's first byte")
	}
	close(origin.gate)
	for _, in := range []*ingestion{inA, inB, inC} {
		in.wait(t, "a tier")
		if in.err != nil {
			t.Fatal(in.err)
		}
	}
	assertCommitted(t, nc, b, data, inC.digest)
	if got := inC.res.Bytes(hsB.URL); got != b.Size {
		t.Errorf("C got %d bytes from B, want all %d (spans %+v)", got, b.Size, inC.res.Spans)
	}
	if got := origin.sent.Load(); got != b.Size {
		t.Errorf("the origin sent %d bytes, want the blob once (%d)", got, b.Size)
	}
}

// A sender whose partial bytes are wrong (its origin flipped one): the
// receiver streams them, but the sender sends the last byte only once its
// own commit checked the blob, and that commit fails: the stream is cut
// short, the receiver drops the bytes no one checked and fetches the blob
// again from its own origin. No wrong byte reaches a commit of the
// receiver's, and the sender, whose source lied, is set aside only for a
// moment (stream_ended), not as a liar.
func TestStreamCorruptSenderCostsARefetch(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*patience)
	defer cancel()
	data, b := blobOf(1<<20, 72)
	tok := tokenFile(t, "secret")
	a, recv := openStreamStore(t), openStreamStore(t)
	hsA, _ := servePeer(t, a, tok)
	bad := newGatedOrigin(data, 512<<10)
	bad.flip = 100 << 10
	good := &origin{data: data}

	tapA, tapB := newTap(a, b), newTap(recv, b)
	m := peer.NewMetrics()
	inA := ingestAsync(ctx, streamFetcher(t, tok, nil), b, nil, tapA.open, bad.open)
	waitGrowing(t, a, b.Digest, 256<<10) // past the flipped byte
	inB := ingestAsync(ctx, streamFetcher(t, tok, m), b, []string{hsA.URL}, tapB.open, good.open)
	waitFirst(t, "the receiver", tapB, inA, inB)
	close(bad.gate)
	inA.wait(t, "the sender")
	inB.wait(t, "the receiver")

	if !errors.Is(inA.err, cachestore.ErrDigestMismatch) {
		t.Errorf("the sender's own commit of its origin's flipped bytes: %v, want a digest mismatch", inA.err)
	}
	if inB.err != nil {
		t.Fatalf("the receiver: %v", inB.err)
	}
	assertCommitted(t, recv, b, data, inB.digest)
	if commits := tapB.commitErrs(); len(commits) != 1 || commits[0] != nil {
		t.Errorf("the receiver's commits: %v, want one, of the right bytes", commits)
	}
	if got := inB.res.Bytes(hsA.URL); got == 0 || got >= b.Size {
		t.Errorf("the receiver took %d bytes from the sender (spans %+v), want some but not the last (held for the sender's commit)", got, inB.res.Spans)
	}
	last := inB.res.Spans[len(inB.res.Spans)-1]
	if last.Source != peer.SourceOrigin || last.Offset != 0 || last.Bytes != b.Size {
		t.Errorf("the last span %+v, want the whole blob again from the origin (spans %+v)", last, inB.res.Spans)
	}
	if got := testutil.ToFloat64(m.Avoided(peer.AvoidStreamEnded)); got != 1 {
		t.Errorf("set aside for a stream cut short: %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.Avoided(peer.AvoidDigest)); got != 0 {
		t.Errorf("the sender, which relayed its source's bytes, was set aside as a liar %v times", got)
	}
}

// A sender streaming a blob behind a slow source is held to the idle
// timeout only, not to the progress floor: its answer says it is
// streamed (HeaderStreamed). Here the floor is 1 MiB per 100 ms and the
// sender's origin pauses for longer than several windows: the receiver
// still takes the whole blob from the sender and sets no peer aside.
func TestStreamSlowSenderIsNoStall(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*patience)
	defer cancel()
	data, b := blobOf(1<<20, 73)
	tok := tokenFile(t, "secret")
	a, recv := openStreamStore(t), openStreamStore(t)
	hsA, _ := servePeer(t, a, tok)
	origin := newGatedOrigin(data, 256<<10)

	tapA, tapB := newTap(a, b), newTap(recv, b)
	m := peer.NewMetrics()
	inA := ingestAsync(ctx, streamFetcher(t, tok, nil), b, nil, tapA.open, origin.open)
	waitGrowing(t, a, b.Digest, streamBuffer)
	floor := newFetcher(t, tok, m, peer.WithProgressFloor(1<<20, 100*time.Millisecond))
	inB := ingestAsync(ctx, floor, b, []string{hsA.URL}, tapB.open, nil)
	waitFirst(t, "the receiver", tapB, inA, inB)
	// The pause makes the sender slower than the floor (it is the
	// condition under test, not a wait for an event).
	time.Sleep(500 * time.Millisecond)
	close(origin.gate)
	inA.wait(t, "the sender")
	inB.wait(t, "the receiver")
	if inA.err != nil || inB.err != nil {
		t.Fatalf("sender: %v; receiver: %v", inA.err, inB.err)
	}
	assertCommitted(t, recv, b, data, inB.digest)
	if got := inB.res.Bytes(hsA.URL); got != b.Size {
		t.Errorf("the receiver got %d bytes from the sender, want all %d (spans %+v)", got, b.Size, inB.res.Spans)
	}
	for _, why := range []string{peer.AvoidStall, peer.AvoidStreamEnded} {
		if got := testutil.ToFloat64(m.Avoided(why)); got != 0 {
			t.Errorf("set aside %v times for %s", got, why)
		}
	}
}

// A blob being fetched is given by the Authorizer's rules as a committed
// one: the node it is granted to streams it, another gets what a blob
// not held gets; a growing blob not ahead of the caller (nothing written
// yet) is not served.
func TestStreamFollowsTheAuthorizer(t *testing.T) {
	s := openStreamStore(t)
	data, b := blobOf(300<<10, 73)
	grants := &nodeGrants{grants: map[string][]string{b.Digest: {"node-a"}}, addrs: map[string]netip.Addr{"node-a": netip.MustParseAddr("127.0.0.1")}}
	srv, err := peer.NewServer(peer.StoreBlobs{Store: s}, tokenIDs{"a": {User: "sa", Node: "node-a"}, "b": {User: "sa", Node: "node-b"}}, peer.WithAuthorizer(grants))
	if err != nil {
		t.Fatal(err)
	}
	hs := testenv.ServeOn(t, "127.0.0.1", srv)
	url := hs.URL + peer.BlobPath + b.Digest
	w, err := s.Writer(context.Background(), cachestore.WriterOpts{Ref: "r", Size: b.Size, Digest: b.Digest})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Abort()
	if resp, _ := get(t, "GET", url, "a", ""); resp.StatusCode != http.StatusNotFound {
		t.Errorf("a growing blob with nothing written: %d, want 404", resp.StatusCode)
	}
	w.Write(data[:2*streamBuffer])
	waitGrowing(t, s, b.Digest, 2*streamBuffer)
	if resp, _ := get(t, "GET", url, "a", "bytes="+fmt.Sprint(2*streamBuffer)+"-"); resp.StatusCode != http.StatusNotFound {
		t.Errorf("a growing blob asked from where its writer is: %d, want 404 (only from ahead of the caller)", resp.StatusCode)
	}
	if resp, _ := get(t, "GET", url, "b", ""); resp.StatusCode != http.StatusNotFound {
		t.Errorf("a growing blob to a node it is not granted to: %d, want 404", resp.StatusCode)
	}
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer a")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.ContentLength != b.Size {
		t.Fatalf("the granted node: %d, Content-Length %d, want 200 and the whole blob's %d", resp.StatusCode, resp.ContentLength, b.Size)
	}
	head := make([]byte, 2*streamBuffer)
	if _, err := io.ReadFull(resp.Body, head); err != nil || !bytes.Equal(head, data[:len(head)]) {
		t.Fatalf("the written part: %v, or it differs from the data", err)
	}
	w.Write(data[len(head):])
	if _, err := w.Commit(context.Background(), b.Size, b.Digest); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(resp.Body)
	if err != nil || !bytes.Equal(rest, data[len(head):]) {
		t.Fatalf("the rest, sent as it landed: %v, %d bytes", err, len(rest))
	}
}

// heldGet sends a GET of d with HeaderWait wait (and Range rng, when
// set) in the background; its answer comes on the channel.
type answer struct {
	resp *http.Response
	body []byte
	err  error
}

func heldGet(ctx context.Context, url, tok, wait, rng string) <-chan answer {
	out := make(chan answer, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
		if err != nil {
			out <- answer{err: err}
			return
		}
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set(peer.HeaderWait, wait)
		if rng != "" {
			req.Header.Set("Range", rng)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		out <- answer{resp: resp, body: body, err: err}
	}()
	return out
}

// held waits until the server holds n requests.
func held(t *testing.T, m *peer.Metrics, n float64) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("%v requests held", n), patience, func() error {
		if got := testutil.ToFloat64(m.Waiting()); got != n {
			return fmt.Errorf("%v held", got)
		}
		return nil
	})
}

func recv(t *testing.T, c <-chan answer) answer {
	t.Helper()
	select {
	case a := <-c:
		if a.err != nil {
			t.Fatal(a.err)
		}
		return a
	case <-time.After(2 * patience):
		t.Fatal("no answer")
	}
	return answer{}
}

// A request held for a blob the server does not hold is answered when
// the blob commits, with the blob; one for a blob that starts growing is
// answered from its Range as the bytes land.
func TestWaitAnsweredWhenTheBlobLands(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*patience)
	defer cancel()
	s := openStreamStore(t)
	tok := tokenFile(t, "secret")
	m := peer.NewMetrics()
	hs, _ := servePeer(t, s, tok, peer.WithServerMetrics(m))

	data, b := blobOf(5000, 74)
	c := heldGet(ctx, hs.URL+peer.BlobPath+b.Digest, "secret", "30", "")
	held(t, m, 1) // held before the blob is here
	commit(t, s, data)
	a := recv(t, c)
	if a.resp.StatusCode != 200 || !bytes.Equal(a.body, data) {
		t.Fatalf("held, then committed: %d, %d bytes", a.resp.StatusCode, len(a.body))
	}
	held(t, m, 0)

	data, b = blobOf(300<<10, 75)
	c = heldGet(ctx, hs.URL+peer.BlobPath+b.Digest, "secret", "30", "bytes=1000-")
	held(t, m, 1)
	w, err := s.Writer(ctx, cachestore.WriterOpts{Ref: "g", Size: b.Size, Digest: b.Digest})
	if err != nil {
		t.Fatal(err)
	}
	w.Write(data[:streamBuffer]) // two buffers, each written as it fills
	w.Write(data[streamBuffer : 2*streamBuffer])
	held(t, m, 0) // answered while the writer is open
	w.Write(data[2*streamBuffer:])
	if _, err := w.Commit(ctx, b.Size, b.Digest); err != nil {
		t.Fatal(err)
	}
	a = recv(t, c)
	if a.resp.StatusCode != 206 || a.resp.Header.Get("Content-Range") != fmt.Sprintf("bytes 1000-%d/%d", b.Size-1, b.Size) || !bytes.Equal(a.body, data[1000:]) {
		t.Fatalf("held, then growing: %d %q, %d bytes", a.resp.StatusCode, a.resp.Header.Get("Content-Range"), len(a.body))
	}
	if got := testutil.ToFloat64(m.Refusals(peer.RefusedNotFound)); got != 0 {
		t.Errorf("%v requests refused as not found, want 0", got)
	}
}

// A held request for a blob that never comes is a 404 at the end of its
// wait; a wait asked beyond the server's cap is held only to the cap;
// without the header a blob not held is a 404 at once (never held).
func TestWaitEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*patience)
	defer cancel()
	s := openStreamStore(t)
	tok := tokenFile(t, "secret")
	m := peer.NewMetrics()
	hs, _ := servePeer(t, s, tok, peer.WithServerMetrics(m), peer.WithMaxWait(time.Second))
	url := hs.URL + peer.BlobPath + "sha256:" + fmt.Sprintf("%064x", 7)
	for _, wait := range []string{"1", "3600", "99999999999999999999999999"} {
		// With the cap at 1s, asking an hour (or more than int64 holds)
		// answers within the test's patience.
		if a := recv(t, heldGet(ctx, url, "secret", wait, "")); a.resp.StatusCode != http.StatusNotFound {
			t.Errorf("wait %s for a blob that never comes: %d, want 404", wait, a.resp.StatusCode)
		}
	}
	if got := testutil.ToFloat64(m.Refusals(peer.RefusedNotFound)); got != 3 {
		t.Errorf("%v refused as not found, want 3", got)
	}
	if resp, _ := get(t, "GET", url, "secret", ""); resp.StatusCode != http.StatusNotFound {
		t.Errorf("without the header: %d, want 404", resp.StatusCode)
	}
	if got := testutil.ToFloat64(m.Waiting()); got != 0 {
		t.Errorf("%v requests still held", got)
	}
}

// A wait that is not whole seconds is a 400; beyond the bound on held
// requests a request that asks to wait is a 503 with Retry-After; a
// server that shuts its held requests (Close) answers them 503.
func TestWaitBounds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*patience)
	defer cancel()
	s := openStreamStore(t)
	tok := tokenFile(t, "secret")
	m := peer.NewMetrics()
	hs, srv := servePeer(t, s, tok, peer.WithServerMetrics(m), peer.WithMaxWaiting(1))
	url := hs.URL + peer.BlobPath + "sha256:" + fmt.Sprintf("%064x", 8)
	for _, bad := range []string{"-1", "1.5", "ten", "5s", "0x10"} {
		if a := recv(t, heldGet(ctx, url, "secret", bad, "")); a.resp.StatusCode != http.StatusBadRequest {
			t.Errorf("wait %q: %d, want 400", bad, a.resp.StatusCode)
		}
	}
	first := heldGet(ctx, url, "secret", "60", "")
	held(t, m, 1)
	a := recv(t, heldGet(ctx, url, "secret", "60", ""))
	if a.resp.StatusCode != http.StatusServiceUnavailable || a.resp.Header.Get("Retry-After") == "" {
		t.Errorf("a second held request with room for one: %d Retry-After %q, want 503 with Retry-After", a.resp.StatusCode, a.resp.Header.Get("Retry-After"))
	}
	if got := testutil.ToFloat64(m.Refusals(peer.RefusedWaitFull)); got != 1 {
		t.Errorf("refusals{reason=wait_full} = %v, want 1", got)
	}
	// Without the header a request is not held, whatever is held.
	if resp, _ := get(t, "GET", url, "secret", ""); resp.StatusCode != http.StatusNotFound {
		t.Errorf("without the header, while the server holds its most: %d, want 404", resp.StatusCode)
	}
	srv.Close()
	if a := recv(t, first); a.resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a held request when the server closes: %d, want 503", a.resp.StatusCode)
	}
	held(t, m, 0)
}

// A held request for a blob the Authorizer does not give the caller is
// held like one for a blob not here, even though the blob is here, and
// ends as a 404: waiting tells nothing of what this node holds for
// others. The caller it is given to gets it at once.
func TestWaitFollowsTheAuthorizer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*patience)
	defer cancel()
	s := openStreamStore(t)
	data, b := blobOf(4000, 76)
	commit(t, s, data)
	grants := &nodeGrants{grants: map[string][]string{b.Digest: {"node-a"}}, addrs: map[string]netip.Addr{"node-a": netip.MustParseAddr("127.0.0.1")}}
	m := peer.NewMetrics()
	srv, err := peer.NewServer(peer.StoreBlobs{Store: s}, tokenIDs{"a": {User: "sa", Node: "node-a"}, "b": {User: "sa", Node: "node-b"}},
		peer.WithAuthorizer(grants), peer.WithServerMetrics(m), peer.WithMaxWait(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	hs := testenv.ServeOn(t, "127.0.0.1", srv)
	url := hs.URL + peer.BlobPath + b.Digest
	refused := heldGet(ctx, url, "b", "60", "")
	held(t, m, 1)
	if a := recv(t, heldGet(ctx, url, "a", "60", "")); a.resp.StatusCode != 200 || !bytes.Equal(a.body, data) {
		t.Errorf("the granted node, with a wait: %d", a.resp.StatusCode)
	}
	if a := recv(t, refused); a.resp.StatusCode != http.StatusNotFound {
		t.Errorf("a node the blob is not granted to, after its wait: %d, want 404", a.resp.StatusCode)
	}
	if got := testutil.ToFloat64(m.Refusals(peer.RefusedForbidden)); got != 1 {
		t.Errorf("refusals{reason=forbidden} = %v, want 1", got)
	}
}
