package ngc

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/modelcache/modelcache/fetchers"
)

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
