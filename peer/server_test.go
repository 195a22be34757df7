package peer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/peer"
)

func TestServerRanges(t *testing.T) {
	s := openStore(t)
	data, b := blobOf(10000, 1)
	commit(t, s, data)
	tok := tokenFile(t, "secret")
	hs, _ := servePeer(t, s, tok)
	url := hs.URL + peer.BlobPath + b.Digest
	for _, tc := range []struct {
		rng          string
		status       int
		contentRange string
		from, to     int // the body: data[from:to]
	}{
		{"", 200, "", 0, 10000},
		{"bytes=0-", 206, "bytes 0-9999/10000", 0, 10000},
		{"bytes=100-199", 206, "bytes 100-199/10000", 100, 200},
		{"bytes=9999-", 206, "bytes 9999-9999/10000", 9999, 10000},
		{"bytes=9000-20000", 206, "bytes 9000-9999/10000", 9000, 10000}, // the end cut to the blob
		{"bytes=-10", 206, "bytes 9990-9999/10000", 9990, 10000},
		{"bytes=-20000", 206, "bytes 0-9999/10000", 0, 10000},
		{"bytes=10000-", 416, "bytes */10000", 0, 0}, // starts at the end
		{"bytes=200-100", 416, "bytes */10000", 0, 0},
		{"bytes=0-1,5-6", 416, "bytes */10000", 0, 0}, // several ranges
		{"bytes=-0", 416, "bytes */10000", 0, 0},
		{"items=0-1", 416, "bytes */10000", 0, 0},
		{"bytes=+1-2", 416, "bytes */10000", 0, 0},
		{"bytes=x-", 416, "bytes */10000", 0, 0},
	} {
		resp, body := get(t, http.MethodGet, url, "secret", tc.rng)
		if resp.StatusCode != tc.status || resp.Header.Get("Content-Range") != tc.contentRange {
			t.Errorf("Range %q: %d Content-Range %q, want %d %q", tc.rng, resp.StatusCode, resp.Header.Get("Content-Range"), tc.status, tc.contentRange)
			continue
		}
		if tc.status < 300 && !bytes.Equal(body, data[tc.from:tc.to]) {
			t.Errorf("Range %q: %d bytes of body, not data[%d:%d]", tc.rng, len(body), tc.from, tc.to)
		}
	}
	resp, body := get(t, http.MethodHead, url, "secret", "")
	if resp.StatusCode != 200 || resp.ContentLength != 10000 || len(body) != 0 || resp.Header.Get("Accept-Ranges") != "bytes" {
		t.Errorf("HEAD: %d, Content-Length %d, %d bytes of body, Accept-Ranges %q", resp.StatusCode, resp.ContentLength, len(body), resp.Header.Get("Accept-Ranges"))
	}
}

// A path is only ever a digest: anything else is refused before the
// store is asked, and a digest the store lacks is 404.
func TestServerRefusesWhatIsNotACommittedBlob(t *testing.T) {
	s := openStore(t)
	data, b := blobOf(100, 2)
	commit(t, s, data)
	// A partial ingest is not a blob: its bytes are never served.
	partial, pb := blobOf(8192, 3)
	w, err := s.Writer(context.Background(), cachestore.WriterOpts{Ref: "partial", Size: pb.Size})
	if err != nil {
		t.Fatal(err)
	}
	w.Write(partial)
	w.Close()
	opened := &countingBlobs{Blobs: peer.StoreBlobs{Store: s}}
	srv, err := peer.NewServer(opened, peer.StaticTokenAuthenticator{File: tokenFile(t, "secret")})
	if err != nil {
		t.Fatal(err)
	}
	hs := testenv.ServeOn(t, "127.0.0.1", srv)
	hexd := strings.TrimPrefix(b.Digest, "sha256:")
	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{"GET", peer.BlobPath + pb.Digest, 404},
		{"GET", peer.BlobPath + "sha256:" + strings.Repeat("0", 64), 404},
		{"GET", peer.BlobPath + hexd, 404}, // the bare hex form is not a route
		{"GET", peer.BlobPath + "sha256:" + strings.ToUpper(hexd), 400},
		{"GET", peer.BlobPath + "sha256:" + hexd[:63], 400},
		{"GET", peer.BlobPath + "sha256:../../index.db", 400},
		{"GET", peer.BlobPath + "sha256:" + hexd + "/x", 400},
		{"GET", peer.BlobPath + b.Digest + "?path=/etc/passwd", 404},
		{"GET", "/v1/blobs/../../etc/passwd", 404},
		{"GET", "/blobs/sha256/" + hexd[:2] + "/" + hexd, 404}, // the store's layout is no route
		{"POST", peer.BlobPath + b.Digest, 405},
		{"DELETE", peer.BlobPath + b.Digest, 405},
	} {
		resp, body := get(t, tc.method, hs.URL+tc.path, "secret", "")
		if resp.StatusCode != tc.status {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path, resp.StatusCode, tc.status)
		}
		if bytes.Contains(body, partial[:16]) || bytes.Contains(body, data[:16]) {
			t.Errorf("%s %s: the body holds blob bytes", tc.method, tc.path)
		}
	}
	if n := opened.opens.Load(); n != 2 {
		t.Errorf("the store was asked %d times, want 2 (the two well-formed digests)", n)
	}
}

// countingBlobs counts opens and releases; block, when not nil, holds
// OpenBlob until it is closed.
type countingBlobs struct {
	peer.Blobs
	opens, releases atomic.Int32
	block           chan struct{}
}

func (c *countingBlobs) OpenBlob(ctx context.Context, d string) (*os.File, int64, func(), error) {
	c.opens.Add(1)
	if c.block != nil {
		<-c.block
	}
	f, n, release, err := c.Blobs.OpenBlob(ctx, d)
	if err != nil {
		return f, n, release, err
	}
	return f, n, func() { c.releases.Add(1); release() }, nil
}

// Every request without a token the authenticator accepts is 401 with
// the same body, which names nothing (neither the reason nor whether the
// blob exists); the store is never asked.
func TestServerRequiresAToken(t *testing.T) {
	s := openStore(t)
	data, b := blobOf(100, 4)
	commit(t, s, data)
	blobs := &countingBlobs{Blobs: peer.StoreBlobs{Store: s}}
	m := peer.NewMetrics()
	srv, err := peer.NewServer(blobs, peer.StaticTokenAuthenticator{File: tokenFile(t, "secret")}, peer.WithServerMetrics(m))
	if err != nil {
		t.Fatal(err)
	}
	hs := testenv.ServeOn(t, "127.0.0.1", srv)
	var bodies []string
	for _, hdr := range []string{"", "Bearer ", "Bearer wrong", "Basic c2VjcmV0", "bearer secret", "Bearer secret2", "Bearer secre"} {
		for _, path := range []string{peer.BlobPath + b.Digest, "/v1/blobs/garbage"} {
			req, _ := http.NewRequest("GET", hs.URL+path, nil)
			if hdr != "" {
				req.Header.Set("Authorization", hdr)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 401 || resp.Header.Get("WWW-Authenticate") == "" {
				t.Errorf("Authorization %q, %s: %d (WWW-Authenticate %q), want 401", hdr, path, resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
			}
			bodies = append(bodies, string(body))
		}
	}
	for _, body := range bodies {
		if body != bodies[0] {
			t.Errorf("401 bodies differ: %q and %q", bodies[0], body)
		}
	}
	if blobs.opens.Load() != 0 {
		t.Errorf("the store was asked %d times for unauthenticated requests", blobs.opens.Load())
	}
	if got := testutil.ToFloat64(m.Refusals(peer.RefusedUnauthorized)); got != float64(len(bodies)) {
		t.Errorf("refusals{reason=unauthorized} = %v, want %d", got, len(bodies))
	}
	if resp, _ := get(t, "GET", hs.URL+peer.BlobPath+b.Digest, "secret", ""); resp.StatusCode != 200 {
		t.Errorf("with the token: %d", resp.StatusCode)
	}
}

// An authenticator that cannot decide is a 503, not a 401: the caller
// tries elsewhere and comes back.
func TestServerAuthenticatorDown(t *testing.T) {
	srv, err := peer.NewServer(&countingBlobs{}, downAuth{})
	if err != nil {
		t.Fatal(err)
	}
	hs := testenv.ServeOn(t, "127.0.0.1", srv)
	resp, _ := get(t, "GET", hs.URL+peer.BlobPath+"sha256:"+strings.Repeat("a", 64), "tok", "")
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Errorf("%d, Retry-After %q: want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

type downAuth struct{}

func (downAuth) Authenticate(context.Context, string) (peer.Identity, error) {
	return peer.Identity{}, errors.New("connection refused")
}

// Beyond MaxUploads transfers the server answers 503 with Retry-After;
// each transfer's lease is released when it ends, a cut one included.
func TestServerBoundsUploadsAndReleasesLeases(t *testing.T) {
	s := openStore(t)
	data, b := blobOf(1<<20, 5)
	commit(t, s, data)
	blobs := &countingBlobs{Blobs: peer.StoreBlobs{Store: s}, block: make(chan struct{})}
	m := peer.NewMetrics()
	srv, err := peer.NewServer(blobs, peer.StaticTokenAuthenticator{File: tokenFile(t, "secret")},
		peer.WithMaxUploads(1), peer.WithRetryAfter(3*time.Second), peer.WithServerMetrics(m))
	if err != nil {
		t.Fatal(err)
	}
	hs := testenv.ServeOn(t, "127.0.0.1", srv)
	url := hs.URL + peer.BlobPath + b.Digest
	first := make(chan []byte)
	go func() {
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("Authorization", "Bearer secret")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			first <- nil
			return
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		first <- body
	}()
	testenv.Eventually(t, "the first transfer holds the slot", 5*time.Second, func() error {
		if blobs.opens.Load() != 1 {
			return fmt.Errorf("%d opens", blobs.opens.Load())
		}
		return nil
	})
	resp, _ := get(t, "GET", url, "secret", "")
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "3" {
		t.Errorf("second transfer: %d, Retry-After %q; want 503, 3", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	// One that may wait (a child in the blob's tree) is held for the
	// slot, not refused, and served once the slot is given back.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	third := heldGet(ctx, url, "secret", "30", "")
	held(t, m, 1)
	close(blobs.block)
	if body := <-first; !bytes.Equal(body, data) {
		t.Errorf("the first transfer got %d bytes, not the blob", len(body))
	}
	if a := recv(t, third); a.resp.StatusCode != 200 || !bytes.Equal(a.body, data) {
		t.Errorf("the held transfer: %d, %d bytes; want the blob once the slot was free", a.resp.StatusCode, len(a.body))
	}
	// A client that goes away midway: the lease still ends.
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer secret")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadFull(resp.Body, make([]byte, 10))
	resp.Body.Close()
	testenv.Eventually(t, "every lease released", 5*time.Second, func() error {
		if o, r := blobs.opens.Load(), blobs.releases.Load(); o != 3 || r != 3 {
			return fmt.Errorf("%d opens, %d releases", o, r)
		}
		return nil
	})
	if got := testutil.ToFloat64(m.Refusals(peer.RefusedBusy)); got != 1 {
		t.Errorf("refusals{reason=busy} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.Uploads()); got != 3 {
		t.Errorf("uploads = %v, want 3", got)
	}
}

// A caller that stops reading loses its transfer after the send idle
// time: it cannot hold an upload slot (and the blob's lease) for ever.
func TestServerDropsACallerThatStopsReading(t *testing.T) {
	s := openStore(t)
	data, b := blobOf(32<<20, 6) // more than the socket buffers hold
	commit(t, s, data)
	blobs := &countingBlobs{Blobs: peer.StoreBlobs{Store: s}}
	srv, err := peer.NewServer(blobs, peer.StaticTokenAuthenticator{File: tokenFile(t, "secret")}, peer.WithSendIdle(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	hs := testenv.ServeOn(t, "127.0.0.1", srv)
	req, _ := http.NewRequest("GET", hs.URL+peer.BlobPath+b.Digest, nil)
	req.Header.Set("Authorization", "Bearer secret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close() // read nothing
	testenv.Eventually(t, "the stalled transfer ends and releases its lease", 20*time.Second, func() error {
		if r := blobs.releases.Load(); r != 1 {
			return fmt.Errorf("%d releases", r)
		}
		return nil
	})
}

func TestNewServerValidates(t *testing.T) {
	a := peer.StaticTokenAuthenticator{File: peer.NewTokenFile("/nonexistent")}
	for _, opt := range []peer.ServerOption{peer.WithMaxUploads(0), peer.WithUploadRate(-1), peer.WithSendIdle(0), peer.WithMaxWait(-time.Second), peer.WithMaxWaiting(0)} {
		if _, err := peer.NewServer(&countingBlobs{}, a, opt); err == nil {
			t.Error("a bad setting was accepted")
		}
	}
}

// tokenIDs accepts the tokens it maps, as the callers they name.
type tokenIDs map[string]peer.Identity

func (m tokenIDs) Authenticate(_ context.Context, tok string) (peer.Identity, error) {
	if id, ok := m[tok]; ok {
		return id, nil
	}
	return peer.Identity{}, peer.ErrUnauthenticated
}

// nodeGrants gives each blob to the nodes it lists ("*": every caller);
// a blob it does not list is not found; down answers that it cannot
// decide.
type nodeGrants struct {
	grants map[string][]string
	addrs  map[string]netip.Addr // a node's address: a blob granted to the node goes only to requests from it
	down   atomic.Bool
	asked  atomic.Int32
}

func (g *nodeGrants) Authorize(_ context.Context, caller peer.Identity, d string) error {
	g.asked.Add(1)
	if g.down.Load() {
		return errors.New("the API server is unreachable")
	}
	nodes, ok := g.grants[d]
	if !ok {
		return fmt.Errorf("blob %s: %w", d, cachestore.ErrNotFound)
	}
	for _, n := range nodes {
		switch {
		case n == "*":
			return nil
		case n == caller.Node && n != "" && g.addrs[n] != caller.Source:
			return fmt.Errorf("blob %s to node %q from %s: %w", d, n, caller.Source, peer.ErrSourceMismatch)
		case n == caller.Node && n != "":
			return nil
		}
	}
	return fmt.Errorf("blob %s to node %q: %w", d, caller.Node, peer.ErrForbidden)
}

// With an Authorizer, a caller gets only the blobs it gives it, asked
// with the address the request came from: a blob refused (or undecided,
// or refused for that address) is answered exactly as a blob not held,
// before the store is asked, and counted by reason.
func TestServerAuthorizer(t *testing.T) {
	s := openStore(t)
	pub, pb := blobOf(3000, 21)
	priv, vb := blobOf(5000, 22)
	commit(t, s, pub)
	commit(t, s, priv)
	missing := "sha256:" + strings.Repeat("e", 64) // given to all, not in the store
	unknown := "sha256:" + strings.Repeat("d", 64) // the authorizer knows no holder
	// node-c's address is not where the requests come from: its token is
	// replayed from elsewhere.
	grants := &nodeGrants{grants: map[string][]string{pb.Digest: {"*"}, vb.Digest: {"node-a", "node-c"}, missing: {"*"}},
		addrs: map[string]netip.Addr{"node-a": netip.MustParseAddr("127.0.0.1"), "node-c": netip.MustParseAddr("10.9.9.9")}}
	blobs := &countingBlobs{Blobs: peer.StoreBlobs{Store: s}}
	m := peer.NewMetrics()
	srv, err := peer.NewServer(blobs, tokenIDs{"a": {User: "sa", Node: "node-a"}, "b": {User: "sa", Node: "node-b"}, "c": {User: "sa", Node: "node-c"}, "none": {User: "sa"}},
		peer.WithAuthorizer(grants), peer.WithServerMetrics(m))
	if err != nil {
		t.Fatal(err)
	}
	hs := testenv.ServeOn(t, "127.0.0.1", srv)
	url := func(d string) string { return hs.URL + peer.BlobPath + d }
	// What a caller sees of a 404, whatever its cause.
	seen := func(resp *http.Response, body []byte) string {
		h := resp.Header.Clone()
		h.Del("Date")
		return fmt.Sprintf("%d %v %q", resp.StatusCode, h, body)
	}
	notHeld := map[string]string{}
	for _, method := range []string{"GET", "HEAD"} {
		notHeld[method] = seen(get(t, method, url(missing), "a", ""))
		if !strings.HasPrefix(notHeld[method], "404 ") {
			t.Fatalf("%s of a blob not held: %s", method, notHeld[method])
		}
	}
	for _, tc := range []struct {
		tok, digest string
		want        []byte // nil: refused
	}{
		{"a", vb.Digest, priv},
		{"b", vb.Digest, nil},
		{"none", vb.Digest, nil}, // a token bound to no node
		{"c", vb.Digest, nil},    // a token replayed from an address not its node's
		{"c", pb.Digest, pub},
		{"a", pb.Digest, pub},
		{"b", pb.Digest, pub},
		{"none", pb.Digest, pub},
		{"a", unknown, nil},
	} {
		for _, method := range []string{"GET", "HEAD"} {
			resp, body := get(t, method, url(tc.digest), tc.tok, "")
			switch {
			case tc.want == nil && seen(resp, body) != notHeld[method]:
				t.Errorf("%s %s with token %q: %s, want what a blob not held gets: %s", method, tc.digest, tc.tok, seen(resp, body), notHeld[method])
			case tc.want != nil && (resp.StatusCode != 200 || (method == "GET" && !bytes.Equal(body, tc.want))):
				t.Errorf("%s %s with token %q: %d, %d bytes of body", method, tc.digest, tc.tok, resp.StatusCode, len(body))
			}
		}
	}
	// Refused blobs never reach the store: GET and HEAD of the 5 served
	// and of the one given but not held.
	if n := blobs.opens.Load(); n != 12 {
		t.Errorf("the store was asked %d times, want 12", n)
	}
	// An authorizer that cannot decide: not found too, never the blob.
	grants.down.Store(true)
	for _, tok := range []string{"a", "b"} {
		if got := seen(get(t, "GET", url(vb.Digest), tok, "")); got != notHeld["GET"] {
			t.Errorf("undecided, token %q: %s, want %s", tok, got, notHeld["GET"])
		}
	}
	for reason, want := range map[string]float64{peer.RefusedForbidden: 4, peer.RefusedSourceMismatch: 2, peer.RefusedNotFound: 4, peer.RefusedAuthzError: 2} {
		if got := testutil.ToFloat64(m.Refusals(reason)); got != want {
			t.Errorf("refusals{reason=%s} = %v, want %v", reason, got, want)
		}
	}
	// The authorizer is asked only for a caller the authenticator
	// accepted and a well-formed digest.
	before := grants.asked.Load()
	get(t, "GET", url(vb.Digest), "stolen", "")
	get(t, "GET", url("sha256:xyz"), "a", "")
	if n := grants.asked.Load() - before; n != 0 {
		t.Errorf("the authorizer was asked %d times for an unauthenticated or malformed request", n)
	}
}
