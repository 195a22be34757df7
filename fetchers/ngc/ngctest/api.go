package ngctest

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
)

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

// status answers the spec's Response schema: {"requestStatus":
// {"statusCode", "statusDescription"}}.
func status(w http.ResponseWriter, code int, desc string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{"requestStatus": map[string]string{
		"statusCode": strings.ToUpper(strings.ReplaceAll(http.StatusText(code), " ", "_")), "statusDescription": desc}})
}

var success = map[string]string{"statusCode": "SUCCESS"}
