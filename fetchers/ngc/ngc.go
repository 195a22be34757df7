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
//
// Where to find what:
//
//	ngc.go       Fetcher, its endpoints, limits and options, New
//	ref.go       Ref: ngc://<org>[/<team>]/<model>[:<version>] parsed, and
//	             its API paths and token scope
//	auth.go      the bearer token per org/team scope: asked for, cached,
//	             refreshed, forgotten on a 401
//	api.go       one GET of the API with its token, and the API's statuses
//	             explained (licence, private model, org context)
//	resolve.go   Resolve: the version, its paginated file listing and the
//	             count check
//	download.go  Open: the URL manifest's presigned URLs (kept, refreshed
//	             when storage refuses them) and the deprecated per-file path
package ngc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	nethttp "net/http"
	"net/url"
	"os"
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

// SendsCredentials reports whether the fetcher has an API key (its own,
// from WithAPIKey or the environment).
func (f *Fetcher) SendsCredentials(context.Context, string) bool { return f.key != "" }

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
