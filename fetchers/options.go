package fetchers

import (
	"fmt"
	"net/http"
	"net/netip"
	"time"
)

// HTTPOptions are the settings that the fetchers speaking HTTP (hf, ngc,
// s3, http, oci) share, set in one place by this package's Options. Each
// fetcher's own options embed them; its package adds the options that
// are its alone (hf.WithEndpoint, ngc.WithAPIKey, s3.WithStaticCredentials)
// and a WithHTTP option that takes these:
//
//	hf.New(hf.WithToken(t), hf.WithHTTP(fetchers.WithConnections(8)))
//
// A fetcher reads the fields that apply to it and says which in its
// WithHTTP; the defaults are DefaultHTTPOptions'.
type HTTPOptions struct {
	// Transport carries the requests; nil: the fetcher's default
	// (DefaultTransport for hf, ngc and http, the SDK's for s3,
	// go-containerregistry's for oci). Either way it is wrapped in the
	// redirect policy (Guard).
	Transport http.RoundTripper
	// Guard is the redirect policy; its Internal is set by WithInternal.
	Guard Guard
	// IdleTimeout bounds a stream that delivers nothing (IdleTimeout):
	// the read fails and the download resumes on a new request.
	IdleTimeout time.Duration
	// UserAgent is sent with every request the fetcher makes itself.
	UserAgent string
	// Connections, Chunk and RangeBelow shape the parallel Range
	// requests of one large file (Ranged, AdaptiveReader): fetchers that
	// read a file on one stream (http, oci) do not read them.
	Connections int
	Chunk       int64
	RangeBelow  float64
	// NoRedirects refuses every redirect (RefuseRedirects) instead of
	// following it under the redirect policy.
	NoRedirects bool
}

// Option sets one of HTTPOptions.
type Option func(*HTTPOptions)

// DefaultHTTPOptions are the settings of a fetcher given no Option.
func DefaultHTTPOptions() HTTPOptions {
	return HTTPOptions{IdleTimeout: 60 * time.Second, UserAgent: "modelcached", Connections: 4, Chunk: DefaultChunk}
}

// WithTransport sets the HTTP transport; default the fetcher's own (see
// HTTPOptions.Transport). It is wrapped in the redirect policy (Guard).
func WithTransport(t http.RoundTripper) Option { return func(o *HTTPOptions) { o.Transport = t } }

// WithInternal sets which addresses count as host-internal for the
// redirect policy (Guard); default IsInternal. Tests use it to treat a
// loopback address as remote.
func WithInternal(internal func(netip.Addr) bool) Option {
	return func(o *HTTPOptions) { o.Guard.Internal = internal }
}

// WithIdleTimeout sets how long a body may deliver nothing before the
// read fails and the download resumes on a new request; default 60s.
func WithIdleTimeout(d time.Duration) Option { return func(o *HTTPOptions) { o.IdleTimeout = d } }

// WithoutRedirects makes Client refuse every redirect (RefuseRedirects);
// default: follow them under the redirect policy (DropAuthAcrossOrigins).
func WithoutRedirects() Option { return func(o *HTTPOptions) { o.NoRedirects = true } }

// WithUserAgent sets the User-Agent; default "modelcached".
func WithUserAgent(ua string) Option { return func(o *HTTPOptions) { o.UserAgent = ua } }

// WithConnections sets how many connections may fetch one large file at
// once (files of at least 4 chunks); default 4, at most 64. A file starts
// on one and gets Range requests only when that one is the limit
// (AdaptiveReader): CDNs and object stores limit each connection; on
// loopback more connections do not help.
func WithConnections(n int) Option { return func(o *HTTPOptions) { o.Connections = n } }

// WithChunk sets the bytes of one parallel Range request; default
// DefaultChunk, at least 1 MiB. Memory per file is (connections+1) × chunk.
func WithChunk(n int64) Option { return func(o *HTTPOptions) { o.Chunk = n } }

// WithRangeBelow sets the rate (bytes per second spent waiting on one
// connection) under which a file gets Range connections; default
// DefaultRangeBelow.
func WithRangeBelow(bps float64) Option { return func(o *HTTPOptions) { o.RangeBelow = bps } }

// Apply sets o from opts, in order.
func (o *HTTPOptions) Apply(opts ...Option) {
	for _, opt := range opts {
		opt(o)
	}
}

// CheckRanges reports Connections out of 1..64 or Chunk under 1 MiB.
func (o HTTPOptions) CheckRanges() error {
	if o.Connections < 1 || o.Connections > 64 || o.Chunk < 1<<20 {
		return fmt.Errorf("connections %d (want 1..64), chunk %d (want >= 1 MiB)", o.Connections, o.Chunk)
	}
	return nil
}

// DefaultTransport is a clone of net/http's default transport that waits
// at most 60s for a response's headers and keeps up to 16 idle
// connections per host.
func DefaultTransport() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.ResponseHeaderTimeout = 60 * time.Second
	t.MaxIdleConnsPerHost = 16
	return t
}

// Client is an HTTP client over Transport (DefaultTransport when nil)
// whose redirects cannot reach host-internal addresses (Guard) and take no
// credentials to another origin (DropAuthAcrossOrigins). It has no
// overall timeout: large files take long; IdleTimeout bounds a stall.
// With NoRedirects it follows none (RefuseRedirects).
func (o HTTPOptions) Client() *http.Client {
	t := o.Transport
	if t == nil {
		t = DefaultTransport()
	}
	check := DropAuthAcrossOrigins
	if o.NoRedirects {
		check = RefuseRedirects
	}
	return &http.Client{Transport: o.Guard.Transport(t, nil), CheckRedirect: check}
}

// Ranged is the file of size bytes that open reads, in Range requests
// shaped by o, each retried with b.
func (o HTTPOptions) Ranged(open RangeFunc, size int64, b Backoff) Ranged {
	return Ranged{Open: open, Size: size, Chunk: o.Chunk, Conns: o.Connections, Below: o.RangeBelow, Backoff: b}
}

// RangeBackoff is the backoff of each Range request of the hf and ngc
// fetchers (s3's is DefaultBackoff).
var RangeBackoff = Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second, Attempts: 4, MaxRetryAfter: time.Minute}
