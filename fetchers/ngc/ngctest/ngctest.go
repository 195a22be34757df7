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
//
// Where to find what:
//
//	ngctest.go  Server, New, the models and versions it holds, and the knobs
//	api.go      the API: guest and org paths parsed, token scopes checked,
//	            versions, paginated listings and the URL manifest
//	token.go    the token service: API key to a scoped bearer token
//	storage.go  the storage origin: presigned URLs, Range, expiry
package ngctest

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"sync/atomic"
	"time"
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
