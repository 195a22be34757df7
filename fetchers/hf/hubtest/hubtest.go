// Package hubtest is a Hugging Face hub for tests: an API origin that
// speaks the endpoints the hub clients use (revision, the paginated
// recursive tree, paths-info, resolve with HEAD and Range) and a second
// "CDN" origin that LFS files redirect to, as the real hub does. Knobs
// make it hostile: a token requirement, a hook that answers first, and
// byte counters; Limit makes it slow, one uplink shared by every
// response. NewOn serves on another address than loopback (a bridge's,
// for daemons in other network namespaces). EnableXet adds a Xet CAS
// (xettest) behind the LFS files, as the hub has it (xet.go).
package hubtest

import (
	"bytes"
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/modelcache/modelcache/fetchers/hf/xet/xettest"
)

// Entry is one file as the tree API lists it.
type Entry struct {
	Type string `json:"type"`
	OID  string `json:"oid"`
	Size int64  `json:"size"`
	Path string `json:"path"`
	LFS  *LFS   `json:"lfs,omitempty"`
}

// LFS is the lfs block of a tree entry.
type LFS struct {
	OID         string `json:"oid"`
	Size        int64  `json:"size"`
	PointerSize int64  `json:"pointerSize"`
}

type commit struct {
	files map[string][]byte
	tree  []Entry // may be edited by tests (hostile entries)
}

// Hub is a test hub. Create it with New; Close both origins with Close.
type Hub struct {
	API *httptest.Server
	CDN *httptest.Server

	// PageSize is how many tree entries a page holds (pagination); default 3.
	PageSize int
	// LFSThreshold: files at least this large are LFS files; default 1024.
	LFSThreshold int
	// Token, when set, must come as "Bearer <Token>" or the API answers 401.
	Token string
	// Hook, when set, sees every request to either origin first and
	// answers it by returning true.
	Hook func(w http.ResponseWriter, r *http.Request) bool
	// Limit, when set, paces every file body (resolve and CDN) through
	// one token bucket: an origin behind one uplink, whatever the number
	// of connections. Set it before the first request.
	Limit *rate.Limiter
	// Xet, when set (EnableXet), stores the LFS files committed after it
	// in a test CAS: their resolve answers name them (xet.go).
	Xet *xettest.CAS

	Sent        atomic.Int64 // file bytes sent by resolve and the CDN
	CDNSawAuth  atomic.Bool  // an Authorization header reached the CDN
	ResolveGets atomic.Int64 // GETs of file content (resolve or CDN), Range or not

	mu      sync.Mutex
	commits map[string]map[string]*commit // repo → commit → files
	refs    map[string]map[string]string  // repo → ref → commit
	blobs   map[string][]byte             // sha256 hex → content (CDN)
	xetIDs  map[string]string             // sha256 hex → Xet file id
}

// New starts both origins on loopback.
func New() *Hub {
	h := newHub()
	h.CDN = httptest.NewServer(http.HandlerFunc(h.serveCDN))
	h.API = httptest.NewServer(http.HandlerFunc(h.serveAPI))
	return h
}

// NewOn starts both origins on ip, each on a port the kernel picks.
func NewOn(ip string) (*Hub, error) {
	h := newHub()
	var err error
	if h.CDN, err = serveOn(ip, h.serveCDN); err != nil {
		return nil, err
	}
	if h.API, err = serveOn(ip, h.serveAPI); err != nil {
		h.CDN.Close()
		return nil, err
	}
	return h, nil
}

func newHub() *Hub {
	return &Hub{PageSize: 3, LFSThreshold: 1024, commits: map[string]map[string]*commit{}, refs: map[string]map[string]string{}, blobs: map[string][]byte{}, xetIDs: map[string]string{}}
}

func serveOn(ip string, h http.HandlerFunc) (*httptest.Server, error) {
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		return nil, fmt.Errorf("hubtest: listen on %s: %w", ip, err)
	}
	s := httptest.NewUnstartedServer(h)
	s.Listener.Close()
	s.Listener = ln
	s.Start()
	return s, nil
}

// Close stops both origins.
func (h *Hub) Close() {
	h.API.Close()
	h.CDN.Close()
	if h.Xet != nil {
		h.Xet.Close()
	}
}

// URL is the endpoint to give as HF_ENDPOINT.
func (h *Hub) URL() string { return h.API.URL }

// GitOID is the git blob id of b.
func GitOID(b []byte) string {
	s := sha1.New()
	fmt.Fprintf(s, "blob %d\x00", len(b))
	s.Write(b)
	return hex.EncodeToString(s.Sum(nil))
}

// Commit adds a commit of files to repo, points refs (branches, tags) at
// it, and returns its sha.
func (h *Hub) Commit(repo string, files map[string][]byte, refs ...string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	s := sha1.New()
	fmt.Fprint(s, repo, time.Now().UnixNano())
	c := &commit{files: files}
	dirs := map[string]bool{}
	for _, p := range paths {
		b := files[p]
		fmt.Fprint(s, p, GitOID(b))
		for d := p; strings.Contains(d, "/"); {
			d = d[:strings.LastIndex(d, "/")]
			if !dirs[d] {
				dirs[d] = true
				c.tree = append(c.tree, Entry{Type: "directory", OID: strings.Repeat("0", 40), Path: d})
			}
		}
		e := Entry{Type: "file", OID: GitOID(b), Size: int64(len(b)), Path: p}
		if len(b) >= h.LFSThreshold {
			sum := sha256.Sum256(b)
			oid := hex.EncodeToString(sum[:])
			e.LFS = &LFS{OID: oid, Size: int64(len(b)), PointerSize: 134}
			e.Size = int64(len(b))
			h.blobs[oid] = b
			if h.Xet != nil {
				h.xetIDs[oid] = h.Xet.Add(b)
			}
		}
		c.tree = append(c.tree, e)
	}
	sha := hex.EncodeToString(s.Sum(nil))
	if h.commits[repo] == nil {
		h.commits[repo] = map[string]*commit{}
		h.refs[repo] = map[string]string{}
	}
	h.commits[repo][sha] = c
	for _, r := range refs {
		h.refs[repo][r] = sha
	}
	return sha
}

// EditTree lets a test corrupt the listing of a commit.
func (h *Hub) EditTree(repo, sha string, fn func([]Entry) []Entry) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.commits[repo][sha]
	c.tree = fn(c.tree)
}

// SetFile replaces the bytes served for a path of a commit (the listing
// keeps the old digests: a hub that serves wrong bytes).
func (h *Hub) SetFile(repo, sha, path string, b []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.commits[repo][sha]
	c.files[path] = b
	for _, e := range c.tree {
		if e.Path == path && e.LFS != nil {
			h.blobs[e.LFS.OID] = b
		}
	}
}

func (h *Hub) lookup(repo, rev string) (*commit, string, string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	cs, ok := h.commits[repo]
	if !ok {
		return nil, "", "RepoNotFound"
	}
	sha := rev
	if r, ok := h.refs[repo][rev]; ok {
		sha = r
	}
	c, ok := cs[sha]
	if !ok {
		return nil, "", "RevisionNotFound"
	}
	return c, sha, ""
}

func hubError(w http.ResponseWriter, status int, code, msg string) {
	if code != "" {
		w.Header().Set("X-Error-Code", code)
	}
	w.Header().Set("X-Error-Message", msg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

func (h *Hub) serveAPI(w http.ResponseWriter, r *http.Request) {
	if h.Hook != nil && h.Hook(w, r) {
		return
	}
	if h.Token != "" && r.Header.Get("Authorization") != "Bearer "+h.Token {
		hubError(w, http.StatusUnauthorized, "GatedRepo", "Access to this model is restricted. You must have access to it and be authenticated.")
		return
	}
	p := r.URL.Path
	if rest, ok := strings.CutPrefix(p, "/api/models/"); ok {
		h.serveModels(w, r, rest)
		return
	}
	if i := strings.Index(p, "/resolve/"); i > 0 {
		h.serveResolve(w, r, strings.TrimPrefix(p[:i], "/"), p[i+len("/resolve/"):])
		return
	}
	hubError(w, http.StatusNotFound, "", "not found")
}

// serveModels answers /api/models/<repo>/{revision,tree,paths-info}/<rev>
// (rest is the path after /api/models/).
func (h *Hub) serveModels(w http.ResponseWriter, r *http.Request, rest string) {
	for _, verb := range []string{"/revision/", "/tree/", "/paths-info/", "/xet-read-token/"} {
		if i := strings.Index(rest, verb); i > 0 {
			repo, rev := rest[:i], rest[i+len(verb):]
			rev, _ = url.PathUnescape(rev)
			c, sha, code := h.lookup(repo, rev)
			if c == nil {
				hubError(w, http.StatusNotFound, code, code)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			switch verb {
			case "/revision/":
				sib := []map[string]string{}
				for p := range c.files {
					sib = append(sib, map[string]string{"rfilename": p})
				}
				json.NewEncoder(w).Encode(map[string]any{"id": repo, "sha": sha, "siblings": sib})
			case "/tree/":
				h.serveTree(w, r, c)
			case "/paths-info/":
				servePathsInfo(w, r, c)
			case "/xet-read-token/":
				h.serveXetToken(w, r)
			}
			return
		}
	}
	hubError(w, http.StatusNotFound, "", "no such API route")
}

// serveTree answers one page of a commit's tree, from ?cursor= on, with
// a Link to the next page while there is one.
func (h *Hub) serveTree(w http.ResponseWriter, r *http.Request, c *commit) {
	h.mu.Lock()
	tree := append([]Entry(nil), c.tree...)
	h.mu.Unlock()
	cursor, _ := strconv.Atoi(r.URL.Query().Get("cursor"))
	end := min(cursor+h.PageSize, len(tree))
	if end < len(tree) {
		next := *r.URL
		q := next.Query()
		q.Set("cursor", strconv.Itoa(end))
		next.RawQuery = q.Encode()
		w.Header().Set("Link", fmt.Sprintf(`<%s%s>; rel="next"`, h.API.URL, next.RequestURI()))
	}
	json.NewEncoder(w).Encode(tree[cursor:end])
}

// servePathsInfo answers the tree entries of the paths asked for, as
// form values or a JSON body.
func servePathsInfo(w http.ResponseWriter, r *http.Request, c *commit) {
	r.ParseForm()
	want := map[string]bool{}
	for _, p := range r.Form["paths"] {
		want[p] = true
	}
	var body struct {
		Paths []string `json:"paths"`
	}
	json.NewDecoder(r.Body).Decode(&body)
	for _, p := range body.Paths {
		want[p] = true
	}
	out := []Entry{}
	for _, e := range c.tree {
		if want[e.Path] {
			out = append(out, e)
		}
	}
	json.NewEncoder(w).Encode(out)
}

// serveResolve answers /<repo>/resolve/<rev>/<path> (revPath is what
// follows /resolve/): an LFS file redirects to the CDN, another is
// served here.
func (h *Hub) serveResolve(w http.ResponseWriter, r *http.Request, repo, revPath string) {
	rev, path, _ := strings.Cut(revPath, "/")
	rev, _ = url.PathUnescape(rev)
	path, _ = url.PathUnescape(path)
	c, sha, code := h.lookup(repo, rev)
	if c == nil {
		hubError(w, http.StatusNotFound, code, code)
		return
	}
	h.mu.Lock()
	b, ok := c.files[path]
	var entry Entry
	for _, e := range c.tree {
		if e.Path == path {
			entry = e
		}
	}
	h.mu.Unlock()
	if !ok {
		hubError(w, http.StatusNotFound, "EntryNotFound", "Entry not found")
		return
	}
	w.Header().Set("X-Repo-Commit", sha)
	if entry.LFS != nil {
		w.Header().Set("X-Linked-Etag", `"`+entry.LFS.OID+`"`)
		w.Header().Set("X-Linked-Size", strconv.FormatInt(entry.LFS.Size, 10))
		w.Header().Set("ETag", `"`+entry.OID+`"`)
		h.xetHeaders(w, repo, sha, entry.LFS.OID)
		http.Redirect(w, r, h.CDN.URL+"/lfs/"+entry.LFS.OID, http.StatusFound)
		return
	}
	w.Header().Set("ETag", `"`+entry.OID+`"`)
	h.serveContent(w, r, b)
}

func (h *Hub) serveCDN(w http.ResponseWriter, r *http.Request) {
	if h.Hook != nil && h.Hook(w, r) {
		return
	}
	if r.Header.Get("Authorization") != "" {
		h.CDNSawAuth.Store(true)
	}
	oid := strings.TrimPrefix(r.URL.Path, "/lfs/")
	h.mu.Lock()
	b, ok := h.blobs[oid]
	h.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("ETag", `"`+oid+`"`)
	h.serveContent(w, r, b)
}

func (h *Hub) serveContent(w http.ResponseWriter, r *http.Request, b []byte) {
	if r.Method == http.MethodGet {
		h.ResolveGets.Add(1)
	}
	w = &CountingWriter{w, &h.Sent}
	if h.Limit != nil {
		w = pacedWriter{w, r.Context(), h.Limit}
	}
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(b))
}

// pacedWriter writes at its limiter's pace, a burst at most at a time
// (a limiter without a burst fails the write).
// It has no ReadFrom: every byte goes through Write.
type pacedWriter struct {
	http.ResponseWriter
	ctx context.Context
	lim *rate.Limiter
}

func (p pacedWriter) Write(b []byte) (int, error) {
	var n int
	for len(b) > 0 {
		k := len(b)
		if burst := p.lim.Burst(); burst > 0 && k > burst {
			k = burst
		}
		if err := p.lim.WaitN(p.ctx, k); err != nil {
			return n, err
		}
		m, err := p.ResponseWriter.Write(b[:k])
		n += m
		if err != nil {
			return n, err
		}
		b = b[k:]
	}
	return n, nil
}

// CountingWriter adds the bytes a handler writes to N: test servers use
// it to tell how much a client fetched.
type CountingWriter struct {
	http.ResponseWriter
	N *atomic.Int64
}

func (c *CountingWriter) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	c.N.Add(int64(n))
	return n, err
}

// ReadFrom keeps the response's own ReadFrom, which sends a file with
// sendfile(2): a file server wrapped in a CountingWriter (the bench's
// origin over tmpfs) would otherwise copy every byte through a user
// buffer, on the CPU the node under test shares with it.
func (c *CountingWriter) ReadFrom(r io.Reader) (int64, error) {
	n, err := io.Copy(c.ResponseWriter, r)
	c.N.Add(n)
	return n, err
}
