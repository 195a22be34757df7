// Package ngc fetches models from the NVIDIA NGC model registry:
// ngc://<org>[/<team>]/<model>[:<version>]. A model version is the
// immutable revision (a missing version resolves to the model's latest
// version once; the pull then stays pinned to it); the file list comes
// from the version's paginated file listing; files stream from the
// per-file download URL, which redirects to object storage, with Range
// resume. A file whose listing carries a sha256 is verified by it before
// its bytes become a blob; otherwise its size is checked and its streamed
// sha256 recorded.
//
// Endpoints (NGC's public REST API; the paths and JSON fields are those
// of NGC's OpenAPI description as the stackql NVIDIA provider documents it
// (resources private_registry.models and model_versions: latestVersionIdStr,
// versionId, status, totalFileCount, storageVersion) and of NVIDIA's own
// public client ai-dynamo/modelexpress, modelexpress_common/src/providers/ngc.rs
// (the file listing, its pagination, the download path, the token exchange)):
//
//	GET {auth}/token?service=ngc&scope=group/ngc:<org>[&scope=group/ngc:<org>/<team>]
//	    Basic auth "$oauthtoken":<API key> → {"token": …, "expires_in": seconds}
//	    (the ngc CLI's and NVIDIA TAO's exchange; keys that start with
//	    "nvapi-", NGC's personal keys, are sent as the bearer token as they
//	    are, as modelexpress does)
//	GET {api}/v2/org/<org>[/team/<team>]/models/<model>
//	    → {"model": {"latestVersionIdStr": …}}            (only without :<version>)
//	GET {api}/v2/org/<org>[/team/<team>]/models/<model>/versions/<version>
//	    → {"modelVersion": {"versionId", "status", "totalFileCount", "storageVersion"}}
//	GET {api}/v2/org/<org>[/team/<team>]/models/<model>/versions/<version>/files?page-size=N&page-number=P
//	    → {"modelFiles": [{"path", "sizeInBytes", "sha256"?}], "paginationInfo": {"totalPages"}}
//	    page-number counts from 1, as modelexpress asks; the count of files
//	    listed must equal the version's totalFileCount, so a listing cut
//	    short (or a different page base) fails the pull instead of
//	    committing half a model.
//	GET {api}/v2/org/<org>[/team/<team>]/models/<model>/versions/<version>/files/<path>
//	    → 302 to object storage (another origin: the bearer token is
//	    dropped there, as the hf fetcher drops it for the hub's CDN)
//
// A public model needs no key. With a key, the bearer token is asked for
// once per org/team scope and refreshed a minute before it expires (or
// once, at once, when the API answers 401 to a cached one). The key and
// the tokens go only to the token endpoint and the API origin: never in a
// URL, an error, a log line or the index.
//
// Versions of storage "V1" (legacy artifacts listed as presigned URLs
// without sizes) are refused with a message that says so.
package ngc

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	nethttp "net/http"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcache/modelcache/fetchers"
	httpfetcher "github.com/modelcache/modelcache/fetchers/http"
)

// Defaults for the endpoints, overridden by $NGC_API_ENDPOINT and
// $NGC_AUTH_ENDPOINT (air-gapped mirrors, tests).
const (
	DefaultAPIEndpoint  = "https://api.ngc.nvidia.com"
	DefaultAuthEndpoint = "https://authn.nvidia.com"
)

// Limits on what the registry may send: they bound memory, not models.
const (
	maxAPIBody = 16 << 20 // one answer (a page of files)
	maxFiles   = 1 << 20
	maxPages   = 10000
	// refreshBefore is how long before its expiry a token is replaced.
	refreshBefore = time.Minute
	// defaultTTL is a token's lifetime when the endpoint does not say
	// (NGC's are about 15 minutes).
	defaultTTL = 10 * time.Minute
)

// Fetcher implements fetchers.Fetcher for ngc:// URIs. Safe for
// concurrent use.
type Fetcher struct {
	api, auth string
	key       string
	pageSize  int
	conns     int
	chunk     int64
	below     float64
	now       func() time.Time
	client    *nethttp.Client
	get       *httpfetcher.Fetcher

	mu     sync.Mutex
	tokens map[string]token // by scope query
}

type token struct {
	value   string
	expires time.Time
}

type options struct {
	api, auth   string
	key         string
	keyFile     string
	pageSize    int
	conns       int
	chunk       int64
	below       float64
	idleTimeout time.Duration
	transport   nethttp.RoundTripper
	guard       fetchers.Guard
	now         func() time.Time
}

// Option configures New.
type Option func(*options)

// WithAPIEndpoint sets the registry API; default $NGC_API_ENDPOINT, else
// DefaultAPIEndpoint.
func WithAPIEndpoint(u string) Option { return func(o *options) { o.api = u } }

// WithAuthEndpoint sets the token service; default $NGC_AUTH_ENDPOINT,
// else DefaultAuthEndpoint.
func WithAuthEndpoint(u string) Option { return func(o *options) { o.auth = u } }

// WithAPIKey sets the NGC API key; default $NGC_API_KEY, else
// $NGC_CLI_API_KEY (the ngc CLI's name), else the key file. Empty: public
// models only.
func WithAPIKey(k string) Option { return func(o *options) { o.key = k } }

// WithAPIKeyFile sets the file the key is read from when no key is given;
// default $NGC_API_KEY_FILE. A missing file means no key; an unreadable
// one (a directory, a FIFO, over 4 KiB) fails New.
func WithAPIKeyFile(p string) Option { return func(o *options) { o.keyFile = p } }

// WithPageSize sets how many files one listing page asks for; default 500.
func WithPageSize(n int) Option { return func(o *options) { o.pageSize = n } }

// WithIdleTimeout bounds a stalled download; default 60s.
func WithIdleTimeout(d time.Duration) Option { return func(o *options) { o.idleTimeout = d } }

// WithConnections sets how many connections may fetch one large file at
// once (files of at least 4 chunks); default 4. A file starts on one and
// gets Range requests only when that one is the limit
// (fetchers.AdaptiveReader).
func WithConnections(n int) Option { return func(o *options) { o.conns = n } }

// WithRangeBelow sets the rate (bytes per second spent waiting on one
// connection) under which a file gets Range connections; default
// fetchers.DefaultRangeBelow.
func WithRangeBelow(bps float64) Option { return func(o *options) { o.below = bps } }

// WithChunk sets the bytes of one parallel Range request; default 8 MiB.
func WithChunk(n int64) Option { return func(o *options) { o.chunk = n } }

// WithTransport sets the HTTP transport; default a clone of net/http's.
// Either way it is wrapped in the redirect policy (fetchers.Guard).
func WithTransport(t nethttp.RoundTripper) Option { return func(o *options) { o.transport = t } }

// WithInternal sets which addresses count as host-internal for the
// redirect policy (fetchers.Guard); default fetchers.IsInternal.
func WithInternal(internal func(netip.Addr) bool) Option {
	return func(o *options) { o.guard.Internal = internal }
}

// WithClock sets the clock that token expiry is judged by; default
// time.Now. Tests move it forward instead of sleeping.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// New returns an NGC fetcher. Errors name the setting, never the key.
func New(opts ...Option) (*Fetcher, error) {
	key := os.Getenv("NGC_API_KEY")
	if key == "" {
		key = os.Getenv("NGC_CLI_API_KEY")
	}
	o := options{api: os.Getenv("NGC_API_ENDPOINT"), auth: os.Getenv("NGC_AUTH_ENDPOINT"), key: key, keyFile: os.Getenv("NGC_API_KEY_FILE"),
		pageSize: 500, conns: 4, chunk: fetchers.DefaultChunk, idleTimeout: 60 * time.Second, now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	if o.api == "" {
		o.api = DefaultAPIEndpoint
	}
	if o.auth == "" {
		o.auth = DefaultAuthEndpoint
	}
	for name, v := range map[string]string{"NGC_API_ENDPOINT": o.api, "NGC_AUTH_ENDPOINT": o.auth} {
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			return nil, fmt.Errorf("%s %q: want http(s)://host[:port][/path]", name, fetchers.RedactURI(v))
		}
	}
	if o.key == "" && o.keyFile != "" {
		b, err := fetchers.ReadConfigFile(o.keyFile, 4<<10)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return nil, fmt.Errorf("NGC API key file: %w", err)
		default:
			o.key = strings.TrimSpace(string(b))
		}
	}
	if strings.ContainsAny(o.key, "\r\n\x00") {
		return nil, errors.New("NGC API key: holds a line break or a NUL; give the key alone")
	}
	if o.conns < 1 || o.conns > 64 || o.chunk < 1<<20 || o.pageSize < 1 {
		return nil, fmt.Errorf("ngc: connections %d (want 1..64), chunk %d (want >= 1 MiB), page size %d (want >= 1)", o.conns, o.chunk, o.pageSize)
	}
	if o.transport == nil {
		t := nethttp.DefaultTransport.(*nethttp.Transport).Clone()
		t.ResponseHeaderTimeout = 60 * time.Second
		t.MaxIdleConnsPerHost = 16
		o.transport = t
	}
	f := &Fetcher{api: strings.TrimRight(o.api, "/"), auth: strings.TrimRight(o.auth, "/"), key: o.key, pageSize: o.pageSize,
		conns: o.conns, chunk: o.chunk, below: o.below, now: o.now, tokens: map[string]token{}}
	f.client = &nethttp.Client{Transport: o.guard.Transport(o.transport, nil), CheckRedirect: fetchers.DropAuthAcrossOrigins}
	f.get = httpfetcher.New(httpfetcher.WithClient(f.client), httpfetcher.WithIdleTimeout(o.idleTimeout), httpfetcher.WithUserAgent("modelcached"))
	return f, nil
}

// Ref is a parsed ngc:// URI.
type Ref struct {
	Org, Team, Model string
	Version          string // "" asks for the latest version
}

// String is the URI of r.
func (r Ref) String() string {
	s := "ngc://" + r.Org + "/"
	if r.Team != "" {
		s += r.Team + "/"
	}
	s += r.Model
	if r.Version != "" {
		s += ":" + r.Version
	}
	return s
}

// path is r's model path under the API: /v2/org/<org>[/team/<team>]/models/<model>.
func (r Ref) path() string {
	p := "/v2/org/" + r.Org
	if r.Team != "" {
		p += "/team/" + r.Team
	}
	return p + "/models/" + r.Model
}

// scope is the token endpoint's query for r's org (and team).
func (r Ref) scope() string {
	q := url.Values{"service": {"ngc"}, "scope": {"group/ngc:" + r.Org}}
	if r.Team != "" {
		q.Add("scope", "group/ngc:"+r.Org+"/"+r.Team)
	}
	return q.Encode()
}

func (r Ref) scopeName() string {
	if r.Team != "" {
		return "group/ngc:" + r.Org + "/" + r.Team
	}
	return "group/ngc:" + r.Org
}

var (
	// nameRe is an org, team or model name as NGC writes them.
	nameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	// versionRe is a version the store can name a revision with.
	versionRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	hexRe     = regexp.MustCompile(`^[0-9a-fA-F]{64}$`)
)

// ParseURI splits ngc://<org>[/<team>]/<model>[:<version>].
func ParseURI(uri string) (Ref, error) {
	bad := func(why string) (Ref, error) {
		return Ref{}, fmt.Errorf("source %q: %w: %s; write ngc://<org>[/<team>]/<model>[:<version>]", uri, fetchers.ErrBadSource, why)
	}
	rest, ok := strings.CutPrefix(uri, "ngc://")
	if !ok {
		return bad("not an ngc:// URI")
	}
	var r Ref
	if i := strings.LastIndexByte(rest, ':'); i >= 0 {
		rest, r.Version = rest[:i], rest[i+1:]
		if r.Version == "" {
			return bad("empty version after ':'")
		}
		if !versionRe.MatchString(r.Version) || strings.Contains(r.Version, "..") {
			return bad(fmt.Sprintf("version %q: use letters, digits, '.', '_' and '-' (the version names the revision on disk)", r.Version))
		}
	}
	segs := strings.Split(rest, "/")
	switch len(segs) {
	case 2:
		r.Org, r.Model = segs[0], segs[1]
	case 3:
		r.Org, r.Team, r.Model = segs[0], segs[1], segs[2]
	default:
		return bad(fmt.Sprintf("%d path segments", len(segs)))
	}
	for _, s := range segs {
		if !nameRe.MatchString(s) || strings.Contains(s, "..") {
			return bad(fmt.Sprintf("name %q", s))
		}
	}
	return r, nil
}

// tokenFor returns the bearer token for r's scope ("" without a key) and
// whether it was fetched just now. force asks for a new one.
func (f *Fetcher) tokenFor(ctx context.Context, r Ref, force bool) (string, bool, error) {
	if f.key == "" {
		return "", false, nil
	}
	if strings.HasPrefix(f.key, "nvapi-") {
		return f.key, false, nil
	}
	scope := r.scope()
	f.mu.Lock()
	t, ok := f.tokens[scope]
	f.mu.Unlock()
	if ok && !force && f.now().Before(t.expires.Add(-refreshBefore)) {
		return t.value, false, nil
	}
	req, err := nethttp.NewRequestWithContext(ctx, nethttp.MethodGet, f.auth+"/token?"+scope, nil)
	if err != nil {
		return "", false, fetchers.Permanent(err)
	}
	req.SetBasicAuth("$oauthtoken", f.key)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "modelcached")
	resp, err := f.client.Do(req)
	if err != nil {
		return "", false, fmt.Errorf("NGC token endpoint %s: %w", f.auth, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case nethttp.StatusOK:
	case nethttp.StatusUnauthorized:
		return "", false, fetchers.Permanent(fmt.Errorf("%s: %w: the NGC token endpoint rejected NGC_API_KEY (HTTP 401): the key is wrong, revoked or expired; make a new one (ngc.nvidia.com, Setup, API Key) and give it in NGC_API_KEY, NGC_API_KEY_FILE or the Secret's NGC_API_KEY", r, fetchers.ErrUnauthorized))
	case nethttp.StatusForbidden:
		return "", false, fetchers.Permanent(fmt.Errorf("%s: %w: the NGC token endpoint refused scope %s to NGC_API_KEY (HTTP 403): the key's user is not a member of org %q%s; ask the org's admin, or use a key of that org", r, fetchers.ErrUnauthorized, r.scopeName(), r.Org, teamClause(r)))
	default:
		return "", false, httpfetcher.StatusError("NGC token endpoint "+f.auth, resp)
	}
	var body struct {
		Token     string `json:"token"`
		ExpiresIn int64  `json:"expires_in"`
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", false, fmt.Errorf("NGC token endpoint %s: %w", f.auth, err)
	}
	if err := json.Unmarshal(b, &body); err != nil || body.Token == "" || strings.ContainsAny(body.Token, "\r\n") {
		return "", false, fetchers.Permanent(fmt.Errorf("NGC token endpoint %s: the answer holds no token", f.auth))
	}
	ttl := defaultTTL
	if body.ExpiresIn > 0 {
		ttl = time.Duration(body.ExpiresIn) * time.Second
	}
	f.mu.Lock()
	f.tokens[scope] = token{value: body.Token, expires: f.now().Add(ttl)}
	f.mu.Unlock()
	return body.Token, true, nil
}

// forget drops a cached token that the API refused.
func (f *Fetcher) forget(r Ref) {
	f.mu.Lock()
	delete(f.tokens, r.scope())
	f.mu.Unlock()
}

func teamClause(r Ref) string {
	if r.Team == "" {
		return ""
	}
	return fmt.Sprintf(" (team %q)", r.Team)
}

// header is the Authorization of a request for r.
func (f *Fetcher) header(ctx context.Context, r Ref, force bool) (nethttp.Header, bool, error) {
	tok, fresh, err := f.tokenFor(ctx, r, force)
	if err != nil {
		return nil, false, err
	}
	h := nethttp.Header{}
	if tok != "" {
		h.Set("Authorization", "Bearer "+tok)
	}
	return h, fresh, nil
}

// apiError explains the registry's error answers; what is "model",
// "version", "files" (the listing) or "file" (a download of file).
func (f *Fetcher) apiError(r Ref, what, file string) func(*nethttp.Response) error {
	return func(resp *nethttp.Response) error {
		switch resp.StatusCode {
		case nethttp.StatusUnauthorized, nethttp.StatusForbidden:
			if f.key == "" {
				return fetchers.Permanent(fmt.Errorf("%s: %w (HTTP %d): the model is not public; no NGC API key is set: give one with access to org %q%s in NGC_API_KEY, NGC_API_KEY_FILE, the ModelCache Secret's NGC_API_KEY or a models.d credentialsFile",
					r, fetchers.ErrUnauthorized, resp.StatusCode, r.Org, teamClause(r)))
			}
			return fetchers.Permanent(fmt.Errorf("%s: %w (HTTP %d): NGC_API_KEY has no read access to this model under scope %s; the key's user needs the registry read role in org %q%s",
				r, fetchers.ErrUnauthorized, resp.StatusCode, r.scopeName(), r.Org, teamClause(r)))
		case nethttp.StatusNotFound:
			switch what {
			case "model":
				return fetchers.Permanent(fmt.Errorf("%s: %w: NGC has no model %s in org %q%s (HTTP 404); check the names (a private model may also answer 404 to a key without access)", r, fetchers.ErrNotFound, r.Model, r.Org, teamClause(r)))
			case "version", "files":
				return fetchers.Permanent(fmt.Errorf("%s: %w: NGC has no version %q of this model (HTTP 404), or no such model; list its versions with `ngc registry model list %s`", r, fetchers.ErrNotFound, r.Version, strings.TrimPrefix(Ref{Org: r.Org, Team: r.Team, Model: r.Model + ":*"}.String(), "ngc://")))
			}
			return fetchers.Permanent(fmt.Errorf("%s: %w: file %s is listed in the version but NGC does not serve it (HTTP 404)", r, fetchers.ErrNotFound, file))
		case nethttp.StatusTooManyRequests:
			return fmt.Errorf("%s: NGC rate limit: %w", r, httpfetcher.StatusError(r.String(), resp))
		}
		return nil
	}
}

// apiGet GETs an API URL as r's scope and decodes its JSON into v. A 401
// to a cached token fetches a new one and asks once more.
func (f *Fetcher) apiGet(ctx context.Context, r Ref, u, what string, v any) error {
	for attempt := 0; ; attempt++ {
		h, fresh, err := f.header(ctx, r, attempt > 0)
		if err != nil {
			return err
		}
		req, err := nethttp.NewRequestWithContext(ctx, nethttp.MethodGet, u, nil)
		if err != nil {
			return fetchers.Permanent(err)
		}
		req.Header = h
		req.Header.Set("Accept", "application/json")
		req.Header.Set("User-Agent", "modelcached")
		resp, err := f.client.Do(req)
		if err != nil {
			return fmt.Errorf("GET %s: %w", u, err)
		}
		if resp.StatusCode == nethttp.StatusUnauthorized && h.Get("Authorization") != "" && !fresh && attempt == 0 {
			resp.Body.Close()
			continue // the token expired early or was revoked: one more try with a new one
		}
		defer resp.Body.Close()
		if resp.StatusCode != nethttp.StatusOK {
			if err := f.apiError(r, what, "")(resp); err != nil {
				return err
			}
			return httpfetcher.StatusError(u, resp)
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxAPIBody+1))
		if err != nil {
			return fmt.Errorf("GET %s: %w", u, err)
		}
		if len(body) > maxAPIBody {
			return fetchers.Permanent(fmt.Errorf("GET %s: answer larger than %d bytes; refusing it", u, maxAPIBody))
		}
		if err := json.Unmarshal(body, v); err != nil {
			return fetchers.Permanent(fmt.Errorf("GET %s: the %s answer is not what NGC sends: %v", u, what, err))
		}
		return nil
	}
}

type versionResp struct {
	ModelVersion struct {
		VersionID      string `json:"versionId"`
		Status         string `json:"status"`
		TotalFileCount int64  `json:"totalFileCount"`
		StorageVersion string `json:"storageVersion"`
	} `json:"modelVersion"`
}

type filesResp struct {
	ModelFiles []struct {
		Path        string `json:"path"`
		SizeInBytes int64  `json:"sizeInBytes"`
		SHA256      string `json:"sha256"`
	} `json:"modelFiles"`
	PaginationInfo struct {
		TotalPages int `json:"totalPages"`
	} `json:"paginationInfo"`
	// Legacy (V1) listings: presigned URLs, no sizes.
	Filepath []string `json:"filepath"`
}

// Resolve pins the version (the latest one when the URI names none) and
// lists its files.
func (f *Fetcher) Resolve(ctx context.Context, src fetchers.Source) (*fetchers.Resolved, error) {
	r, err := ParseURI(src.URI)
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	base := f.api + r.path()
	if r.Version == "" {
		var m struct {
			Model struct {
				LatestVersionIDStr string `json:"latestVersionIdStr"`
			} `json:"model"`
		}
		if err := f.apiGet(ctx, r, base, "model", &m); err != nil {
			return nil, err
		}
		v := m.Model.LatestVersionIDStr
		switch {
		case v == "":
			return nil, fetchers.Permanent(fmt.Errorf("%s: %w: the model has no versions", r, fetchers.ErrNotFound))
		case !versionRe.MatchString(v) || strings.Contains(v, ".."):
			return nil, fetchers.Permanent(fmt.Errorf("%s: the latest version is %q, which the store cannot name a revision with (letters, digits, '.', '_', '-'); pin another version with :<version>", r, v))
		}
		r.Version = v
	}
	vbase := base + "/versions/" + url.PathEscape(r.Version)
	var ver versionResp
	if err := f.apiGet(ctx, r, vbase, "version", &ver); err != nil {
		return nil, err
	}
	mv := ver.ModelVersion
	if mv.Status != "" && mv.Status != "UPLOAD_COMPLETE" {
		return nil, fmt.Errorf("%s: the version's upload is not complete (status %s); it is retried", r, mv.Status)
	}
	if mv.StorageVersion == "V1" {
		return nil, fetchers.Permanent(fmt.Errorf("%s: %w: the version is stored in NGC's legacy V1 format (presigned URLs without sizes), which this daemon does not fetch", r, fetchers.ErrUnsupported))
	}
	var files []fetchers.File
	seen := map[string]bool{}
	for page := 1; ; page++ {
		if page > maxPages {
			return nil, fetchers.Permanent(fmt.Errorf("%s: more than %d pages of files; refusing", r, maxPages))
		}
		u := vbase + "/files?page-size=" + strconv.Itoa(f.pageSize) + "&page-number=" + strconv.Itoa(page)
		var fr filesResp
		if err := f.apiGet(ctx, r, u, "files", &fr); err != nil {
			return nil, err
		}
		if len(fr.ModelFiles) == 0 && len(fr.Filepath) > 0 {
			return nil, fetchers.Permanent(fmt.Errorf("%s: %w: NGC lists this version in its legacy V1 format (presigned URLs without sizes), which this daemon does not fetch", r, fetchers.ErrUnsupported))
		}
		for _, e := range fr.ModelFiles {
			if seen[e.Path] {
				return nil, fetchers.Permanent(fmt.Errorf("%s: file %q listed twice (the listing's pages overlap)", r, e.Path))
			}
			seen[e.Path] = true
			if e.SizeInBytes < 0 {
				return nil, fetchers.Permanent(fmt.Errorf("%s: file %q: negative size %d", r, e.Path, e.SizeInBytes))
			}
			fl := fetchers.File{Path: e.Path, Size: e.SizeInBytes, Mode: 0o644, Locator: vbase + "/files/" + fetchers.EscapePath(e.Path)}
			if e.SHA256 != "" {
				hx, err := sha256Hex(e.SHA256)
				if err != nil {
					return nil, fetchers.Permanent(fmt.Errorf("%s: file %q: %v", r, e.Path, err))
				}
				fl.Digest, fl.Etag = "sha256:"+hx, hx
			}
			files = append(files, fl)
			if len(files) > maxFiles {
				return nil, fetchers.Permanent(fmt.Errorf("%s: more than %d files; refusing", r, maxFiles))
			}
		}
		if page >= fr.PaginationInfo.TotalPages || len(fr.ModelFiles) == 0 {
			break
		}
	}
	if len(files) == 0 {
		return nil, fetchers.Permanent(fmt.Errorf("%s: %w: the version has no files", r, fetchers.ErrNotFound))
	}
	if mv.TotalFileCount > 0 && int64(len(files)) != mv.TotalFileCount {
		return nil, fetchers.Permanent(fmt.Errorf("%s: the file listing holds %d files but the version says %d; refusing a partial model", r, len(files), mv.TotalFileCount))
	}
	return &fetchers.Resolved{URI: src.URI, Revision: r.Version, Files: files}, nil
}

// sha256Hex reads a listing's sha256: 64 hex digits or the base64 of 32
// bytes.
func sha256Hex(s string) (string, error) {
	if hexRe.MatchString(s) {
		return strings.ToLower(s), nil
	}
	if b, err := base64.StdEncoding.DecodeString(s); err == nil && len(b) == 32 {
		return hex.EncodeToString(b), nil
	}
	return "", fmt.Errorf("sha256 %q is neither 64 hex digits nor the base64 of 32 bytes", s)
}

// refOf reads the Ref back from a file's Locator (made by Resolve).
func (f *Fetcher) refOf(loc string) (Ref, string, error) {
	rest, ok := strings.CutPrefix(loc, f.api+"/v2/org/")
	if !ok {
		return Ref{}, "", fetchers.Permanent(fmt.Errorf("ngc: locator %q is not on %s", fetchers.RedactURI(loc), f.api))
	}
	var r Ref
	var err error
	segs := strings.SplitN(rest, "/", 9)
	unesc := func(s string) string {
		if err == nil {
			s, err = url.PathUnescape(s)
		}
		return s
	}
	switch {
	case len(segs) >= 9 && segs[1] == "team" && segs[3] == "models" && segs[5] == "versions" && segs[7] == "files":
		r = Ref{Org: segs[0], Team: segs[2], Model: segs[4], Version: unesc(segs[6])}
		return r, unesc(segs[8]), err
	case len(segs) >= 7 && segs[1] == "models" && segs[3] == "versions":
		tail := strings.SplitN(strings.Join(segs[4:], "/"), "/", 3) // version, "files", path
		if len(tail) == 3 && tail[1] == "files" {
			r = Ref{Org: segs[0], Model: segs[2], Version: unesc(tail[0])}
			return r, unesc(tail[2]), err
		}
	}
	return Ref{}, "", fetchers.Permanent(fmt.Errorf("ngc: locator %q is not a file download path", fetchers.RedactURI(loc)))
}

// Open streams a file from its download URL, following the redirect to
// storage (without the token). Each request asks for the token anew, so
// a long download refreshes it.
func (f *Fetcher) Open(ctx context.Context, file fetchers.File, offset int64) (io.ReadCloser, error) {
	r, p, err := f.refOf(file.Locator)
	if err != nil {
		return nil, err
	}
	apiErr := f.apiError(r, "file", p)
	onErr := func(resp *nethttp.Response) error {
		if resp.StatusCode == nethttp.StatusUnauthorized && f.key != "" && resp.Request != nil && resp.Request.URL.Host == hostOf(f.api) {
			// Resolve could read the version a moment ago: most likely the
			// token expired. A new one is fetched for the next attempt.
			f.forget(r)
			return fmt.Errorf("%s: file %s: the registry refused the bearer token (HTTP 401); retrying with a new one", r, p)
		}
		return apiErr(resp)
	}
	get := func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
		h, _, err := f.header(ctx, r, false)
		if err != nil {
			return nil, err
		}
		if n < 0 {
			return f.get.Get(ctx, file.Locator, file.Size, off, h, onErr)
		}
		return f.get.GetRange(ctx, file.Locator, file.Size, off, n, h, onErr)
	}
	return fetchers.AdaptiveReader(ctx, fetchers.Ranged{Open: get, Size: file.Size, Chunk: f.chunk, Conns: f.conns, Below: f.below,
		Backoff: fetchers.Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second, Attempts: 4, MaxRetryAfter: time.Minute}}, offset)
}

func hostOf(u string) string {
	if p, err := url.Parse(u); err == nil {
		return p.Host
	}
	return ""
}
