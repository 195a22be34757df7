package fetchers

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// The redirect policy of every fetcher that speaks HTTP. A credential
// goes only to the origin it was given for: the scheme, host and port of
// the first request (a missing port is the scheme's default, so
// https://h and https://h:443 are one origin). A redirect anywhere else
// (another host, a subdomain, another port, http from https) is followed
// without it. Credentials are
//
//   - headers: Authorization, Cookie, Cookie2, and any header whose name
//     holds token, secret, passw, signature, credential, api-key,
//     access-key or private-key (X-Amz-Security-Token, X-Api-Key, …);
//   - the userinfo of the first request's URL (Go sends it as basic auth);
//   - the values of the first request's secret query parameters
//     (IsSecretParam: presigned-URL signatures, tokens) when a redirect
//     carries them on; a redirect's own signed URL (a CDN's, which the
//     origin minted for it) is kept.
//
// A client may refuse redirects altogether (RefuseRedirects, set by
// WithoutRedirects): then nothing of the request leaves its origin.
//
// Two hooks apply it: DropAuthAcrossOrigins, the http.Client
// CheckRedirect of every fetcher, and Guard.Transport, which strips what
// a RoundTripper above it added after CheckRedirect ran
// (go-containerregistry's registry transport sets Authorization per
// request by host and port alone, whatever the scheme).

// SameOrigin reports whether a and b are one origin: the same scheme,
// host and port, with the scheme's default port filled in and case
// ignored.
func SameOrigin(a, b *url.URL) bool {
	return strings.EqualFold(a.Scheme, b.Scheme) && hostPort(a) == hostPort(b)
}

// IsCredentialHeader reports whether a request header named name carries
// a credential (see the policy above).
func IsCredentialHeader(name string) bool {
	n := strings.ReplaceAll(strings.ToLower(name), "-", "_")
	switch n {
	case "authorization", "cookie", "cookie2":
		return true
	}
	for _, s := range secretInfixes {
		if strings.Contains(n, strings.ReplaceAll(s, "-", "_")) {
			return true
		}
	}
	return false
}

// ErrRedirect is wrapped by the error of a request whose answer was a
// redirect that its client refuses (RefuseRedirects).
var ErrRedirect = errors.New("redirect refused")

// RefuseRedirects is the CheckRedirect of a client that follows no
// redirect at all (HTTPOptions.NoRedirects): a source that must answer
// itself (a peer daemon) and redirects instead has broken its contract.
// The error wraps ErrRedirect and is Permanent: asking again gets the
// same redirect.
func RefuseRedirects(req *http.Request, via []*http.Request) error {
	return Permanent(fmt.Errorf("%s answered with a redirect to %s: %w", via[len(via)-1].URL.Redacted(), req.URL.Redacted(), ErrRedirect))
}

// DropAuthAcrossOrigins is the http.Client CheckRedirect of every
// fetcher: it follows at most 10 redirects and removes the credentials of
// the first request from a redirect that leaves its origin (the policy
// above). Where a redirect may lead at all is the transport's Guard.
func DropAuthAcrossOrigins(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return fmt.Errorf("stopped after 10 redirects (last to %s)", req.URL.Redacted())
	}
	stripCredentials(req, via[0].URL)
	return nil
}

// withoutCredentials returns req, or a copy of it without the
// credentials of origin when req leaves that origin: what a RoundTripper
// may send.
func withoutCredentials(req *http.Request, origin *url.URL) *http.Request {
	if SameOrigin(origin, req.URL) {
		return req
	}
	r := req.Clone(req.Context())
	stripCredentials(r, origin)
	return r
}

// stripCredentials removes from req, in place, the credentials of origin
// when req leaves it.
func stripCredentials(req *http.Request, origin *url.URL) {
	// Go's client sets Referer to the previous URL, query and signatures
	// included; a fetcher has no use for it.
	req.Header.Del("Referer")
	if SameOrigin(origin, req.URL) {
		return
	}
	for k := range req.Header {
		if IsCredentialHeader(k) {
			req.Header.Del(k)
		}
	}
	if req.URL.User != nil && origin.User != nil && req.URL.User.String() == origin.User.String() {
		u := *req.URL
		u.User = nil
		req.URL = &u
	}
	secrets := map[string]bool{}
	for k, vs := range origin.Query() {
		if IsSecretParam(k) {
			for _, v := range vs {
				if v != "" {
					secrets[v] = true
				}
			}
		}
	}
	if len(secrets) == 0 || req.URL.RawQuery == "" {
		return
	}
	q, changed := req.URL.Query(), false
	for k, vs := range q {
		out := vs[:0]
		for _, v := range vs {
			if !secrets[v] {
				out = append(out, v)
			}
		}
		if len(out) != len(vs) {
			changed = true
			if len(out) == 0 {
				q.Del(k)
			} else {
				q[k] = out
			}
		}
	}
	if changed {
		u := *req.URL
		u.RawQuery = q.Encode()
		req.URL = &u
	}
}

// EscapePath escapes each segment of a slash-separated path for a URL,
// keeping the slashes.
func EscapePath(p string) string {
	segs := strings.Split(p, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return strings.Join(segs, "/")
}
