package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/fetchers"
)

// Blobs is what the server serves from: the daemon implements it over its
// store (StoreBlobs).
type Blobs interface {
	// OpenBlob opens the committed, verified blob digest (always
	// "sha256:<64 lowercase hex>": the server validated it) and takes a
	// lease on it that keeps eviction and GC from removing it until
	// release is called; the server calls release exactly once, after the
	// transfer, and closes f itself. Only blobs that are committed (in
	// the index, verified) may be opened here. A blob
	// the store does not hold is an error wrapping cachestore.ErrNotFound
	// (404); any other error is a 500 with no detail.
	OpenBlob(ctx context.Context, digest string) (f *os.File, size int64, release func(), err error)
	// OpenGrowing opens the blob digest while this node is still
	// fetching it: the part written and hashed so far, and a wait for
	// more (GrowingBlob). A blob no fetch here is writing is an error
	// wrapping cachestore.ErrNotFound; the server then asks OpenBlob
	// (so a fetch must commit its blob before it stops being growing).
	// The server closes g after the transfer.
	OpenGrowing(ctx context.Context, digest string) (g GrowingBlob, err error)
	// WatchBlob returns a channel that is closed the next time the blob
	// digest may have become openable (committed, a fetch of it begun,
	// or its bytes grown); stop ends the watch, and the server calls it
	// exactly once.
	// A request held for a blob (HeaderWait) waits on it.
	WatchBlob(digest string) (changed <-chan struct{}, stop func())
}

// GrowingBlob is a blob this node is still fetching (a
// *cachestore.Growing): its first bytes, written and hashed but not yet
// verified as a whole, and more as they land. The receiver checks the
// whole blob's digest before it commits anything, as it does for every
// peer's bytes.
type GrowingBlob interface {
	// ReaderAt reads what is readable (a read past it is short, io.EOF).
	io.ReaderAt
	// Size is the whole blob's size.
	Size() int64
	// Written is how many bytes from the start are readable now.
	Written() int64
	// Wait returns once more than have bytes are readable (n: how many),
	// or with an error when no more will come through this view (the
	// fetch stopped or its bytes were found wrong) or ctx ended.
	Wait(ctx context.Context, have int64) (n int64, err error)
	// Whole waits until the fetch checked the whole blob (its size and
	// digest) or ended: nil when it checked or committed it, else an
	// error.
	Whole(ctx context.Context) error
	Close() error
}

// HeaderStreamed marks an answer whose bytes are sent as this node
// fetches them (a GrowingBlob): it flows at its source's pace, so the
// receiver holds it to no rate floor (the idle timeout still applies),
// and its last byte is sent only once this node checked the whole blob
// (its size and digest, before its own fsync and commit). One cut short, then, is not the sender's fault (its source
// failed or lied): the receiver drops what it got and asks again,
// without passing the sender over.
const HeaderStreamed = "X-Modelcache-Streamed"

// BlobPath is the route of one blob; a request names it as
// BlobPath + "sha256:<hex>".
const BlobPath = "/v1/blobs/"

// Server is the http.Handler of a daemon's peer port: GET and HEAD of
// BlobPath<digest>, with a single Range, for callers the Authenticator
// accepts, of the blobs the Authorizer (WithAuthorizer) gives them:
// committed ones, and those this node is still fetching (streamed as
// their bytes land). A request with HeaderWait for a blob not here yet
// is held until it is (at most WithMaxWait, WithMaxWaiting at once).
// Uploads are bounded: at most MaxUploads at once (503 with
// Retry-After beyond; a held request is held on until a slot frees)
// and UploadRate bytes per second across them. Use
// NewServer; safe for concurrent use.
type Server struct {
	blobs    Blobs
	auth     Authenticator
	o        serverOptions
	slots    chan struct{}
	freedMu  sync.Mutex
	freed    chan struct{} // closed (and replaced) when a slot is given back
	waiting  chan struct{} // the requests held (HeaderWait)
	limit    *rate.Limiter
	stopOnce sync.Once
	stopping chan struct{} // closed by Close: held requests end
}

type serverOptions struct {
	maxUploads int
	rate       float64
	retryAfter time.Duration
	sendIdle   time.Duration
	log        *slog.Logger
	metrics    *Metrics
	authz      Authorizer
	maxWait    time.Duration
	maxWaiting int
}

// ServerOption sets one setting of NewServer.
type ServerOption func(*serverOptions)

// WithMaxUploads bounds the transfers served at once; default 4.
func WithMaxUploads(n int) ServerOption { return func(o *serverOptions) { o.maxUploads = n } }

// WithUploadRate bounds the bytes per second sent across all uploads;
// default 0, no bound.
func WithUploadRate(bytesPerSecond float64) ServerOption {
	return func(o *serverOptions) { o.rate = bytesPerSecond }
}

// WithRetryAfter sets the Retry-After of a 503 for a full server;
// default 2s (whole seconds on the wire, at least 1).
func WithRetryAfter(d time.Duration) ServerOption { return func(o *serverOptions) { o.retryAfter = d } }

// WithSendIdle bounds how long one write of an upload may wait for the
// caller to take the bytes: a caller that stops reading loses its
// transfer (and its upload slot) after it; default 30s.
func WithSendIdle(d time.Duration) ServerOption { return func(o *serverOptions) { o.sendIdle = d } }

// WithServerLogger sets the logger; default none.
func WithServerLogger(l *slog.Logger) ServerOption { return func(o *serverOptions) { o.log = l } }

// WithServerMetrics counts uploads and refusals in m; default none.
func WithServerMetrics(m *Metrics) ServerOption { return func(o *serverOptions) { o.metrics = m } }

// WithAuthorizer lets a decide which blob each caller may have; default
// none: every caller the Authenticator accepts may have every committed
// blob (a static fleet, whose shared token names no one).
func WithAuthorizer(a Authorizer) ServerOption { return func(o *serverOptions) { o.authz = a } }

// WithMaxWait bounds how long a request is held for a blob not here yet
// (HeaderWait asks for a time; the server holds the least of the two);
// default 60s; 0 holds none (each is answered at once).
func WithMaxWait(d time.Duration) ServerOption { return func(o *serverOptions) { o.maxWait = d } }

// WithMaxWaiting bounds the requests held at once (each a connection and
// a goroutine, no upload slot, no file); beyond it a request that asks
// to wait is answered 503 with Retry-After. Default 1024.
func WithMaxWaiting(n int) ServerOption { return func(o *serverOptions) { o.maxWaiting = n } }

// NewServer serves blobs to the callers auth accepts.
func NewServer(blobs Blobs, auth Authenticator, opts ...ServerOption) (*Server, error) {
	o := serverOptions{maxUploads: 4, retryAfter: 2 * time.Second, sendIdle: 30 * time.Second,
		maxWait: 60 * time.Second, maxWaiting: 1024}
	for _, opt := range opts {
		opt(&o)
	}
	switch {
	case blobs == nil || auth == nil:
		return nil, errors.New("peer server: needs the store's blobs and an authenticator")
	case o.maxUploads < 1:
		return nil, fmt.Errorf("peer server: max uploads %d: want at least 1", o.maxUploads)
	case o.sendIdle <= 0:
		return nil, fmt.Errorf("peer server: send idle %s: want more than 0", o.sendIdle)
	case o.rate < 0:
		return nil, fmt.Errorf("peer server: upload rate %.0f bytes/s: want 0 (no bound) or more", o.rate)
	case o.maxWait < 0:
		return nil, fmt.Errorf("peer server: max wait %s: want 0 (hold no request) or more", o.maxWait)
	case o.maxWaiting < 1:
		return nil, fmt.Errorf("peer server: max waiting %d: want at least 1", o.maxWaiting)
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	s := &Server{blobs: blobs, auth: auth, o: o, slots: make(chan struct{}, o.maxUploads), freed: make(chan struct{}),
		waiting: make(chan struct{}, o.maxWaiting), stopping: make(chan struct{})}
	if o.rate > 0 {
		s.limit = rate.NewLimiter(rate.Limit(o.rate), burst(o.rate))
	}
	return s, nil
}

// burst is the limiter's bucket: a tenth of a second, between 4 KiB and
// 256 KiB, so a send is a few syscalls and the rate holds within a
// fraction of a second.
func burst(bps float64) int {
	return int(min(max(bps/10, 4<<10), 256<<10))
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Authentication first: a caller without a valid token learns
	// nothing, not even whether its path was well formed.
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || tok == "" {
		s.refuse(w, RefusedUnauthorized, http.StatusUnauthorized, "no bearer token", r)
		return
	}
	caller, err := s.auth.Authenticate(WithSource(r.Context(), sourceOf(r)), tok)
	if err != nil {
		if errors.Is(err, ErrUnauthenticated) {
			s.refuse(w, RefusedUnauthorized, http.StatusUnauthorized, err.Error(), r)
		} else {
			w.Header().Set("Retry-After", s.retryAfter())
			s.refuse(w, RefusedAuthError, http.StatusServiceUnavailable, err.Error(), r)
		}
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		s.refuse(w, RefusedBadRequest, http.StatusMethodNotAllowed, "method "+r.Method, r)
		return
	}
	// The path is only ever parsed into a digest: nothing of it reaches
	// the file system.
	d, ok := strings.CutPrefix(r.URL.Path, BlobPath)
	if !ok || r.URL.RawQuery != "" || !strings.HasPrefix(d, cachestore.DigestPrefix) {
		s.refuse(w, RefusedBadRequest, http.StatusNotFound, "path "+strconv.Quote(r.URL.Path), r)
		return
	}
	if _, err := cachestore.ParseDigest(d); err != nil {
		s.refuse(w, RefusedBadRequest, http.StatusBadRequest, err.Error(), r)
		return
	}
	wait, err := s.waitOf(r.Header)
	if err != nil {
		s.refuse(w, RefusedBadRequest, http.StatusBadRequest, err.Error(), r)
		return
	}
	c, no := s.find(r, caller, d, wait)
	if no != nil && no.status == http.StatusInternalServerError {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	if no != nil {
		if no.retry {
			w.Header().Set("Retry-After", s.retryAfter())
		}
		s.refuse(w, no.reason, no.status, no.why, r)
		return
	}
	defer c.close()
	defer s.release()
	start, n, err := parseRange(r.Header.Get("Range"), c.size)
	if err != nil {
		w.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", c.size))
		s.refuse(w, RefusedBadRange, http.StatusRequestedRangeNotSatisfiable, err.Error(), r)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Accept-Ranges", "bytes")
	h.Set("ETag", `"`+d+`"`)
	h.Set("Content-Length", strconv.FormatInt(n, 10))
	if c.growing != nil {
		h.Set(HeaderStreamed, "1")
	}
	status := http.StatusOK
	if r.Header.Get("Range") != "" {
		status = http.StatusPartialContent
		h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, start+n-1, c.size))
	}
	w.WriteHeader(status)
	if r.Method == http.MethodHead {
		return
	}
	rc := http.NewResponseController(w)
	out := deadlineWriter{w: w, rc: rc, idle: s.o.sendIdle}
	var sent int64
	if c.growing == nil {
		sent, err = io.Copy(out, fetchers.RateLimited(r.Context(), io.NewSectionReader(c.file, start, n), s.limit))
	} else {
		sent, err = s.sendGrowing(r.Context(), out, rc, c.growing, start, n)
	}
	s.o.metrics.served(sent)
	if err != nil {
		// Cut short: the caller sees fewer bytes than Content-Length and
		// goes on from where it got to, elsewhere.
		s.o.log.Debug("peer: upload ended early", "digest", d, "sent", sent, "want", n, "growing", c.growing != nil, "err", err)
	}
}

// content is what one answer sends: a committed blob (file) or one being
// fetched here (growing).
type content struct {
	file    *os.File
	growing GrowingBlob
	size    int64
	close   func()
}

// refusal is an answer other than the blob.
type refusal struct {
	reason string
	status int
	why    string
	retry  bool // with Retry-After
}

// look is one look for d: authorized, an upload slot, opened.
func (s *Server) look(r *http.Request, caller Identity, d string) (content, *refusal) {
	if no := s.authorize(r, caller, d); no != nil {
		return content{}, no
	}
	select {
	case s.slots <- struct{}{}:
	default:
		return content{}, &refusal{reason: RefusedBusy, status: http.StatusServiceUnavailable, retry: true, why: "all upload slots busy"}
	}
	c, err := s.open(r.Context(), d, r.Header.Get("Range"))
	if err != nil {
		s.release()
		if errors.Is(err, cachestore.ErrNotFound) {
			return content{}, &refusal{reason: RefusedNotFound, status: http.StatusNotFound, why: "blob " + d}
		}
		s.o.log.Error("peer: open blob", "digest", d, "err", err)
		return content{}, &refusal{status: http.StatusInternalServerError}
	}
	return c, nil
}

// open opens d growing, else committed. In that order no commit slips
// between the two looks: a fetch's blob is committed before its growing
// view is gone. A growing blob is served only from ahead of the caller
// (more bytes written than where rng starts): a node's bytes come from
// its source, so bytes that cycle between nodes that are fetching the
// blob from each other are never asked for.
func (s *Server) open(ctx context.Context, d, rng string) (content, error) {
	g, err := s.blobs.OpenGrowing(ctx, d)
	if err == nil {
		if start, _, err := parseRange(rng, g.Size()); err != nil || g.Written() > start {
			return content{growing: g, size: g.Size(), close: func() { g.Close() }}, nil
		}
		g.Close()
	} else if !errors.Is(err, cachestore.ErrNotFound) {
		return content{}, err
	}
	f, size, release, err := s.blobs.OpenBlob(ctx, d)
	if err != nil {
		return content{}, err
	}
	return content{file: f, size: size, close: func() { f.Close(); release() }}, nil
}

// sendGrowing sends bytes [start, start+n) of g as they land, flushing
// what it has before each wait; it ends with an error when g stops
// short of them. The blob's last byte waits for g's check (Whole): a
// receiver that gets every byte got bytes this node checked, and one
// whose stream is cut short knows they were not (HeaderStreamed).
func (s *Server) sendGrowing(ctx context.Context, out io.Writer, rc *http.ResponseController, g GrowingBlob, start, n int64) (int64, error) {
	pos, end := start, start+n
	for pos < end {
		stop := min(end, g.Size()-1) // the last byte waits for the check
		if pos == stop {
			if err := g.Whole(ctx); err != nil {
				return pos - start, err
			}
			stop = end
		}
		have, err := g.Wait(ctx, pos)
		if err != nil {
			return pos - start, err
		}
		k, err := io.Copy(out, fetchers.RateLimited(ctx, io.NewSectionReader(g, pos, min(have, stop)-pos), s.limit))
		pos += k
		if err != nil {
			return pos - start, err
		}
		if pos < end {
			if err := rc.Flush(); err != nil {
				return pos - start, err
			}
		}
	}
	return n, nil
}

// authorize says whether caller, asking from r's source address, may
// have blob d (the Authorizer's answer; every caller without one): nil,
// or a refusal that answers it as a blob not held.
func (s *Server) authorize(r *http.Request, caller Identity, d string) *refusal {
	if s.o.authz == nil {
		return nil
	}
	caller.Source = sourceOf(r)
	err := s.o.authz.Authorize(r.Context(), caller, d)
	if err == nil {
		return nil
	}
	reason := RefusedAuthzError
	switch {
	case errors.Is(err, ErrSourceMismatch):
		reason = RefusedSourceMismatch
	case errors.Is(err, ErrForbidden):
		reason = RefusedForbidden
	case errors.Is(err, cachestore.ErrNotFound):
		reason = RefusedNotFound
	}
	return &refusal{reason: reason, status: http.StatusNotFound, why: fmt.Sprintf("blob %s for %s (node %q, pod %q in %q, from %s): %v",
		d, caller.User, caller.Node, caller.Pod, caller.Namespace, caller.Source, err)}
}

// refuse answers status with a body that says only the status: why is
// in the log, not on the wire. A blob refused to an authenticated daemon
// is logged as a warning: a daemon asks only for blobs of its own
// desires, so it is a misconfiguration or a caller that is not what its
// token says.
func (s *Server) refuse(w http.ResponseWriter, reason string, status int, why string, r *http.Request) {
	s.o.metrics.refused(reason)
	level := slog.LevelDebug
	if reason == RefusedForbidden || reason == RefusedSourceMismatch {
		level = slog.LevelWarn
	}
	s.o.log.Log(r.Context(), level, "peer: request refused", "reason", reason, "status", status, "why", why, "remote", r.RemoteAddr)
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Bearer realm="modelcache-peer"`)
	}
	http.Error(w, http.StatusText(status), status)
}

// sourceOf is the address r came from (its connection's peer, an IPv4
// address in IPv6 form unmapped); zero when the server does not know it.
func sourceOf(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

func (s *Server) retryAfter() string {
	return strconv.Itoa(max(1, int((s.o.retryAfter+time.Second-1)/time.Second)))
}

// errBadRange is wrapped by parseRange's errors.
var errBadRange = errors.New("bad range")

// parseRange reads a Range header for a blob of size bytes: empty means
// the whole blob; else one range, "bytes=a-b", "bytes=a-" or
// "bytes=-n" (the last n bytes); an end past the blob is cut to it. Any
// other form (several ranges, another unit, a start at or past the end)
// is an error: the peer's one client asks for one range.
func parseRange(h string, size int64) (start, n int64, err error) {
	if h == "" {
		return 0, size, nil
	}
	spec, ok := strings.CutPrefix(h, "bytes=")
	a, b, dash := strings.Cut(spec, "-")
	if !ok || !dash || strings.Contains(spec, ",") {
		return 0, 0, fmt.Errorf("%w %q: want one range, bytes=START-[END]", errBadRange, h)
	}
	num := func(s string) (int64, bool) {
		v, err := strconv.ParseInt(s, 10, 64)
		return v, err == nil && v >= 0 && s != "" && s[0] != '+'
	}
	if a == "" { // suffix
		k, ok := num(b)
		if !ok || k == 0 || size == 0 {
			return 0, 0, fmt.Errorf("%w %q for a blob of %d bytes", errBadRange, h, size)
		}
		k = min(k, size)
		return size - k, k, nil
	}
	first, ok := num(a)
	if !ok || first >= size {
		return 0, 0, fmt.Errorf("%w %q for a blob of %d bytes", errBadRange, h, size)
	}
	last := size - 1
	if b != "" {
		v, ok := num(b)
		if !ok || v < first {
			return 0, 0, fmt.Errorf("%w %q for a blob of %d bytes", errBadRange, h, size)
		}
		last = min(v, size-1)
	}
	return first, last - first + 1, nil
}

// deadlineWriter gives each write idle to complete.
type deadlineWriter struct {
	w    io.Writer
	rc   *http.ResponseController
	idle time.Duration
}

func (d deadlineWriter) Write(p []byte) (int, error) {
	d.rc.SetWriteDeadline(time.Now().Add(d.idle)) // best effort: a writer without deadlines keeps the server's
	return d.w.Write(p)
}
