// Package ngctest is an NVIDIA NGC model registry for tests, answering as
// NGC's published API description does (the OpenAPI document of
// api.ngc.nvidia.com; a copy: stackql-registry/stackql-provider-nvidia,
// provider-dev/downloaded/cleaned/ngc_models.json, cited below as "spec")
// and as NVIDIA's own client (the ngc CLI, python package ngcbase, cited
// as "ngcbase") expects. Three origins: a token service (API key → bearer
// token with org/team scope checks), the API, and a "storage" origin that
// serves presigned URLs and must never see a token.
//
// The API serves, for each model:
//
//	guest paths, no token (ngcbase registry/api/models.py GuestModelAPI):
//	  GET /v2/models/<org>[/<team>]/<name>                          ModelResponse
//	  GET /v2/models/<org>[/<team>]/<name>/versions/<v>             ModelVersionResponse
//	  GET /v2/models/<org>[/<team>]/<name>/versions/<v>/files       ModelVersionFileListResponse
//	  GET /v2/models/<org>[/<team>]/<name>/versions/<v>/files/<p>   302 to storage (deprecated)
//	org paths, a bearer token (spec: getModelVersionInOrg, listModeFilesInOrg):
//	  the same under /v2/org/<org>[/team/<team>]/models/<name>
//	the URL manifest (ngcbase ModelAPI.get_direct_download_URL; spec
//	ArtifactDownloadAllResponse, ArtifactDownloadResponse):
//	  GET /v2/org/<org>[/team/<team>]/models/<name>/<v>/files[?path=<p>]
//
// A public model answers its guest paths and its URL manifest without a
// token; its org paths want one (any valid token). A private model
// answers only a token scoped to its org (and team); its guest paths
// answer 401. Knobs make it hostile: a hook that answers first,
// revocation of tokens, expiry of presigned URLs, edits of a listing,
// other bytes for a file, a licence to accept, a refused manifest, and
// counters.
package ngctest

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
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

// File is one entry of a version's file listing: the spec's ModelFile
// (path, sizeInBytes, sha256_base64 "Base64 encoded sha256 hash of the
// artifact file").
type File struct {
	Path         string `json:"path"`
	SizeInBytes  int64  `json:"sizeInBytes"`
	SHA256Base64 string `json:"sha256_base64,omitempty"`
}

type version struct {
	list    []File
	blobs   map[string]int // path → storage id
	storage string         // the spec's ModelVersion.storageVersion: "V2", or "V1" (legacy)
}

type model struct {
	public   bool
	licence  bool // a licence to accept in the NGC UI first (HTTP 412)
	latest   string
	versions map[string]*version
}

type issued struct {
	scopes  map[string]bool
	revoked bool
}

type presigned struct {
	blob    int
	expired bool
}

// Server is a test registry. Create it with New, stop it with Close.
type Server struct {
	API, Auth, Storage *httptest.Server

	// PageSize caps the files of one listing or manifest page, whatever
	// page-size asks; default 2 (the spec allows page-size 1..5000).
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
	// RefuseManifest makes the URL manifest answer 404 (a mirror or an
	// API without it): downloads then need the deprecated per-file path.
	RefuseManifest bool

	TokenRequests    atomic.Int64
	ManifestRequests atomic.Int64 // URL manifest answers with URLs
	PerFileRequests  atomic.Int64 // deprecated per-file downloads
	ListPages        atomic.Int64 // file listing pages served
	StorageSawAuth   atomic.Bool  // an Authorization header reached storage
	StorageGets      atomic.Int64 // GETs of file content at storage
	RangeGets        atomic.Int64 // of those, with a Range header
	ExpiredGets      atomic.Int64 // of those, refused: the URL had expired
	Sent             atomic.Int64 // file bytes sent by storage

	mu     sync.Mutex
	models map[string]*model // "org[/team]/model"
	tokens map[string]*issued
	urls   map[string]*presigned // by signature
	store  [][]byte
}

// New starts the three origins.
func New() *Server {
	s := &Server{PageSize: 2, TokenTTL: 300 * time.Second, Keys: map[string][]string{}, models: map[string]*model{},
		tokens: map[string]*issued{}, urls: map[string]*presigned{}}
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

// SumBase64 is the sha256 of b as the listing's sha256_base64 writes it.
func SumBase64(b []byte) string {
	h := sha256.Sum256(b)
	return base64.StdEncoding.EncodeToString(h[:])
}

// AddVersion adds version of the model at path ("org/model" or
// "org/team/model") with files, stored as V2, makes it the latest, and
// lists each file with its sha256_base64 when withSHA. public models need
// no token.
func (s *Server) AddVersion(path, ver string, files map[string][]byte, public, withSHA bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.models[path]
	if m == nil {
		m = &model{versions: map[string]*version{}}
		s.models[path] = m
	}
	m.public, m.latest = public, ver
	v := &version{blobs: map[string]int{}, storage: "V2"}
	paths := make([]string, 0, len(files))
	for p := range files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		b := files[p]
		f := File{Path: p, SizeInBytes: int64(len(b))}
		if withSHA {
			f.SHA256Base64 = SumBase64(b)
		}
		v.list = append(v.list, f)
		v.blobs[p] = len(s.store)
		s.store = append(s.store, b)
	}
	m.versions[ver] = v
}

// SetLegacy makes a version a legacy one (storageVersion "V1"): its file
// listing then holds filepath[] and urls[] (presigned, without sizes or
// checksums) instead of modelFiles, as ai-dynamo/modelexpress
// (providers/ngc.rs, ArtifactFilesResponse) reads it.
func (s *Server) SetLegacy(path, ver string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.models[path].versions[ver].storage = "V1"
}

// RequireLicence makes every version request of a model answer 412 until
// AcceptLicence (a licence to accept in the NGC UI).
func (s *Server) RequireLicence(path string, required bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.models[path].licence = required
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

// ExpireURLs makes every presigned URL issued so far expire: storage
// answers 403 to it, as S3 does ("Request has expired").
func (s *Server) ExpireURLs() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, u := range s.urls {
		u.expired = true
	}
}

// status answers the spec's Response schema: {"requestStatus":
// {"statusCode", "statusDescription"}}.
func status(w http.ResponseWriter, code int, desc string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{"requestStatus": map[string]string{
		"statusCode": strings.ToUpper(strings.ReplaceAll(http.StatusText(code), " ", "_")), "statusDescription": desc}})
}

var success = map[string]string{"statusCode": "SUCCESS"}

// serveAuth is the token exchange of ngcbase and modelexpress:
// GET /token?service=ngc&scope=group/ngc:<org>[&scope=…/<team>], Basic
// "$oauthtoken":<key> → {"token", "expires_in"}.
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

// route is a parsed API path.
type route struct {
	key      string // "org[/team]/model"
	org      bool   // under /v2/org/ (else a guest path)
	manifest bool   // the URL manifest
	ver      string
	files    bool   // …/files
	file     string // …/files/<path> (deprecated per-file download)
}

// parse reads the paths of the package comment; ok false for any other.
func parse(p string) (rt route, ok bool) {
	var segs []string
	switch {
	case strings.HasPrefix(p, "/v2/org/"):
		rt.org = true
		segs = strings.Split(strings.TrimPrefix(p, "/v2/org/"), "/")
		if len(segs) < 3 {
			return rt, false
		}
		rt.key = segs[0]
		segs = segs[1:]
		if segs[0] == "team" && len(segs) >= 4 {
			rt.key += "/" + segs[1]
			segs = segs[2:]
		}
		if segs[0] != "models" {
			return rt, false
		}
		rt.key += "/" + segs[1]
		segs = segs[2:]
		if len(segs) == 2 && segs[0] != "versions" && segs[1] == "files" {
			rt.manifest, rt.ver = true, segs[0]
			return rt, true
		}
	case strings.HasPrefix(p, "/v2/models/"):
		segs = strings.Split(strings.TrimPrefix(p, "/v2/models/"), "/")
		n := len(segs)
		for i, s := range segs {
			if s == "versions" && (i == 2 || i == 3) {
				n = i
				break
			}
		}
		if n != 2 && n != 3 {
			return rt, false
		}
		rt.key = strings.Join(segs[:n], "/")
		segs = segs[n:]
	default:
		return rt, false
	}
	if len(segs) == 0 {
		return rt, true
	}
	if segs[0] != "versions" || len(segs) < 2 {
		return rt, false
	}
	rt.ver = segs[1]
	segs = segs[2:]
	if len(segs) == 0 {
		return rt, true
	}
	if segs[0] != "files" {
		return rt, false
	}
	rt.files, rt.file = true, strings.Join(segs[1:], "/")
	return rt, true
}

// allowed checks the request's token against the model: 0 when it may
// read, else the status to answer.
func (s *Server) allowed(r *http.Request, rt route, m *model) int {
	if m.public && (!rt.org || rt.manifest) {
		return 0
	}
	tok, bearer := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !rt.org {
		return http.StatusUnauthorized // a guest path of a private model
	}
	org, rest, _ := strings.Cut(rt.key, "/")
	need := []string{"group/ngc:" + org}
	if team, _, ok := strings.Cut(rest, "/"); ok {
		need = append(need, "group/ngc:"+org+"/"+team)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	it := s.tokens[tok]
	if !bearer || it == nil || it.revoked {
		return http.StatusUnauthorized
	}
	if m.public {
		return 0
	}
	for _, n := range need {
		if !it.scopes[n] {
			return http.StatusForbidden
		}
	}
	return 0
}

func (s *Server) serveAPI(w http.ResponseWriter, r *http.Request) {
	if s.Hook != nil && s.Hook(w, r) {
		return
	}
	rt, ok := parse(r.URL.Path) // Path is unescaped
	if !ok || (rt.manifest && s.RefuseManifest) {
		status(w, http.StatusNotFound, "no such route")
		return
	}
	s.mu.Lock()
	m := s.models[rt.key]
	s.mu.Unlock()
	if m == nil {
		status(w, http.StatusNotFound, "model not found")
		return
	}
	if code := s.allowed(r, rt, m); code != 0 {
		status(w, code, http.StatusText(code))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if rt.ver == "" {
		// ModelResponse: model.latestVersionIdStr ("ID of the latest version").
		json.NewEncoder(w).Encode(map[string]any{"model": map[string]any{"name": rt.key, "latestVersionIdStr": m.latest}, "requestStatus": success})
		return
	}
	s.mu.Lock()
	v := m.versions[rt.ver]
	var list []File
	var storage string
	if v != nil {
		list, storage = append(list, v.list...), v.storage
	}
	licence := m.licence
	s.mu.Unlock()
	switch {
	case v == nil:
		status(w, http.StatusNotFound, "version not found")
		return
	case licence:
		status(w, http.StatusPreconditionFailed, "license terms must be accepted before downloading this artifact")
		return
	}
	switch {
	case rt.manifest:
		s.serveManifest(w, r, rt, v, list)
	case !rt.files:
		// ModelVersionResponse.modelVersion: versionId, status
		// (UPLOAD_PENDING|UPLOAD_COMPLETE), storageVersion (V1|V2|""),
		// totalFileCount, totalSizeInBytes.
		var total int64
		for _, f := range list {
			total += f.SizeInBytes
		}
		json.NewEncoder(w).Encode(map[string]any{"modelVersion": map[string]any{"versionId": rt.ver, "status": "UPLOAD_COMPLETE", "totalFileCount": len(list),
			"totalSizeInBytes": total, "storageVersion": storage}, "requestStatus": success})
	case rt.file == "":
		// ModelVersionFileListResponse: modelFiles (ModelFile),
		// paginationInfo (PaginationInfo: index, size, totalPages,
		// totalResults); page-number "zero based index", page-size 1..5000.
		lo, hi, page := s.page(r, len(list))
		s.ListPages.Add(1)
		out := map[string]any{"paginationInfo": pagination(page, hi-lo, len(list), s.size(r)), "requestStatus": success,
			"modelVersion": map[string]any{"versionId": rt.ver, "storageVersion": storage}}
		if storage == "V1" {
			// Legacy: presigned URLs in place of file metadata.
			paths, urls := []string{}, []string{}
			for _, f := range list[lo:hi] {
				paths, urls = append(paths, f.Path), append(urls, s.presign(v.blobs[f.Path]))
			}
			out["filepath"], out["urls"] = paths, urls
		} else {
			out["modelFiles"] = list[lo:hi]
		}
		json.NewEncoder(w).Encode(out)
	default:
		// The deprecated per-file download: a redirect to storage.
		s.mu.Lock()
		id, ok := v.blobs[rt.file]
		s.mu.Unlock()
		if !ok {
			status(w, http.StatusNotFound, "file not found")
			return
		}
		s.PerFileRequests.Add(1)
		http.Redirect(w, r, s.presign(id), http.StatusFound)
	}
}

// serveManifest answers the URL manifest: with ?path=<p> the spec's
// ArtifactDownloadResponse {filepath, url}; without, a page of
// ArtifactDownloadAllResponse {filepath[], urls[], sha256_base64[],
// paginationInfo}.
func (s *Server) serveManifest(w http.ResponseWriter, r *http.Request, rt route, v *version, list []File) {
	if p := r.URL.Query().Get("path"); p != "" {
		s.mu.Lock()
		id, ok := v.blobs[p]
		s.mu.Unlock()
		if !ok {
			status(w, http.StatusNotFound, "file not found")
			return
		}
		s.ManifestRequests.Add(1)
		json.NewEncoder(w).Encode(map[string]any{"filepath": p, "url": s.presign(id), "requestStatus": success})
		return
	}
	lo, hi, page := s.page(r, len(list))
	s.ManifestRequests.Add(1)
	paths, urls, sums := []string{}, []string{}, []string{}
	for _, f := range list[lo:hi] {
		paths, urls, sums = append(paths, f.Path), append(urls, s.presign(v.blobs[f.Path])), append(sums, f.SHA256Base64)
	}
	json.NewEncoder(w).Encode(map[string]any{"filepath": paths, "urls": urls, "sha256_base64": sums,
		"paginationInfo": pagination(page, hi-lo, len(list), s.size(r)), "requestStatus": success})
}

// size is the page size a request gets: its page-size, at most PageSize;
// 100 when it names none (ngcbase: the API's default).
func (s *Server) size(r *http.Request) int {
	size, err := strconv.Atoi(r.URL.Query().Get("page-size"))
	if err != nil || size < 1 {
		size = 100
	}
	return min(size, s.PageSize)
}

// page is the slice [lo, hi) of n results that a request's zero-based
// page-number selects.
func (s *Server) page(r *http.Request, n int) (lo, hi, page int) {
	size := s.size(r)
	page, _ = strconv.Atoi(r.URL.Query().Get("page-number")) // absent: 0
	page = max(page, 0)
	return min(page*size, n), min((page+1)*size, n), page
}

func pagination(page, got, total, size int) map[string]int {
	return map[string]int{"index": page, "size": got, "totalPages": (total + size - 1) / size, "totalResults": total}
}

// presign issues a storage URL for blob id, shaped as S3's presigned ones.
func (s *Server) presign(id int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	sig := fmt.Sprintf("sig%d", len(s.urls)+1)
	s.urls[sig] = &presigned{blob: id}
	return s.Storage.URL + "/blob/" + strconv.Itoa(id) + "?" + url.Values{"X-Amz-Expires": {"3600"}, "X-Amz-Signature": {sig}}.Encode()
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
	u := s.urls[r.URL.Query().Get("X-Amz-Signature")]
	var b []byte
	if err == nil && u != nil && u.blob == id && id >= 0 && id < len(s.store) {
		b = s.store[id]
	}
	expired := u != nil && u.expired
	s.mu.Unlock()
	if r.Method == http.MethodGet {
		s.StorageGets.Add(1)
		if r.Header.Get("Range") != "" {
			s.RangeGets.Add(1)
		}
	}
	switch {
	case expired:
		s.ExpiredGets.Add(1)
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusForbidden)
		w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>`))
		return
	case b == nil:
		w.WriteHeader(http.StatusForbidden) // S3: a bad signature
		return
	}
	w.Header().Set("ETag", `"`+Sum(b)+`"`)
	http.ServeContent(&hubtest.CountingWriter{ResponseWriter: w, N: &s.Sent}, r, "", time.Time{}, bytes.NewReader(b))
}
