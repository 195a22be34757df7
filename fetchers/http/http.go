// Package http fetches one file from an http:// or https:// URL, pinned by
// an optional "#sha256=<hex>" fragment. Resolve records the server's
// validator (a strong ETag, else Last-Modified); downloads resume with
// Range and If-Range against it after an interruption, so a file that
// changed on the server is started over, never continued with bytes of
// another version. 429 and 503 are retried after the server's
// Retry-After; TLS is verified with the system roots.
package http

import (
	"context"
	"fmt"
	"io"
	nethttp "net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/modelcache/modelcache/fetchers"
)

// Fetcher implements fetchers.Fetcher for http(s) URLs. Safe for
// concurrent use.
type Fetcher struct {
	opts   fetchers.HTTPOptions
	client *nethttp.Client
	// authorization is the Authorization header of every request ("": none).
	authorization string
}

// SendsCredentials reports whether the fetcher sends an Authorization
// header of its own (WithAuthorization).
func (f *Fetcher) SendsCredentials(context.Context, string) bool { return f.authorization != "" }

// Option configures New.
type Option func(*Fetcher)

// WithHTTP sets the shared HTTP options (fetchers.Option): the transport
// and redirect policy of the default client, the idle timeout and the
// User-Agent. A file is read on one stream: the Range options are not read.
func WithHTTP(opts ...fetchers.Option) Option { return func(f *Fetcher) { f.opts.Apply(opts...) } }

// WithClient sets the HTTP client; default: fetchers.HTTPOptions.Client,
// whose redirects cannot reach host-internal addresses (fetchers.Guard)
// and take no credentials to another origin
// (fetchers.DropAuthAcrossOrigins). A client given here is used as it is:
// its maker guards it (hf does), and the transport options are not read.
func WithClient(c *nethttp.Client) Option { return func(f *Fetcher) { f.client = c } }

// WithAuthorization sends v as the Authorization header of every request
// to the source (default none). A redirect that leaves the source's
// origin (scheme, host and port: another host, a subdomain, another port,
// http from https) is followed without it (fetchers.DropAuthAcrossOrigins).
func WithAuthorization(v string) Option { return func(f *Fetcher) { f.authorization = v } }

// New returns an HTTP fetcher.
func New(opts ...Option) *Fetcher {
	f := &Fetcher{opts: fetchers.DefaultHTTPOptions()}
	for _, o := range opts {
		o(f)
	}
	if f.client == nil {
		f.client = f.opts.Client()
	}
	return f
}

// ParseURI splits a URL into the URL to fetch, the file name and the
// expected digest from a "#sha256=<hex>" fragment ("" when absent).
func ParseURI(uri string) (fetchURL, name, digest string, err error) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", "", "", fmt.Errorf("source %q: %w: %v", uri, fetchers.ErrBadSource, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "", "", "", fmt.Errorf("source %q: %w: not http(s)", uri, fetchers.ErrBadSource)
	}
	if u.Host == "" {
		return "", "", "", fmt.Errorf("source %q: %w: no host", uri, fetchers.ErrBadSource)
	}
	if u.Fragment != "" {
		k, v, ok := strings.Cut(u.Fragment, "=")
		if !ok || !strings.EqualFold(k, "sha256") || len(v) != 64 || strings.Trim(strings.ToLower(v), "0123456789abcdef") != "" {
			return "", "", "", fmt.Errorf("source %q: %w: fragment %q; the only fragment understood is #sha256=<64 hex>", uri, fetchers.ErrBadSource, u.Fragment)
		}
		digest = "sha256:" + strings.ToLower(v)
	}
	name = path.Base(u.Path)
	if name == "/" || name == "." || name == "" {
		return "", "", "", fmt.Errorf("source %q: %w: the URL names no file; http sources fetch one file", uri, fetchers.ErrBadSource)
	}
	u.Fragment = ""
	return u.String(), name, digest, nil
}

// Resolve learns the size and the validator with a HEAD request. The
// revision is the digest from the fragment when there is one; otherwise
// empty (the content digest becomes the revision after the download). The
// file's Validator (and Etag, which the manifest records) is the strong
// ETag, else the Last-Modified date, else empty.
func (f *Fetcher) Resolve(ctx context.Context, src fetchers.Source) (*fetchers.Resolved, error) {
	fetchURL, name, digest, err := ParseURI(src.URI)
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	size := int64(-1)
	req, err := nethttp.NewRequestWithContext(ctx, nethttp.MethodHead, fetchURL, nil)
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	req.Header.Set("User-Agent", f.opts.UserAgent)
	if f.authorization != "" {
		req.Header.Set("Authorization", f.authorization)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("source %q: HEAD: %w", src.URI, err)
	}
	resp.Body.Close()
	var validator string
	switch {
	case resp.StatusCode == nethttp.StatusOK:
		if resp.ContentLength >= 0 && resp.Header.Get("Content-Encoding") == "" {
			size = resp.ContentLength
		}
		validator = Validator(resp.Header)
	case resp.StatusCode == nethttp.StatusMethodNotAllowed || resp.StatusCode == nethttp.StatusNotImplemented:
		// No HEAD: the size comes from the GET.
	default:
		if err := StatusError(src.URI, resp); err != nil {
			return nil, err
		}
	}
	res := &fetchers.Resolved{URI: src.URI, Files: []fetchers.File{{Path: name, Size: size, Digest: digest, Locator: fetchURL, Validator: validator, Etag: validator}}}
	if digest != "" {
		res.Revision = digest[len("sha256:"):]
	}
	return res, nil
}

// Open GETs the file from offset with a Range request. With a Validator
// the range is asked with If-Range: a 200 instead of a 206 whose
// validator differs means the file changed since Resolve, and Open fails
// with fetchers.ErrCannotResume (the caller starts the file over from 0).
// A file with neither a validator nor a digest cannot be resumed safely at
// all (nothing would tell two versions apart), so an offset other than 0
// fails the same way. A server that ignores Range but still has the same
// version is read from the start and the first offset bytes are skipped.
func (f *Fetcher) Open(ctx context.Context, file fetchers.File, offset int64) (io.ReadCloser, error) {
	if offset > 0 && file.Validator == "" && file.Digest == "" {
		return nil, fmt.Errorf("GET %s: %w from byte %d: the server gives no ETag or Last-Modified and the source no #sha256, so nothing proves the rest is of the same version", file.Locator, fetchers.ErrCannotResume, offset)
	}
	var h nethttp.Header
	if offset > 0 && file.Validator != "" {
		h = nethttp.Header{"If-Range": {file.Validator}}
	}
	return f.Get(ctx, file.Locator, file.Size, offset, h, nil)
}

// Validator returns the response's strong ETag, else its Last-Modified
// date, else "": what If-Range may name. Weak ETags ("W/...") are never
// validators for a range.
func Validator(h nethttp.Header) string {
	if et := strings.TrimSpace(h.Get("ETag")); len(et) >= 2 && et[0] == '"' && et[len(et)-1] == '"' {
		return et
	}
	if lm := strings.TrimSpace(h.Get("Last-Modified")); lm != "" {
		if _, err := nethttp.ParseTime(lm); err == nil {
			return lm
		}
	}
	return ""
}

// sameVersion reports whether a response carries the validator v.
func sameVersion(h nethttp.Header, v string) bool {
	if strings.HasPrefix(v, `"`) {
		return strings.TrimSpace(h.Get("ETag")) == v
	}
	got, err1 := nethttp.ParseTime(strings.TrimSpace(h.Get("Last-Modified")))
	want, err2 := nethttp.ParseTime(v)
	return err1 == nil && err2 == nil && got.Equal(want)
}

// Get streams url from offset (size is the whole file's, -1 when
// unknown) with the extra request headers given; onError, when not nil,
// turns an error status into an error first (nil falls back to
// StatusError). Other fetchers that speak HTTP (hf) stream through it.
func (f *Fetcher) Get(ctx context.Context, url string, size, offset int64, header nethttp.Header, onError func(*nethttp.Response) error) (io.ReadCloser, error) {
	return f.GetRange(ctx, url, size, offset, -1, header, onError)
}

// GetRange is Get of n bytes from offset (n < 0: to the end). A server
// that answers a bounded range with the whole file is refused, so
// parallel readers never get wrong bytes. When header carries If-Range, a
// 200 to a ranged request whose validator is not the one named fails with
// fetchers.ErrCannotResume: the file changed, and skipping offset bytes of
// the new version would splice two versions together.
func (f *Fetcher) GetRange(ctx context.Context, url string, size, offset, n int64, header nethttp.Header, onError func(*nethttp.Response) error) (io.ReadCloser, error) {
	req, err := nethttp.NewRequestWithContext(ctx, nethttp.MethodGet, url, nil)
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("User-Agent", f.opts.UserAgent)
	if f.authorization != "" {
		req.Header.Set("Authorization", f.authorization)
	}
	req.Header.Set("Accept-Encoding", "identity")
	switch {
	case n >= 0:
		req.Header.Set("Range", "bytes="+strconv.FormatInt(offset, 10)+"-"+strconv.FormatInt(offset+n-1, 10))
	case offset > 0:
		req.Header.Set("Range", "bytes="+strconv.FormatInt(offset, 10)+"-")
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	switch resp.StatusCode {
	case nethttp.StatusOK:
		if n >= 0 && (offset > 0 || size < 0 || n < size) {
			resp.Body.Close()
			return nil, fetchers.Permanent(fmt.Errorf("GET %s: the server ignores Range requests; use one connection", url))
		}
		if v := header.Get("If-Range"); offset > 0 && v != "" && !sameVersion(resp.Header, v) {
			resp.Body.Close()
			return nil, fmt.Errorf("GET %s: %w from byte %d: the file changed on the server since it was resolved (validator %s, now %q)", url, fetchers.ErrCannotResume, offset, v, Validator(resp.Header))
		}
		body := fetchers.IdleTimeout(resp.Body, f.opts.IdleTimeout)
		if offset > 0 {
			if _, err := io.CopyN(io.Discard, body, offset); err != nil {
				body.Close()
				return nil, fmt.Errorf("GET %s: skip to %d: %w", url, offset, err)
			}
		}
		return body, nil
	case nethttp.StatusPartialContent:
		start, err := contentRangeStart(resp.Header.Get("Content-Range"))
		if err != nil || start != offset {
			resp.Body.Close()
			return nil, fmt.Errorf("GET %s: asked for bytes from %d, server sent Content-Range %q", url, offset, resp.Header.Get("Content-Range"))
		}
		return fetchers.IdleTimeout(resp.Body, f.opts.IdleTimeout), nil
	case nethttp.StatusRequestedRangeNotSatisfiable:
		resp.Body.Close()
		if size >= 0 && offset == size {
			return io.NopCloser(strings.NewReader("")), nil
		}
		return nil, fmt.Errorf("GET %s: %w: range from %d not satisfiable; the file changed on the server", url, fetchers.ErrCannotResume, offset)
	}
	defer resp.Body.Close()
	if onError != nil {
		if err := onError(resp); err != nil {
			return nil, err
		}
	}
	return nil, StatusError(url, resp)
}

func contentRangeStart(h string) (int64, error) {
	// "bytes 100-199/200"
	rest, ok := strings.CutPrefix(h, "bytes ")
	if !ok {
		return 0, fmt.Errorf("bad Content-Range %q", h)
	}
	s, _, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, fmt.Errorf("bad Content-Range %q", h)
	}
	return strconv.ParseInt(s, 10, 64)
}

// StatusError turns a non-success status into an error: retryable for 429,
// 408 and 5xx (with the server's Retry-After), Permanent otherwise.
func StatusError(what string, resp *nethttp.Response) error {
	code := resp.StatusCode
	switch {
	case code == nethttp.StatusTooManyRequests || code == nethttp.StatusServiceUnavailable:
		return &fetchers.RetryAfterError{Status: code, After: fetchers.ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
	case code == nethttp.StatusRequestTimeout || code >= 500:
		return fmt.Errorf("%s: server error %s", what, resp.Status)
	case code == nethttp.StatusNotFound || code == nethttp.StatusGone:
		return fetchers.Permanent(fmt.Errorf("%s: %w (HTTP %d); check the URL", what, fetchers.ErrNotFound, code))
	case code == nethttp.StatusUnauthorized || code == nethttp.StatusForbidden:
		return fetchers.Permanent(fmt.Errorf("%s: %w (HTTP %d); the server wants credentials this source does not carry", what, fetchers.ErrUnauthorized, code))
	}
	return fetchers.Permanent(fmt.Errorf("%s: unexpected %s", what, resp.Status))
}
