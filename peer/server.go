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
	"time"

	"golang.org/x/time/rate"

	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/fetchers"
)

// Blobs is what the server serves from: the daemon implements it over its
// store.
type Blobs interface {
	// OpenBlob opens the committed, verified blob digest (always
	// "sha256:<64 lowercase hex>": the server validated it) and takes a
	// lease on it that keeps eviction and GC from removing it until
	// release is called; the server calls release exactly once, after the
	// transfer, and closes f itself. Only blobs that are committed (in
	// the index, verified) may be opened, never a partial ingest. A blob
	// the store does not hold is an error wrapping cachestore.ErrNotFound
	// (404); any other error is a 500 with no detail.
	OpenBlob(ctx context.Context, digest string) (f *os.File, size int64, release func(), err error)
}

// BlobPath is the route of one blob; a request names it as
// BlobPath + "sha256:<hex>".
const BlobPath = "/v1/blobs/"

// Server is the http.Handler of a daemon's peer port: GET and HEAD of
// BlobPath<digest>, with a single Range, for callers the Authenticator
// accepts, of the blobs the Authorizer (WithAuthorizer) gives them.
// Uploads are bounded: at most MaxUploads at once (503 with
// Retry-After beyond) and UploadRate bytes per second across them. Use
// NewServer; safe for concurrent use.
type Server struct {
	blobs Blobs
	auth  Authenticator
	o     serverOptions
	slots chan struct{}
	limit *rate.Limiter
}

type serverOptions struct {
	maxUploads int
	rate       float64
	retryAfter time.Duration
	sendIdle   time.Duration
	log        *slog.Logger
	metrics    *Metrics
	authz      Authorizer
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

// NewServer serves blobs to the callers auth accepts.
func NewServer(blobs Blobs, auth Authenticator, opts ...ServerOption) (*Server, error) {
	o := serverOptions{maxUploads: 4, retryAfter: 2 * time.Second, sendIdle: 30 * time.Second}
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
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	s := &Server{blobs: blobs, auth: auth, o: o, slots: make(chan struct{}, o.maxUploads)}
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
	caller, err := s.auth.Authenticate(r.Context(), tok)
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
	if !s.authorized(w, r, caller, d) {
		return
	}
	select {
	case s.slots <- struct{}{}:
		defer func() { <-s.slots }()
	default:
		w.Header().Set("Retry-After", s.retryAfter())
		s.refuse(w, RefusedBusy, http.StatusServiceUnavailable, "all upload slots busy", r)
		return
	}
	f, size, release, err := s.blobs.OpenBlob(r.Context(), d)
	if err != nil {
		if errors.Is(err, cachestore.ErrNotFound) {
			s.refuse(w, RefusedNotFound, http.StatusNotFound, "blob "+d, r)
		} else {
			s.o.log.Error("peer: open blob", "digest", d, "err", err)
			http.Error(w, "internal error", http.StatusInternalServerError)
		}
		return
	}
	defer release()
	defer f.Close()
	start, n, err := parseRange(r.Header.Get("Range"), size)
	if err != nil {
		w.Header().Set("Content-Range", fmt.Sprintf("bytes */%d", size))
		s.refuse(w, RefusedBadRange, http.StatusRequestedRangeNotSatisfiable, err.Error(), r)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/octet-stream")
	h.Set("Accept-Ranges", "bytes")
	h.Set("ETag", `"`+d+`"`)
	h.Set("Content-Length", strconv.FormatInt(n, 10))
	status := http.StatusOK
	if r.Header.Get("Range") != "" {
		status = http.StatusPartialContent
		h.Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, start+n-1, size))
	}
	w.WriteHeader(status)
	if r.Method == http.MethodHead {
		return
	}
	out := deadlineWriter{w: w, rc: http.NewResponseController(w), idle: s.o.sendIdle}
	sent, err := io.Copy(out, fetchers.RateLimited(r.Context(), io.NewSectionReader(f, start, n), s.limit))
	s.o.metrics.served(sent)
	if err != nil {
		s.o.log.Debug("peer: upload ended early", "digest", d, "sent", sent, "want", n, "err", err)
	}
}

// authorized says whether caller, asking from r's source address, may
// have blob d (the Authorizer's answer; every caller without one), and
// refuses it otherwise. It is asked before the store: a blob the caller
// may not have is answered as one not held, so the answer tells nothing
// of what this node holds for others.
func (s *Server) authorized(w http.ResponseWriter, r *http.Request, caller Identity, d string) bool {
	if s.o.authz == nil {
		return true
	}
	caller.Source = sourceOf(r)
	err := s.o.authz.Authorize(r.Context(), caller, d)
	if err == nil {
		return true
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
	s.refuse(w, reason, http.StatusNotFound, fmt.Sprintf("blob %s for %s (node %q, pod %q in %q, from %s): %v",
		d, caller.User, caller.Node, caller.Pod, caller.Namespace, caller.Source, err), r)
	return false
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
