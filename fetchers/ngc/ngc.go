// Package ngc fetches models from the NVIDIA NGC model registry:
// ngc://<org>[/<team>]/<model>[:<version>]. A model version is the
// immutable revision (a missing version resolves to the model's latest
// version once; the pull then stays pinned to it); the file list comes
// from the version's paginated file listing; files stream from presigned
// storage URLs that the URL manifest hands out, with Range resume. A file
// whose listing carries a sha256 (sha256_base64) is verified by it before
// its bytes become a blob; otherwise only its size is checked (and said
// so in the log, per file) and its streamed sha256 recorded.
//
// What the adapter follows. NGC's published API description (the OpenAPI
// document of api.ngc.nvidia.com, as harvested in
// stackql-registry/stackql-provider-nvidia,
// provider-dev/downloaded/cleaned/ngc_models.json: "spec" below) and
// NVIDIA's own client (the ngc CLI, python package ngcbase: "ngcbase"):
//
//	GET {auth}/token?service=ngc&scope=group/ngc:<org>[&scope=group/ngc:<org>/<team>]
//	    Basic "$oauthtoken":<API key> → {"token", "expires_in"}   (ngcbase, modelexpress;
//	    "nvapi-" personal keys are sent as the bearer as they are, as modelexpress does)
//	without a key, the guest paths (ngcbase GuestModelAPI):
//	GET {api}/v2/models/<org>[/<team>]/<model>                      spec ModelResponse
//	GET {api}/v2/models/<org>[/<team>]/<model>/versions/<v>         spec ModelVersionResponse
//	GET {api}/v2/models/<org>[/<team>]/<model>/versions/<v>/files   spec ModelVersionFileListResponse
//	with a key, the same under {api}/v2/org/<org>[/team/<team>]/models/<model>
//	(spec getModelVersionInOrg, listModeFilesInOrg), with the bearer token.
//	    The listing's page-number is "zero based" (spec), page-size 1..5000
//	    (spec; a request without it gets 100, as issue 31 quotes ngcbase);
//	    we name WithPageSize (500) and read from page 0 until
//	    paginationInfo.totalPages. ModelFile is
//	    {path, sizeInBytes, sha256_base64 "Base64 encoded sha256 hash of
//	    the artifact file"}; ModelVersion is {versionId, status
//	    UPLOAD_PENDING|UPLOAD_COMPLETE, storageVersion V1|V2|"",
//	    totalFileCount}. The count of files listed must equal
//	    totalFileCount (fetchers.ErrInconsistent otherwise: a listing cut
//	    short fails the pull instead of committing part of a model).
//	GET {api}/v2/org/<org>[/team/<team>]/models/<model>/<v>/files?path=<file>
//	    the URL manifest (ngcbase ModelAPI.get_direct_download_URL; spec
//	    ArtifactDownloadResponse {filepath, url}, or
//	    ArtifactDownloadAllResponse {filepath[], urls[]} without ?path):
//	    a presigned storage URL, fetched with no Authorization at all and
//	    Range for resume; when storage refuses it (403, 400: it expired)
//	    it is asked for again.
//	GET {api}/…/versions/<v>/files/<path>   (deprecated in the spec) → 302 to storage:
//	    used only where the URL manifest is refused (401, 403, 404, 405,
//	    501), which is logged once per version; the token is dropped on
//	    the redirect (fetchers.DropAuthAcrossOrigins).
//
// With a key, the bearer token is asked for once per org/team scope and
// refreshed a minute before it expires (or once, at once, when the API
// answers 401 to a cached one). The key and the tokens go only to the
// token endpoint and the API origin: never to storage, in a URL, an
// error, a log line or the index. A presigned URL is held to the
// redirect policy (fetchers.Guard.Handoff).
//
// Assumed, stated by no document we have (check these first against the
// real service):
//   - A guest (no key) may read a public model's URL manifest on its org
//     path: ngcbase's guest mode builds the same URL, but the spec does not
//     say it answers without a token. Where it does not, the deprecated
//     per-file guest path is used (and logged).
//   - A private model answers a guest path with 401, 403 or 404; all
//     three are explained as "private, or no such model: set
//     NGC_API_KEY".
//   - With ?path=, the manifest answers one object with "url" (or
//     "urls"/"filepath" arrays holding the file); the spec names both
//     shapes but not which the endpoint returns when.
//   - A presigned URL that expired is refused by storage with 403 or 400
//     (S3's and GCS's answers); storage never wants our token.
//   - A legacy V1 listing holds filepath[] (with urls[]) instead of
//     modelFiles, without sizes or checksums (ai-dynamo/modelexpress
//     reads it so); its files are fetched through the URL manifest like
//     V2 ones, their size unknown until streamed.
//   - 412 on a version, its listing or its manifest means a licence to
//     accept in the NGC UI (the spec lists no 412; issue 31 reports it);
//     400 whose body holds "org contex(t) missing" means the token lacks
//     the org (modelexpress's comment on UAM-gated orgs such as nim).
//   - "no-team" in a URI is the ngc CLI's spelling of "no team".
//   - A key's token is asked for the model's own org scope, and the org
//     paths of a public model answer any valid token. If the token service
//     instead refuses a key of another org the public model's scope (403),
//     the pull fails naming the scope: pull such a model without a key.
//   - The page-number listing is stable while it is read (the spec also
//     offers page-reference, a cursor, which ngcbase now uses; a listing
//     that shifts between pages fails the count check, not silently).
package ngc

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	nethttp "net/http"
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
	opts      fetchers.HTTPOptions
	now       func() time.Time
	client    *nethttp.Client
	get       *httpfetcher.Fetcher
	log       *slog.Logger

	mu     sync.Mutex
	tokens map[string]token  // by scope query
	urls   map[string]string // presigned URL by Locator, until storage refuses it
	// perFile holds the versions ("org[/team]/model:version") whose URL
	// manifest was refused: their files come from the deprecated per-file path.
	perFile map[string]bool
}

// maxURLs bounds the presigned URLs kept (a URL is asked for again when
// forgotten).
const maxURLs = 4096

type token struct {
	value   string
	expires time.Time
}

type options struct {
	fetchers.HTTPOptions
	api, auth string
	key       string
	keyFile   string
	pageSize  int
	now       func() time.Time
	log       *slog.Logger
}

// Option configures New.
type Option func(*options)

// WithHTTP sets the shared HTTP options (fetchers.Option): transport,
// redirect policy, idle timeout, User-Agent, and the Range connections of
// one large file (fetchers.WithConnections; default 4).
func WithHTTP(opts ...fetchers.Option) Option { return func(o *options) { o.Apply(opts...) } }

// WithAPIEndpoint sets the registry API; default $NGC_API_ENDPOINT, else
// DefaultAPIEndpoint.
func WithAPIEndpoint(u string) Option { return func(o *options) { o.api = u } }

// WithAuthEndpoint sets the token service; default $NGC_AUTH_ENDPOINT,
// else DefaultAuthEndpoint.
func WithAuthEndpoint(u string) Option { return func(o *options) { o.auth = u } }

// WithAPIKey sets the NGC API key; default $NGC_CLI_API_KEY (the ngc
// CLI's name, which the CLI prefers), else $NGC_API_KEY, else the key
// file. Empty: public models only, through NGC's guest paths.
func WithAPIKey(k string) Option { return func(o *options) { o.key = k } }

// WithAPIKeyFile sets the file the key is read from when no key is given;
// default $NGC_API_KEY_FILE. A missing file means no key; an unreadable
// one (a directory, a FIFO, over 4 KiB) fails New.
func WithAPIKeyFile(p string) Option { return func(o *options) { o.keyFile = p } }

// WithPageSize sets how many files one listing page asks for (page-size;
// NGC allows 1..5000 and answers 100 to a request that names none);
// default 500.
func WithPageSize(n int) Option { return func(o *options) { o.pageSize = n } }

// WithClock sets the clock that token expiry is judged by; default
// time.Now. Tests move it forward instead of sleeping.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithLogger sets the logger that says which files are checked by size
// only and when the URL manifest is refused; default nil, silent.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// New returns an NGC fetcher. Errors name the setting, never the key.
func New(opts ...Option) (*Fetcher, error) {
	key := os.Getenv("NGC_CLI_API_KEY")
	if key == "" {
		key = os.Getenv("NGC_API_KEY")
	}
	o := options{api: os.Getenv("NGC_API_ENDPOINT"), auth: os.Getenv("NGC_AUTH_ENDPOINT"), key: key, keyFile: os.Getenv("NGC_API_KEY_FILE"),
		pageSize: 500, HTTPOptions: fetchers.DefaultHTTPOptions(), now: time.Now}
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
	if err := o.CheckRanges(); err != nil {
		return nil, fmt.Errorf("ngc: %w", err)
	}
	if o.pageSize < 1 || o.pageSize > 5000 {
		return nil, fmt.Errorf("ngc: page size %d (want 1..5000)", o.pageSize)
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	f := &Fetcher{api: strings.TrimRight(o.api, "/"), auth: strings.TrimRight(o.auth, "/"), key: o.key, pageSize: o.pageSize,
		opts: o.HTTPOptions, now: o.now, tokens: map[string]token{}, log: o.log,
		urls: map[string]string{}, perFile: map[string]bool{}, client: o.Client()}
	f.get = httpfetcher.New(httpfetcher.WithClient(f.client), httpfetcher.WithHTTP(fetchers.WithIdleTimeout(o.IdleTimeout), fetchers.WithUserAgent(o.UserAgent)))
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

// orgPath is r's org (and team) under the API: /v2/org/<org>[/team/<team>].
func (r Ref) orgPath() string {
	p := "/v2/org/" + r.Org
	if r.Team != "" {
		p += "/team/" + r.Team
	}
	return p
}

// modelPath is r's model under the API: the guest path
// /v2/models/<org>[/<team>]/<model>, or the org path
// /v2/org/<org>[/team/<team>]/models/<model>.
func (r Ref) modelPath(guest bool) string {
	if !guest {
		return r.orgPath() + "/models/" + r.Model
	}
	p := "/v2/models/" + r.Org
	if r.Team != "" {
		p += "/" + r.Team
	}
	return p + "/" + r.Model
}

// manifestPath is r's URL manifest: /v2/org/<org>[/team/<team>]/models/<model>/<version>/files.
func (r Ref) manifestPath() string {
	return r.orgPath() + "/models/" + r.Model + "/" + url.PathEscape(r.Version) + "/files"
}

// versionKey names r's version in the fetcher's maps.
func (r Ref) versionKey() string { return r.Org + "/" + r.Team + "/" + r.Model + ":" + r.Version }

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
		if r.Team == "no-team" { // the ngc CLI's spelling of "no team"
			r.Team = ""
		}
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
	req.Header.Set("User-Agent", f.opts.UserAgent)
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
// "version", "files" (the listing), "manifest" or "file" (a download of
// file). guest says the request carried no token.
func (f *Fetcher) apiError(r Ref, what, file string, guest bool) func(*nethttp.Response) error {
	return func(resp *nethttp.Response) error {
		switch resp.StatusCode {
		case nethttp.StatusUnauthorized, nethttp.StatusForbidden:
			if guest {
				return fetchers.Permanent(fmt.Errorf("%s: %w (HTTP %d): the model is not public; no NGC API key is set: give one with access to org %q%s in NGC_API_KEY (or NGC_CLI_API_KEY), NGC_API_KEY_FILE, the ModelCache Secret's NGC_API_KEY or a models.d credentialsFile",
					r, fetchers.ErrUnauthorized, resp.StatusCode, r.Org, teamClause(r)))
			}
			return fetchers.Permanent(fmt.Errorf("%s: %w (HTTP %d): NGC_API_KEY has no read access to this model under scope %s; the key's user needs the registry read role in org %q%s",
				r, fetchers.ErrUnauthorized, resp.StatusCode, r.scopeName(), r.Org, teamClause(r)))
		case nethttp.StatusPreconditionFailed:
			return fetchers.Permanent(fmt.Errorf("%s: %w (HTTP 412): the model's licence must be accepted before it can be downloaded: sign in to ngc.nvidia.com as the key's user, open the model and accept its licence terms, then pull again", r, fetchers.ErrUnauthorized))
		case nethttp.StatusBadRequest:
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			if low := strings.ToLower(string(b)); strings.Contains(low, "org contex") {
				who := "NGC_API_KEY's token"
				if guest {
					who = "a request without NGC_API_KEY"
				}
				return fetchers.Permanent(fmt.Errorf("%s: %w (HTTP 400, \"org context missing\"): NGC serves this %s only to a token of org %q, and %s carries none; give a key of that org in NGC_API_KEY", r, fetchers.ErrUnauthorized, what, r.Org, who))
			}
		case nethttp.StatusNotFound:
			private := ""
			if guest {
				private = fmt.Sprintf("; a private model answers so without a key: give one with access to org %q in NGC_API_KEY", r.Org)
			}
			switch what {
			case "model":
				return fetchers.Permanent(fmt.Errorf("%s: %w: NGC has no model %s in org %q%s (HTTP 404); check the names (a private model may also answer 404 to a key without access)%s", r, fetchers.ErrNotFound, r.Model, r.Org, teamClause(r), private))
			case "version", "files":
				return fetchers.Permanent(fmt.Errorf("%s: %w: NGC has no version %q of this model (HTTP 404), or no such model; list its versions with `ngc registry model list %s`%s", r, fetchers.ErrNotFound, r.Version, strings.TrimPrefix(Ref{Org: r.Org, Team: r.Team, Model: r.Model + ":*"}.String(), "ngc://"), private))
			}
			return fetchers.Permanent(fmt.Errorf("%s: %w: file %s is listed in the version but NGC does not serve it (HTTP 404)", r, fetchers.ErrNotFound, file))
		case nethttp.StatusTooManyRequests:
			return fmt.Errorf("%s: NGC rate limit: %w", r, httpfetcher.StatusError(r.String(), resp))
		}
		return nil
	}
}

// statusError is an API answer other than 200, as apiError explains it.
type statusError struct {
	code int
	err  error
}

func (e *statusError) Error() string { return e.err.Error() }
func (e *statusError) Unwrap() error { return e.err }

// apiGet GETs an API URL, with r's token unless guest, and decodes its
// JSON into v. A 401 to a cached token fetches a new one and asks once
// more. An error status comes back as a *statusError.
func (f *Fetcher) apiGet(ctx context.Context, r Ref, u, what string, guest bool, v any) error {
	for attempt := 0; ; attempt++ {
		h := nethttp.Header{}
		fresh := false
		if !guest {
			var err error
			if h, fresh, err = f.header(ctx, r, attempt > 0); err != nil {
				return err
			}
		}
		req, err := nethttp.NewRequestWithContext(ctx, nethttp.MethodGet, u, nil)
		if err != nil {
			return fetchers.Permanent(err)
		}
		req.Header = h
		req.Header.Set("Accept", "application/json")
		req.Header.Set("User-Agent", f.opts.UserAgent)
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
			err := f.apiError(r, what, "", guest)(resp)
			if err == nil {
				err = httpfetcher.StatusError(u, resp)
			}
			return &statusError{code: resp.StatusCode, err: err}
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

// versionResp is the spec's ModelVersionResponse.
type versionResp struct {
	ModelVersion struct {
		VersionID      string `json:"versionId"`
		Status         string `json:"status"`
		TotalFileCount int64  `json:"totalFileCount"`
		StorageVersion string `json:"storageVersion"`
	} `json:"modelVersion"`
}

// filesResp is the spec's ModelVersionFileListResponse; a legacy (V1)
// listing holds filepath[] (presigned urls[] beside it) in place of
// modelFiles.
type filesResp struct {
	ModelFiles []struct {
		Path         string `json:"path"`
		SizeInBytes  int64  `json:"sizeInBytes"`
		SHA256Base64 string `json:"sha256_base64"`
	} `json:"modelFiles"`
	PaginationInfo struct {
		TotalPages int `json:"totalPages"`
	} `json:"paginationInfo"`
	Filepath []string `json:"filepath"`
}

// Resolve pins the version (the latest one when the URI names none) and
// lists its files: through the guest paths without a key, the org paths
// with one.
func (f *Fetcher) Resolve(ctx context.Context, src fetchers.Source) (*fetchers.Resolved, error) {
	r, err := ParseURI(src.URI)
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	guest := f.key == ""
	base := f.api + r.modelPath(guest)
	if r.Version == "" {
		var m struct {
			Model struct {
				LatestVersionIDStr string `json:"latestVersionIdStr"`
			} `json:"model"`
		}
		if err := f.apiGet(ctx, r, base, "model", guest, &m); err != nil {
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
	if err := f.apiGet(ctx, r, vbase, "version", guest, &ver); err != nil {
		return nil, err
	}
	mv := ver.ModelVersion
	if mv.Status != "" && mv.Status != "UPLOAD_COMPLETE" {
		return nil, fmt.Errorf("%s: the version's upload is not complete (status %s); it is retried", r, mv.Status)
	}
	manifest := f.api + r.manifestPath()
	var files []fetchers.File
	seen := map[string]bool{}
	add := func(p string, size int64, sum string) error {
		if seen[p] {
			return fetchers.Permanent(fmt.Errorf("%s: %w: file %q listed twice (the listing's pages overlap)", r, fetchers.ErrInconsistent, p))
		}
		seen[p] = true
		if size < -1 {
			return fetchers.Permanent(fmt.Errorf("%s: %w: file %q: negative size %d", r, fetchers.ErrInconsistent, p, size))
		}
		fl := fetchers.File{Path: p, Size: size, Mode: 0o644, Locator: manifest + "?" + url.Values{"path": {p}}.Encode()}
		if sum != "" {
			b, err := base64.StdEncoding.DecodeString(sum)
			if err != nil || len(b) != sha256.Size {
				return fetchers.Permanent(fmt.Errorf("%s: %w: file %q: sha256_base64 %q is not the base64 of 32 bytes", r, fetchers.ErrInconsistent, p, sum))
			}
			fl.Etag = hex.EncodeToString(b)
			fl.Digest = "sha256:" + fl.Etag
		} else {
			f.log.Info("NGC lists no sha256 for this file: only its size is checked", "source", r.String(), "file", p, "size", size)
		}
		files = append(files, fl)
		if len(files) > maxFiles {
			return fetchers.Permanent(fmt.Errorf("%s: more than %d files; refusing", r, maxFiles))
		}
		return nil
	}
	for page := 0; ; page++ { // page-number: "zero based index"
		if page >= maxPages {
			return nil, fetchers.Permanent(fmt.Errorf("%s: more than %d pages of files; refusing", r, maxPages))
		}
		u := vbase + "/files?" + url.Values{"page-size": {strconv.Itoa(f.pageSize)}, "page-number": {strconv.Itoa(page)}}.Encode()
		var fr filesResp
		if err := f.apiGet(ctx, r, u, "files", guest, &fr); err != nil {
			return nil, err
		}
		for _, e := range fr.ModelFiles {
			if err := add(e.Path, e.SizeInBytes, e.SHA256Base64); err != nil {
				return nil, err
			}
		}
		if len(fr.ModelFiles) == 0 {
			for _, p := range fr.Filepath { // legacy V1: no sizes, no checksums
				if err := add(p, -1, ""); err != nil {
					return nil, err
				}
			}
		}
		if page+1 >= fr.PaginationInfo.TotalPages || len(fr.ModelFiles)+len(fr.Filepath) == 0 {
			break
		}
	}
	if len(files) == 0 {
		return nil, fetchers.Permanent(fmt.Errorf("%s: %w: the version has no files", r, fetchers.ErrNotFound))
	}
	if mv.TotalFileCount > 0 && int64(len(files)) != mv.TotalFileCount {
		return nil, fetchers.Permanent(fmt.Errorf("%s: %w: the file listing holds %d files but the version says %d; refusing a partial model", r, fetchers.ErrInconsistent, len(files), mv.TotalFileCount))
	}
	return &fetchers.Resolved{URI: src.URI, Revision: r.Version, Files: files}, nil
}

// refOf reads the Ref and the file's path back from a Locator (the URL
// manifest's ?path= URL that Resolve made).
func (f *Fetcher) refOf(loc string) (Ref, string, error) {
	bad := func() (Ref, string, error) {
		return Ref{}, "", fetchers.Permanent(fmt.Errorf("ngc: locator %q is not a file of the URL manifest on %s", fetchers.RedactURI(loc), f.api))
	}
	rest, ok := strings.CutPrefix(loc, f.api+"/v2/org/")
	if !ok {
		return bad()
	}
	rest, query, _ := strings.Cut(rest, "?")
	q, err := url.ParseQuery(query)
	if err != nil || q.Get("path") == "" {
		return bad()
	}
	segs := strings.Split(rest, "/")
	var r Ref
	switch {
	case len(segs) == 7 && segs[1] == "team" && segs[3] == "models" && segs[6] == "files":
		r = Ref{Org: segs[0], Team: segs[2], Model: segs[4], Version: segs[5]}
	case len(segs) == 5 && segs[1] == "models" && segs[4] == "files":
		r = Ref{Org: segs[0], Model: segs[2], Version: segs[3]}
	default:
		return bad()
	}
	if r.Version, err = url.PathUnescape(r.Version); err != nil {
		return bad()
	}
	return r, q.Get("path"), nil
}

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
