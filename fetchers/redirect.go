package fetchers

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// DropAuthAcrossOrigins is an http.Client CheckRedirect for sources that
// send a bearer token to their API and redirect downloads to another
// origin (the hf hub to its CDN, NGC to object storage): it follows at
// most 10 redirects and removes the Authorization header when a redirect
// leaves the first request's scheme and host, as the official clients do.
// Where a redirect may lead at all is the transport's Guard.
func DropAuthAcrossOrigins(req *http.Request, via []*http.Request) error {
	if len(via) >= 10 {
		return fmt.Errorf("stopped after 10 redirects (last to %s)", req.URL.Redacted())
	}
	first := via[0].URL
	if req.URL.Scheme != first.Scheme || req.URL.Host != first.Host {
		req.Header.Del("Authorization")
	}
	return nil
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
