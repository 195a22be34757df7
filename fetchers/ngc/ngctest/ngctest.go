// Package ngctest is an NVIDIA NGC model registry for tests: a token
// service (API key → bearer token with org/team scope checks), the API
// origin with the endpoints the ngc fetcher uses (model, version, the
// paginated file listing, per-file download that redirects), and a third
// "storage" origin that the downloads redirect to, which must never see a
// token. Knobs make it hostile: a hook that answers first, revocation of
// issued tokens, edits of a listing, other bytes for a file, and counters.
package ngctest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
)

// File is one entry of a version's file listing.
type File struct {
	Path        string `json:"path"`
	SizeInBytes int64  `json:"sizeInBytes"`
	SHA256      string `json:"sha256,omitempty"`
}

type version struct {
	list  []File
	blobs map[string]int // path → storage id
}

type model struct {
	public   bool
	latest   string
	versions map[string]*version
}

type issued struct {
	scopes  map[string]bool
	revoked bool
}

// Server is a test registry. Create it with New, stop it with Close.
type Server struct {
	API, Auth, Storage *httptest.Server

	// PageSize caps the files of one listing page; default 2.
	PageSize int
	// TokenTTL is the expires_in of issued tokens; default 300s.
	TokenTTL time.Duration
	// Keys maps an API key to the scopes ("group/ngc:org",
	// "group/ngc:org/team") it may be given; a key not here gets 401, a
	// scope not listed 403.
	Keys map[string][]string
	// Hook, when set, sees every request to any origin first and answers
	// it by returning true.
	Hook func(w http.ResponseWriter, r *http.Request) bool

	TokenRequests  atomic.Int64
	StorageSawAuth atomic.Bool  // an Authorization header reached storage
	StorageGets    atomic.Int64 // GETs of file content at storage
	RangeGets      atomic.Int64 // of those, with a Range header
	Sent           atomic.Int64 // file bytes sent by storage

	mu     sync.Mutex
	models map[string]*model // "org[/team]/model"
	tokens map[string]*issued
	store  [][]byte
}

// New starts the three origins.
func New() *Server {
	s := &Server{PageSize: 2, TokenTTL: 300 * time.Second, Keys: map[string][]string{}, models: map[string]*model{}, tokens: map[string]*issued{}}
	s.Storage = httptest.NewServer(http.HandlerFunc(s.serveStorage))
	s.Auth = httptest.NewServer(http.HandlerFunc(s.serveAuth))
	s.API = httptest.NewServer(http.HandlerFunc(s.serveAPI))
	return s
}

// Close stops all origins.
func (s *Server) Close() { s.API.Close(); s.Auth.Close(); s.Storage.Close() }

// Sum is the hex sha256 of b.
func Sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// AddVersion adds version of the model at path ("org/model" or
// "org/team/model") with files, makes it the latest, and lists each file
// with its sha256 when withSHA. public models need no token.
func (s *Server) AddVersion(path, ver string, files map[string][]byte, public, withSHA bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.models[path]
	if m == nil {
		m = &model{versions: map[string]*version{}}
		s.models[path] = m
	}
	m.public, m.latest = public, ver
	v := &version{blobs: map[string]int{}}
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		b := files[p]
		f := File{Path: p, SizeInBytes: int64(len(b))}
		if withSHA {
			f.SHA256 = Sum(b)
		}
		v.list = append(v.list, f)
		v.blobs[p] = len(s.store)
		s.store = append(s.store, b)
	}
	m.versions[ver] = v
}

// EditListing lets a test change what a version's listing says.
func (s *Server) EditListing(path, ver string, fn func([]File) []File) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.models[path].versions[ver]
	v.list = fn(v.list)
}

// SetFile makes storage serve b for a file (the listing keeps its size
// and digest: a registry that serves wrong bytes).
func (s *Server) SetFile(path, ver, file string, b []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.store[s.models[path].versions[ver].blobs[file]] = b
}

// RevokeTokens makes every token issued so far invalid.
func (s *Server) RevokeTokens() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, t := range s.tokens {
		t.revoked = true
	}
}

func status(w http.ResponseWriter, code int, desc string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{"requestStatus": map[string]string{
		"statusCode": strings.ToUpper(strings.ReplaceAll(http.StatusText(code), " ", "_")), "statusDescription": desc}})
}

func (s *Server) serveAuth(w http.ResponseWriter, r *http.Request) {
	if s.Hook != nil && s.Hook(w, r) {
		return
	}
	s.TokenRequests.Add(1)
	user, key, ok := r.BasicAuth()
	if r.URL.Path != "/token" || r.URL.Query().Get("service") != "ngc" {
		status(w, http.StatusBadRequest, "want /token?service=ngc")
		return
	}
	s.mu.Lock()
	allowed, known := s.Keys[key]
	s.mu.Unlock()
	if !ok || user != "$oauthtoken" || !known {
		status(w, http.StatusUnauthorized, "invalid credentials")
		return
	}
	scopes := map[string]bool{}
	for _, sc := range r.URL.Query()["scope"] {
		found := false
		for _, a := range allowed {
			found = found || a == sc
		}
		if !found {
			status(w, http.StatusForbidden, "scope not allowed: "+sc)
			return
		}
		scopes[sc] = true
	}
	s.mu.Lock()
	tok := fmt.Sprintf("ngctest-token-%d", len(s.tokens)+1)
	s.tokens[tok] = &issued{scopes: scopes}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"token": tok, "expires_in": int(s.TokenTTL / time.Second)})
}

// parse splits /v2/org/<org>[/team/<team>]/models/<model>[/versions/<v>[/files[/<path>]]].
func parse(p string) (model, ver, rest string, files, ok bool) {
	segs := strings.Split(strings.TrimPrefix(p, "/v2/org/"), "/")
	if !strings.HasPrefix(p, "/v2/org/") || len(segs) < 3 {
		return "", "", "", false, false
	}
	key := segs[0]
	segs = segs[1:]
	if segs[0] == "team" && len(segs) >= 4 {
		key += "/" + segs[1]
		segs = segs[2:]
	}
	if segs[0] != "models" {
		return "", "", "", false, false
	}
	key += "/" + segs[1]
	segs = segs[2:]
	if len(segs) == 0 {
		return key, "", "", false, true
	}
	if segs[0] != "versions" || len(segs) < 2 {
		return "", "", "", false, false
	}
	ver = segs[1]
	segs = segs[2:]
	if len(segs) == 0 {
		return key, ver, "", false, true
	}
	if segs[0] != "files" {
		return "", "", "", false, false
	}
	return key, ver, strings.Join(segs[1:], "/"), true, true
}

func (s *Server) serveAPI(w http.ResponseWriter, r *http.Request) {
	if s.Hook != nil && s.Hook(w, r) {
		return
	}
	key, ver, file, files, ok := parse(r.URL.Path) // Path is unescaped
	if !ok {
		status(w, http.StatusNotFound, "no such route")
		return
	}
	s.mu.Lock()
	m := s.models[key]
	s.mu.Unlock()
	if m == nil {
		status(w, http.StatusNotFound, "model not found")
		return
	}
	if !m.public {
		org, team, _ := strings.Cut(key, "/")
		need := []string{"group/ngc:" + org}
		if strings.Count(key, "/") == 2 {
			team, _, _ = strings.Cut(team, "/")
			need = append(need, "group/ngc:"+org+"/"+team)
		}
		auth := r.Header.Get("Authorization")
		tok, bearer := strings.CutPrefix(auth, "Bearer ")
		s.mu.Lock()
		it := s.tokens[tok]
		valid := bearer && it != nil && !it.revoked
		scoped := valid
		for _, n := range need {
			scoped = scoped && it.scopes[n]
		}
		s.mu.Unlock()
		switch {
		case !valid:
			status(w, http.StatusUnauthorized, "authentication required")
			return
		case !scoped:
			status(w, http.StatusForbidden, "access denied")
			return
		}
	}
	w.Header().Set("Content-Type", "application/json")
	if ver == "" {
		json.NewEncoder(w).Encode(map[string]any{"model": map[string]any{"name": key, "latestVersionIdStr": m.latest}, "requestStatus": map[string]string{"statusCode": "SUCCESS"}})
		return
	}
	s.mu.Lock()
	v := m.versions[ver]
	var list []File
	if v != nil {
		list = append(list, v.list...)
	}
	s.mu.Unlock()
	if v == nil {
		status(w, http.StatusNotFound, "version not found")
		return
	}
	switch {
	case !files:
		var total int64
		for _, f := range list {
			total += f.SizeInBytes
		}
		json.NewEncoder(w).Encode(map[string]any{"modelVersion": map[string]any{"versionId": ver, "status": "UPLOAD_COMPLETE", "totalFileCount": len(list),
			"totalSizeInBytes": total, "storageVersion": "V2"}, "requestStatus": map[string]string{"statusCode": "SUCCESS"}})
	case file == "":
		size, _ := strconv.Atoi(r.URL.Query().Get("page-size"))
		if size <= 0 || size > s.PageSize {
			size = s.PageSize
		}
		page, _ := strconv.Atoi(r.URL.Query().Get("page-number"))
		if page < 1 {
			page = 1
		}
		pages := (len(list) + size - 1) / size
		lo, hi := min((page-1)*size, len(list)), min(page*size, len(list))
		json.NewEncoder(w).Encode(map[string]any{"modelFiles": list[lo:hi], "paginationInfo": map[string]int{"index": page - 1, "size": size, "totalPages": pages, "totalResults": len(list)},
			"requestStatus": map[string]string{"statusCode": "SUCCESS"}})
	default:
		s.mu.Lock()
		id, ok := v.blobs[file]
		s.mu.Unlock()
		if !ok {
			status(w, http.StatusNotFound, "file not found")
			return
		}
		// A presigned-looking URL on another origin, as NGC's storage.
		u := s.Storage.URL + "/blob/" + strconv.Itoa(id) + "?" + url.Values{"X-Amz-Expires": {"300"}, "X-Amz-Signature": {"abc123"}}.Encode()
		http.Redirect(w, r, u, http.StatusFound)
	}
}

func (s *Server) serveStorage(w http.ResponseWriter, r *http.Request) {
	if s.Hook != nil && s.Hook(w, r) {
		return
	}
	if r.Header.Get("Authorization") != "" {
		s.StorageSawAuth.Store(true)
	}
	id, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/blob/"))
	s.mu.Lock()
	var b []byte
	if err == nil && id >= 0 && id < len(s.store) {
		b = s.store[id]
	}
	s.mu.Unlock()
	if b == nil {
		http.NotFound(w, r)
		return
	}
	if r.Method == http.MethodGet {
		s.StorageGets.Add(1)
		if r.Header.Get("Range") != "" {
			s.RangeGets.Add(1)
		}
	}
	w.Header().Set("ETag", `"`+Sum(b)+`"`)
	http.ServeContent(&hubtest.CountingWriter{ResponseWriter: w, N: &s.Sent}, r, "", time.Time{}, bytes.NewReader(b))
}
