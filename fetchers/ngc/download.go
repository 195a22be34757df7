package ngc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	nethttp "net/http"
	"net/url"

	"github.com/modelcache/modelcache/fetchers"
)

// maxURLs bounds the presigned URLs kept (a URL is asked for again when
// forgotten).
const maxURLs = 4096

// manifestResp is the URL manifest's answer: the spec's
// ArtifactDownloadResponse (filepath, url) or ArtifactDownloadAllResponse
// (filepath[], urls[]).
type manifestResp struct {
	URL      string          `json:"url"`
	URLs     []string        `json:"urls"`
	Filepath json.RawMessage `json:"filepath"`
}

// urlOf picks file p's URL out of m.
func (m manifestResp) urlOf(p string) string {
	if m.URL != "" {
		return m.URL
	}
	var paths []string
	if json.Unmarshal(m.Filepath, &paths) == nil && len(paths) == len(m.URLs) {
		for i, fp := range paths {
			if fp == p {
				return m.URLs[i]
			}
		}
	}
	return ""
}

// source is where one file's bytes are asked for: a presigned storage URL
// (no credentials at all), or the deprecated per-file API path (the
// bearer token, dropped on its redirect to storage).
type source struct {
	url       string
	presigned bool
}

// sourceOf returns where file p of r is read from: the presigned URL kept
// for loc, else a new one from the URL manifest, else (where the manifest
// is refused) the per-file path.
func (f *Fetcher) sourceOf(ctx context.Context, r Ref, p, loc string) (source, error) {
	guest := f.key == ""
	perFile := source{url: f.api + r.modelPath(guest) + "/versions/" + url.PathEscape(r.Version) + "/files/" + fetchers.EscapePath(p)}
	f.mu.Lock()
	u, known := f.urls[loc]
	refused := f.perFile[r.versionKey()]
	f.mu.Unlock()
	switch {
	case known:
		return source{url: u, presigned: true}, nil
	case refused:
		return perFile, nil
	}
	var m manifestResp
	err := f.apiGet(ctx, r, loc, "manifest", guest, &m)
	var se *statusError
	if errors.As(err, &se) {
		switch se.code {
		case nethttp.StatusUnauthorized, nethttp.StatusForbidden, nethttp.StatusNotFound, nethttp.StatusMethodNotAllowed, nethttp.StatusNotImplemented:
			f.mu.Lock()
			first := !f.perFile[r.versionKey()]
			f.perFile[r.versionKey()] = true
			f.mu.Unlock()
			if first {
				f.log.Warn("NGC refused the URL manifest; downloading this version through the deprecated per-file path", "source", r.String(), "status", se.code)
			}
			return perFile, nil
		}
	}
	if err != nil {
		return source{}, err
	}
	u = m.urlOf(p)
	pu, perr := url.Parse(u)
	if u == "" || perr != nil || (pu.Scheme != "https" && pu.Scheme != "http") || pu.Host == "" {
		return source{}, fetchers.Permanent(fmt.Errorf("%s: file %s: %w: the URL manifest holds no storage URL for it", r, p, fetchers.ErrInconsistent))
	}
	f.mu.Lock()
	if len(f.urls) >= maxURLs {
		clear(f.urls)
	}
	f.urls[loc] = u
	f.mu.Unlock()
	return source{url: u, presigned: true}, nil
}

// forgetURL drops the presigned URL kept for loc if it is still u.
func (f *Fetcher) forgetURL(loc, u string) {
	f.mu.Lock()
	if f.urls[loc] == u {
		delete(f.urls, loc)
	}
	f.mu.Unlock()
}

// Open streams a file from a presigned storage URL (the URL manifest's),
// from offset with Range, sending no credentials to storage. When storage
// refuses the URL (403, 400: it expired during the pull) a new one is
// asked for and the request made once more. Each request to the API asks
// for the token anew, so a long download refreshes it.
func (f *Fetcher) Open(ctx context.Context, file fetchers.File, offset int64) (io.ReadCloser, error) {
	r, p, err := f.refOf(file.Locator)
	if err != nil {
		return nil, err
	}
	apiURL, _ := url.Parse(f.api)
	get := func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
		for attempt := 0; ; attempt++ {
			src, err := f.sourceOf(ctx, r, p, file.Locator)
			if err != nil {
				return nil, err
			}
			if !src.presigned {
				return f.openPerFile(ctx, r, p, src.url, file.Size, off, n)
			}
			to, _ := url.Parse(src.url)
			gctx, err := f.opts.Guard.Handoff(ctx, apiURL, to)
			if err != nil {
				return nil, fmt.Errorf("%s: file %s: the URL manifest's storage URL: %w", r, p, err)
			}
			expired := false
			onErr := func(resp *nethttp.Response) error {
				switch resp.StatusCode {
				case nethttp.StatusForbidden, nethttp.StatusBadRequest:
					expired = true
					return fmt.Errorf("%s: file %s: storage refused its presigned URL (HTTP %d; it expired); a new one is asked of the URL manifest", r, p, resp.StatusCode)
				case nethttp.StatusNotFound:
					return fetchers.Permanent(fmt.Errorf("%s: %w: file %s is listed in the version but storage does not hold it (HTTP 404)", r, fetchers.ErrNotFound, p))
				}
				return nil
			}
			rc, err := f.get.GetRange(gctx, src.url, file.Size, off, n, nil, onErr)
			if expired {
				f.forgetURL(file.Locator, src.url)
				if attempt == 0 {
					continue
				}
			}
			return rc, err
		}
	}
	return fetchers.AdaptiveReader(ctx, f.opts.Ranged(get, file.Size, fetchers.RangeBackoff), offset)
}

// openPerFile reads bytes [off, off+n) of file p from the deprecated
// per-file path u, which redirects to storage (the token is dropped
// there).
func (f *Fetcher) openPerFile(ctx context.Context, r Ref, p, u string, size, off, n int64) (io.ReadCloser, error) {
	guest := f.key == ""
	apiErr := f.apiError(r, "file", p, guest)
	onErr := func(resp *nethttp.Response) error {
		if resp.StatusCode == nethttp.StatusUnauthorized && !guest && resp.Request != nil && resp.Request.URL.Host == hostOf(f.api) {
			// Resolve could read the version a moment ago: most likely the
			// token expired. A new one is fetched for the next attempt.
			f.forget(r)
			return fmt.Errorf("%s: file %s: the registry refused the bearer token (HTTP 401); retrying with a new one", r, p)
		}
		return apiErr(resp)
	}
	h := nethttp.Header{}
	if !guest {
		var err error
		if h, _, err = f.header(ctx, r, false); err != nil {
			return nil, err
		}
	}
	return f.get.GetRange(ctx, u, size, off, n, h, onErr)
}

func hostOf(u string) string {
	if p, err := url.Parse(u); err == nil {
		return p.Host
	}
	return ""
}
