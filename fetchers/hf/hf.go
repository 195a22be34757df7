// Package hf fetches models from a Hugging Face hub or a mirror of it:
// hf://<org>/<repo>[@<revision>]. The revision (a branch, a tag or a
// commit) is resolved to the commit sha, which pins the artifact; the
// file list comes from the recursive tree API; LFS files are verified by
// their sha256 and the others by their git blob sha1. An LFS file the hub
// stores in Xet is reconstructed from its chunks (xet.go, package xet),
// reusing those the node holds; anything else comes from the resolve URL.
//
// Where to find what:
//
//	hf.go   the fetcher: options, Resolve (revision, tree), Open, the bridge
//	xet.go  the Xet path: which path a file takes (Route), fallback to the bridge
package hf

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	nethttp "net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/fetchers/hf/xet"
	httpfetcher "github.com/modelcache/modelcache/fetchers/http"
)

// DefaultEndpoint is used when HF_ENDPOINT is not set.
const DefaultEndpoint = "https://huggingface.co"

// Limits on what a hub may send: they bound memory, not models.
const (
	maxTreeBytes   = 256 << 20 // all pages of one tree listing
	maxTreeEntries = 1 << 20
	maxPages       = 10000
	maxAPIBody     = 4 << 20 // a revision answer
)

// Fetcher implements fetchers.Fetcher for hf:// URIs. Safe for concurrent use.
type Fetcher struct {
	opts     fetchers.HTTPOptions
	endpoint string
	token    string
	// tokenFile is the token file that was looked for (named when there
	// is no token).
	tokenFile string
	client    *nethttp.Client
	get       *httpfetcher.Fetcher
	noXet     bool
	chunks    xet.ChunkStore
	onRoute   func(Route)
	xs        xetState
}

type options struct {
	fetchers.HTTPOptions
	endpoint  string
	token     string
	tokenFile string
	noXet     bool
	chunks    xet.ChunkStore
	onRoute   func(Route)
}

// Option configures New.
type Option func(*options)

// WithHTTP sets the shared HTTP options (fetchers.Option): transport,
// redirect policy, idle timeout, User-Agent (API requests and
// downloads), and the Range connections of one large file (fetchers.WithConnections; default 4).
func WithHTTP(opts ...fetchers.Option) Option { return func(o *options) { o.Apply(opts...) } }

// WithEndpoint sets the hub; default $HF_ENDPOINT, else DefaultEndpoint.
func WithEndpoint(u string) Option { return func(o *options) { o.endpoint = u } }

// WithToken sets the bearer token; default $HF_TOKEN, else the token file.
func WithToken(t string) Option { return func(o *options) { o.token = t } }

// WithTokenFile sets the file the token is read from when no token is
// given; default $HF_TOKEN_PATH, else $HF_HOME/token, else
// ~/.cache/huggingface/token. A missing file means no token.
func WithTokenFile(p string) Option { return func(o *options) { o.tokenFile = p } }

// TokenFile is the token file a process reads when no token is given:
// file when set, else $HF_TOKEN_PATH, else $HF_HOME/token, else
// ~/.cache/huggingface/token ("" when there is no home).
func TokenFile(file string) string {
	if file == "" {
		file = os.Getenv("HF_TOKEN_PATH")
	}
	if file != "" {
		return file
	}
	if h := os.Getenv("HF_HOME"); h != "" {
		return filepath.Join(h, "token")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".cache", "huggingface", "token")
	}
	return ""
}

// HasToken says whether this process has a hub token of its own: $HF_TOKEN
// or a non-empty token file (what New reads by default).
func HasToken() bool {
	if os.Getenv("HF_TOKEN") != "" {
		return true
	}
	b, err := os.ReadFile(TokenFile(""))
	return err == nil && strings.TrimSpace(string(b)) != ""
}

// New returns a hub fetcher.
func New(opts ...Option) (*Fetcher, error) {
	o := options{HTTPOptions: fetchers.DefaultHTTPOptions(), endpoint: os.Getenv("HF_ENDPOINT"), token: os.Getenv("HF_TOKEN"), tokenFile: os.Getenv("HF_TOKEN_PATH")}
	for _, opt := range opts {
		opt(&o)
	}
	if o.endpoint == "" {
		o.endpoint = DefaultEndpoint
	}
	u, err := url.Parse(o.endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("HF_ENDPOINT %q: want http(s)://host[:port]", o.endpoint)
	}
	p := TokenFile(o.tokenFile)
	if o.token == "" {
		if b, err := os.ReadFile(p); err == nil {
			o.token = strings.TrimSpace(string(b))
		}
	}
	if err := o.CheckRanges(); err != nil {
		return nil, fmt.Errorf("hf: %w", err)
	}
	f := &Fetcher{endpoint: strings.TrimRight(o.endpoint, "/"), token: o.token, tokenFile: p, opts: o.HTTPOptions, client: o.Client(),
		noXet: o.noXet, chunks: o.chunks, onRoute: o.onRoute, xs: xetState{tokens: map[string]*xet.TokenSource{}, done: map[string]time.Time{}}}
	f.get = httpfetcher.New(httpfetcher.WithClient(f.client), httpfetcher.WithHTTP(fetchers.WithIdleTimeout(o.IdleTimeout), fetchers.WithUserAgent(o.UserAgent)))
	return f, nil
}

var (
	repoRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$`)
	shaRe  = regexp.MustCompile(`^[0-9a-f]{40}$`)
)

// ParseURI splits hf://org/repo[@revision]; the revision defaults to main.
func ParseURI(uri string) (repo, rev string, err error) {
	rest, ok := strings.CutPrefix(uri, "hf://")
	if !ok {
		return "", "", fmt.Errorf("source %q: %w: not an hf:// URI", uri, fetchers.ErrBadSource)
	}
	repo, rev, _ = strings.Cut(rest, "@")
	if rev == "" {
		rev = "main"
	}
	if !repoRe.MatchString(repo) || strings.Contains(repo, "..") || strings.Contains(repo, "--") {
		return "", "", fmt.Errorf("source %q: %w: repo %q; write hf://<org>/<repo>[@<revision>]", uri, fetchers.ErrBadSource, repo)
	}
	if strings.Contains(rev, "..") || strings.ContainsAny(rev, " \\\x00") || len(rev) > 255 {
		return "", "", fmt.Errorf("source %q: %w: revision %q", uri, fetchers.ErrBadSource, rev)
	}
	return repo, rev, nil
}

// SendsCredentials reports whether the fetcher sends a token (its own,
// from WithToken, $HF_TOKEN or the token file).
func (f *Fetcher) SendsCredentials(context.Context, string) bool { return f.token != "" }

// IsCommit reports whether rev is a full commit sha.
func IsCommit(rev string) bool { return shaRe.MatchString(rev) }

func (f *Fetcher) header() nethttp.Header {
	h := nethttp.Header{}
	if f.token != "" {
		h.Set("Authorization", "Bearer "+f.token)
	}
	return h
}

// hubError explains the hub's error answers.
func (f *Fetcher) hubError(repo, rev, what string) func(*nethttp.Response) error {
	return func(resp *nethttp.Response) error {
		code := resp.Header.Get("X-Error-Code")
		msg := resp.Header.Get("X-Error-Message")
		switch {
		case resp.StatusCode == 401 || resp.StatusCode == 403 || code == "GatedRepo":
			auth := "modelcached has no Hugging Face token: the daemon reads HF_TOKEN from its own environment, not modelctl's (systemd: 'sudo systemctl edit modelcached', Environment=HF_TOKEN=…), or its token file " + f.tokenFile + ", or a models.d entry's credentialsFile, or a ModelCache's secretRef; give it a token with read access, then 'modelctl retry NAME'"
			if f.token != "" {
				auth = "the token lacks access: accept the model's terms on the hub, or use a token that can read it"
			}
			return fetchers.Permanent(fmt.Errorf("hf://%s: %w (HTTP %d%s): the repo is gated or private; %s", repo, fetchers.ErrUnauthorized, resp.StatusCode, withMsg(msg), auth))
		case code == "RepoNotFound":
			return fetchers.Permanent(fmt.Errorf("hf://%s: %w: repository not found (or private without a token); check the name%s", repo, fetchers.ErrNotFound, withMsg(msg)))
		case code == "RevisionNotFound":
			return fetchers.Permanent(fmt.Errorf("hf://%s@%s: %w: revision not found; check the branch, tag or commit%s", repo, rev, fetchers.ErrNotFound, withMsg(msg)))
		case code == "EntryNotFound":
			return fetchers.Permanent(fmt.Errorf("hf://%s@%s: %w: %s not in this revision%s", repo, rev, fetchers.ErrNotFound, what, withMsg(msg)))
		case resp.StatusCode == 404:
			return fetchers.Permanent(fmt.Errorf("hf://%s@%s: %w: %s (HTTP 404)", repo, rev, fetchers.ErrNotFound, what))
		}
		return nil
	}
}

func withMsg(m string) string {
	if m == "" {
		return ""
	}
	return ": " + m
}

// apiGet GETs a hub API URL and decodes its JSON into v, bounded by limit.
func (f *Fetcher) apiGet(ctx context.Context, u, repo, rev, what string, limit int64, v any) (nethttp.Header, error) {
	req, err := nethttp.NewRequestWithContext(ctx, nethttp.MethodGet, u, nil)
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	req.Header = f.header()
	req.Header.Set("User-Agent", f.opts.UserAgent)
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != nethttp.StatusOK {
		if err := f.hubError(repo, rev, what)(resp); err != nil {
			return nil, err
		}
		return nil, httpfetcher.StatusError(u, resp)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", u, err)
	}
	if int64(len(body)) > limit {
		return nil, fetchers.Permanent(fmt.Errorf("GET %s: answer larger than %d bytes; refusing it", u, limit))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return nil, fetchers.Permanent(fmt.Errorf("GET %s: %s is not what a hub sends: %v", u, what, err))
	}
	return resp.Header, nil
}

type treeEntry struct {
	Type string `json:"type"`
	OID  string `json:"oid"`
	Size int64  `json:"size"`
	Path string `json:"path"`
	LFS  *struct {
		OID  string `json:"oid"`
		Size int64  `json:"size"`
	} `json:"lfs"`
}

// Resolve pins the revision to its commit and lists the files.
func (f *Fetcher) Resolve(ctx context.Context, src fetchers.Source) (*fetchers.Resolved, error) {
	repo, rev, err := ParseURI(src.URI)
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	var info struct {
		SHA string `json:"sha"`
	}
	revURL := f.endpoint + "/api/models/" + repo + "/revision/" + url.PathEscape(rev)
	if _, err := f.apiGet(ctx, revURL, repo, rev, "revision", maxAPIBody, &info); err != nil {
		return nil, err
	}
	if !shaRe.MatchString(info.SHA) {
		return nil, fetchers.Permanent(fmt.Errorf("hf://%s@%s: the hub answered commit %q, not 40 hex characters", repo, rev, info.SHA))
	}
	var files []fetchers.File
	next := f.endpoint + "/api/models/" + repo + "/tree/" + info.SHA + "?recursive=true"
	var read int64
	for page := 0; next != ""; page++ {
		if page >= maxPages {
			return nil, fetchers.Permanent(fmt.Errorf("hf://%s: more than %d pages of files; refusing", repo, maxPages))
		}
		var entries []treeEntry
		var raw json.RawMessage
		h, err := f.apiGet(ctx, next, repo, rev, "tree", maxTreeBytes-read, &raw)
		if err != nil {
			return nil, err
		}
		read += int64(len(raw))
		if err := json.Unmarshal(raw, &entries); err != nil {
			return nil, fetchers.Permanent(fmt.Errorf("hf://%s: tree page %d: %v", repo, page, err))
		}
		for _, e := range entries {
			if e.Type != "file" {
				continue
			}
			fl := fetchers.File{Path: e.Path, Size: e.Size, Mode: 0o644,
				Locator: f.endpoint + "/" + repo + "/resolve/" + info.SHA + "/" + fetchers.EscapePath(e.Path)}
			if e.LFS != nil {
				if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(e.LFS.OID) {
					return nil, fetchers.Permanent(fmt.Errorf("hf://%s: %s: LFS oid %q is not a sha256", repo, e.Path, e.LFS.OID))
				}
				fl.Digest, fl.Size, fl.Etag = "sha256:"+e.LFS.OID, e.LFS.Size, e.LFS.OID
			} else {
				if !shaRe.MatchString(e.OID) {
					return nil, fetchers.Permanent(fmt.Errorf("hf://%s: %s: git oid %q is not a sha1", repo, e.Path, e.OID))
				}
				fl.Etag = e.OID
				fl.Check = GitBlobCheck(e.OID, e.Size)
			}
			files = append(files, fl)
			if len(files) > maxTreeEntries {
				return nil, fetchers.Permanent(fmt.Errorf("hf://%s: more than %d files; refusing", repo, maxTreeEntries))
			}
		}
		next, err = nextLink(h.Get("Link"), f.endpoint)
		if err != nil {
			return nil, fetchers.Permanent(fmt.Errorf("hf://%s: %v", repo, err))
		}
	}
	if len(files) == 0 {
		return nil, fetchers.Permanent(fmt.Errorf("hf://%s@%s: %w: the revision has no files", repo, rev, fetchers.ErrNotFound))
	}
	return &fetchers.Resolved{URI: src.URI, Revision: info.SHA, Files: files, Repo: repo, Ref: rev}, nil
}

// nextLink reads `Link: <url>; rel="next"`; the next page must be on the
// hub's own origin (the token goes with it).
func nextLink(h, endpoint string) (string, error) {
	for _, part := range strings.Split(h, ",") {
		segs := strings.Split(part, ";")
		if len(segs) < 2 {
			continue
		}
		isNext := false
		for _, p := range segs[1:] {
			if strings.ReplaceAll(strings.TrimSpace(p), " ", "") == `rel="next"` {
				isNext = true
			}
		}
		if !isNext {
			continue
		}
		u := strings.Trim(strings.TrimSpace(segs[0]), "<>")
		next, err := url.Parse(u)
		if err != nil {
			return "", fmt.Errorf("bad next link %q", u)
		}
		ep, _ := url.Parse(endpoint)
		if !next.IsAbs() {
			next = ep.ResolveReference(next)
		}
		if next.Scheme != ep.Scheme || next.Host != ep.Host {
			return "", fmt.Errorf("next page %s is not on the hub %s; refusing to follow it", next.Redacted(), endpoint)
		}
		return next.String(), nil
	}
	return "", nil
}

// Open streams a file from offset: through Xet when the resolve answer
// names the file's Xet hash (xet.go), else from the resolve URL,
// following redirects (the bridge).
func (f *Fetcher) Open(ctx context.Context, file fetchers.File, offset int64) (io.ReadCloser, error) {
	repo, rev := "", ""
	if u, err := url.Parse(file.Locator); err == nil {
		if i := strings.Index(u.Path, "/resolve/"); i > 0 {
			repo = strings.TrimPrefix(u.Path[:i], "/")
			rev, _, _ = strings.Cut(u.Path[i+len("/resolve/"):], "/")
		}
	}
	onErr := f.hubError(repo, rev, file.Path)
	open := func(ctx context.Context, off, n int64) (io.ReadCloser, error) {
		return f.get.GetRange(ctx, file.Locator, file.Size, off, n, f.header(), onErr)
	}
	return f.open(ctx, file, offset, func(ctx context.Context, offset int64) (io.ReadCloser, error) {
		return fetchers.AdaptiveReader(ctx, f.opts.Ranged(open, file.Size, fetchers.RangeBackoff), offset)
	})
}

// GitBlobCheck verifies content against a git blob id:
// sha1("blob <size>\x00" + content), as the hub names non-LFS files.
func GitBlobCheck(oid string, size int64) func(io.Reader) error {
	return func(r io.Reader) error {
		h := sha1.New()
		fmt.Fprintf(h, "blob %d\x00", size)
		n, err := io.Copy(h, r)
		if err != nil {
			return err
		}
		if got := hex.EncodeToString(h.Sum(nil)); n != size || got != oid {
			return fmt.Errorf("%w: git blob sha1 %s (%d bytes), the hub says %s (%d bytes)", errGitMismatch, got, n, oid, size)
		}
		return nil
	}
}

var errGitMismatch = errors.New("git sha1 mismatch")
