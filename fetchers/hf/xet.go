package hf

import (
	"context"
	"errors"
	"fmt"
	"io"
	nethttp "net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/fetchers/hf/xet"
)

// Route says which path a file took: "xet" (reconstructed from the Xet
// CAS, hub-docs docs/xet/) or "resolve" (the resolve URL: the hub's
// "bridge" for clients that do not speak Xet). The reader Open returns
// says it too, once read (Transport: the daemon records it in the file's
// manifest entry, which inspect shows). The fetcher reports it
// through WithRouteReport: once when Open picks a path, and, for a Xet
// read, again with Done and its counts when the last byte was read or
// when it fell back to the bridge mid-file.
type Route struct {
	Path   string // the file's path in the repo
	OID    string // its sha256 (hex), "" for a file outside LFS
	Via    string // RouteXet or RouteResolve
	Reason string // why the resolve URL ("" for xet)
	Offset int64  // where this read started (a bridge taking over mid-file: where it took over)
	// Done, Fetched and Reused: a Xet read that ended. Fetched counts
	// xorb bytes received, Reused file bytes the node's ChunkStore gave.
	Done            bool
	Fetched, Reused int64
}

// The values of Route.Via.
const (
	RouteXet     = "xet"
	RouteResolve = "resolve"
)

// transportReader is a reader of the resolve URL that says so.
type transportReader struct {
	io.ReadCloser
	via string
}

// Transport is how the file was sent: RouteXet or RouteResolve (the
// values of api.TransportXet and api.TransportResolve).
func (t transportReader) Transport() string { return t.via }

// WithXet turns reading files through Xet on or off; default on. Off,
// every file comes from the resolve URL as before.
func WithXet(enabled bool) Option { return func(o *options) { o.noXet = !enabled } }

// WithChunkStore gives the chunks the node holds: a Xet read takes them
// from it instead of the CAS, and records the terms of each file it
// assembled whole once the caller says its blob was committed
// (Committed on the reader; ChunkStore.Remember). Default none: every
// chunk is fetched.
func WithChunkStore(s xet.ChunkStore) Option { return func(o *options) { o.chunks = s } }

// WithRouteReport sets a function told which path each file took
// (Route); it must not block. Default none.
func WithRouteReport(fn func(Route)) Option { return func(o *options) { o.onRoute = fn } }

// xetRetryWindow: a file Xet assembled whole that is asked again from
// offset 0 this soon after is taken from the bridge, since the caller
// most likely refused its digest (a wrong chunk that decoded cleanly).
const xetRetryWindow = 10 * time.Minute

// xetState is the fetcher's Xet side: token sources per token URL (one
// token serves every file of a repo and revision) and the files Xet
// assembled lately.
type xetState struct {
	mu     sync.Mutex
	tokens map[string]*xet.TokenSource
	done   map[string]time.Time // oid → when Xet last assembled it whole
}

func (f *Fetcher) report(r Route) {
	if f.onRoute != nil {
		f.onRoute(r)
	}
}

// open streams file from offset through Xet when the hub offers it, else
// from the resolve URL, and reports which.
func (f *Fetcher) open(ctx context.Context, file fetchers.File, offset int64, bridge func(context.Context, int64) (io.ReadCloser, error)) (io.ReadCloser, error) {
	oid, _ := strings.CutPrefix(file.Digest, "sha256:")
	route := Route{Path: file.Path, OID: oid, Via: RouteResolve, Offset: offset}
	if f.noXet {
		route.Reason = "xet turned off"
	} else if file.Digest == "" {
		route.Reason = "not an LFS file"
	} else if r, reason := f.openXet(ctx, file, oid, offset, bridge); r != nil {
		return r, nil
	} else {
		route.Reason = reason
	}
	f.report(route)
	rc, err := bridge(ctx, offset)
	if err != nil {
		return nil, err
	}
	return transportReader{rc, RouteResolve}, nil
}

// openXet returns a reader over Xet, or nil and why not.
func (f *Fetcher) openXet(ctx context.Context, file fetchers.File, oid string, offset int64, bridge func(context.Context, int64) (io.ReadCloser, error)) (io.ReadCloser, string) {
	f.xs.mu.Lock()
	last, recent := f.xs.done[oid]
	f.xs.mu.Unlock()
	if recent && offset == 0 && time.Since(last) < xetRetryWindow {
		return nil, "asked again after a Xet read of it: its digest was likely refused"
	}
	id, tokenURL, err := f.resolveXet(ctx, file)
	if err != nil {
		return nil, err.Error()
	}
	ts := f.tokenSource(tokenURL)
	if _, err := ts.Get(ctx); err != nil {
		return nil, "xet read token: " + err.Error()
	}
	o := xet.Options{Client: f.client, Tokens: ts, FileID: id, Size: file.Size, Store: f.chunks, OID: oid, Conns: f.opts.Connections}
	st := &xet.Stats{}
	f.report(Route{Path: file.Path, OID: oid, Via: RouteXet, Offset: offset})
	r := &xetReader{f: f, file: file, oid: oid, ctx: ctx, start: offset, pos: offset, st: st, bridge: bridge}
	r.x = xet.Open(ctx, o, offset, st)
	r.rc = r.x
	return r, ""
}

// resolveXet asks the resolve URL without following its redirect
// (huggingface_hub does the same HEAD): a file stored in Xet answers
// X-Xet-Hash, its file id, and Link rel="xet-auth", the token route.
func (f *Fetcher) resolveXet(ctx context.Context, file fetchers.File) (id, tokenURL string, err error) {
	req, err := nethttp.NewRequestWithContext(ctx, nethttp.MethodHead, file.Locator, nil)
	if err != nil {
		return "", "", err
	}
	req.Header = f.header()
	req.Header.Set("User-Agent", f.opts.UserAgent)
	c := *f.client
	c.CheckRedirect = func(*nethttp.Request, []*nethttp.Request) error { return nethttp.ErrUseLastResponse }
	resp, err := c.Do(req)
	if err != nil {
		return "", "", fmt.Errorf("resolve: %v", err)
	}
	resp.Body.Close()
	id = resp.Header.Get("X-Xet-Hash")
	if id == "" {
		return "", "", errors.New("the hub names no X-Xet-Hash for it")
	}
	if _, err := xet.ParseHash(id); err != nil {
		return "", "", err
	}
	tokenURL = f.endpoint + "/api/models/" + strings.TrimPrefix(repoOf(file.Locator), "/") + "/xet-read-token/" + revOf(file.Locator)
	for _, l := range strings.Split(strings.Join(resp.Header.Values("Link"), ","), ",") {
		u, rel, ok := strings.Cut(l, ";")
		if !ok || !strings.Contains(strings.ReplaceAll(rel, " ", ""), `rel="xet-auth"`) {
			continue
		}
		u = strings.Trim(strings.TrimSpace(u), "<>")
		// The hub's token goes with it: only to the hub's own origin.
		ep, _ := url.Parse(f.endpoint)
		if pu, err := url.Parse(u); err == nil && ep != nil && pu.Scheme == ep.Scheme && pu.Host == ep.Host {
			tokenURL = u
		}
	}
	return id, tokenURL, nil
}

func repoOf(locator string) string {
	u, err := url.Parse(locator)
	if err != nil {
		return ""
	}
	repo, _, _ := strings.Cut(u.Path, "/resolve/")
	return repo
}

func revOf(locator string) string {
	u, err := url.Parse(locator)
	if err != nil {
		return "main"
	}
	_, rest, _ := strings.Cut(u.Path, "/resolve/")
	rev, _, _ := strings.Cut(rest, "/")
	return rev
}

func (f *Fetcher) tokenSource(u string) *xet.TokenSource {
	f.xs.mu.Lock()
	defer f.xs.mu.Unlock()
	ts := f.xs.tokens[u]
	if ts == nil {
		ts = &xet.TokenSource{URL: u, Header: f.header(), Client: f.client}
		f.xs.tokens[u] = ts
	}
	return ts
}

// xetReader reads a file over Xet; when Xet fails for good it continues
// from the bridge at the byte it reached, so a failure costs the rest of
// the file, never what was read.
type xetReader struct {
	f       *Fetcher
	file    fetchers.File
	oid     string
	ctx     context.Context
	start   int64
	pos     int64
	st      *xet.Stats
	rc      io.ReadCloser
	x       *xet.Reader // the Xet read rc started as
	bridge  func(context.Context, int64) (io.ReadCloser, error)
	bridged bool // the bridge took over
}

func (r *xetReader) Read(b []byte) (int, error) {
	n, err := r.rc.Read(b)
	r.pos += int64(n)
	if err == nil || r.bridged || r.ctx.Err() != nil {
		return n, err
	}
	done := Route{Path: r.file.Path, OID: r.oid, Via: RouteXet, Offset: r.start, Done: true, Fetched: r.st.Fetched.Load(), Reused: r.st.Reused.Load()}
	if err == io.EOF {
		r.f.xs.mu.Lock()
		now := time.Now()
		for oid, t := range r.f.xs.done { // keep only what the window still counts
			if now.Sub(t) >= xetRetryWindow {
				delete(r.f.xs.done, oid)
			}
		}
		r.f.xs.done[r.oid] = now
		r.f.xs.mu.Unlock()
		r.f.report(done)
		return n, err
	}
	r.rc.Close()
	done.Via, done.Offset, done.Reason = RouteResolve, r.pos, fmt.Sprintf("xet failed at byte %d: %v", r.pos, err)
	r.f.report(done)
	rc, berr := r.bridge(r.ctx, r.pos)
	if berr != nil {
		return n, berr
	}
	r.rc, r.bridged = rc, true
	if n == 0 {
		return r.Read(b)
	}
	return n, nil
}

func (r *xetReader) Close() error { return r.rc.Close() }

// Committed is the caller's word that a blob of digest was committed
// from the bytes read, its digest checked: a file Xet gave whole from
// byte 0 then teaches the ChunkStore where its fetched chunks sit
// (xet.Reader.Committed). The daemon says it after each commit; a
// caller that does not only leaves the store without them.
func (r *xetReader) Committed(digest string) {
	if !r.bridged {
		r.x.Committed(digest)
	}
}

// Transport is how the file was sent: RouteXet, or RouteResolve once the
// resolve URL took over.
func (r *xetReader) Transport() string {
	if r.bridged {
		return RouteResolve
	}
	return RouteXet
}
