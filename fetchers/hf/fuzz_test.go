package hf_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcache/modelcache/fetchers"
	hffetcher "github.com/modelcache/modelcache/fetchers/hf"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
	"github.com/modelcache/modelcache/fetchers/oci"
	"github.com/modelcache/modelcache/fetchers/s3"
)

// FuzzParseURI: the source parsers never panic, and what they accept is
// what they say (a bucket without '/', a repo of two parts, an OCI
// reference of the registry named).
func FuzzParseURI(f *testing.F) {
	for _, s := range []string{"hf://org/repo", "hf://org/repo@main", "hf://org/repo@" + strings.Repeat("a", 40), "hf://../x", "s3://b/p/", "s3://b/../x", "s3:///x",
		"oci://localhost:5000/r:t", "oci://r@sha256:" + strings.Repeat("0", 64), "oci://", "http://x/y#sha256=00", "file:///a/b", "ftp://x", "", "hf://a/b/c"} {
		f.Add(s)
	}
	o := oci.New()
	f.Fuzz(func(t *testing.T, uri string) {
		fetchers.Scheme(uri)
		if repo, _, err := hffetcher.ParseURI(uri); err == nil {
			if strings.Count(repo, "/") > 1 || strings.Contains(repo, "..") || repo == "" {
				t.Fatalf("hf ParseURI(%q) accepted repo %q", uri, repo)
			}
		}
		if b, p, err := s3.ParseURI(uri); err == nil {
			if b == "" || strings.Contains(b, "/") || strings.Contains("/"+p+"/", "/../") {
				t.Fatalf("s3 ParseURI(%q) accepted bucket %q prefix %q", uri, b, p)
			}
		}
		o.ParseURI(uri)
	})
}

// FuzzTreeJSON: whatever the hub's tree listing says, Resolve answers
// with files or an error, never a panic, and names only files whose sizes
// are not negative.
func FuzzTreeJSON(f *testing.F) {
	f.Add([]byte(`[{"type":"file","path":"config.json","size":2,"oid":"` + strings.Repeat("a", 40) + `"}]`))
	f.Add([]byte(`[{"type":"file","path":"w.safetensors","size":10,"lfs":{"oid":"` + strings.Repeat("b", 64) + `","size":10}}]`))
	f.Add([]byte(`[{"type":"file","path":"../../x","size":-5}]`))
	f.Add([]byte(`[{"type":"directory","path":"d"},{"type":"file"}]`))
	f.Add([]byte(`{"error":"x"}`))
	hub := hubtest.New()
	defer hub.Close()
	hub.Commit("org/m", map[string][]byte{"config.json": []byte("{}")}, "main")
	var page atomic.Value
	page.Store([]byte("[]"))
	hub.Hook = func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.Contains(r.URL.Path, "/tree/") {
			return false
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(page.Load().([]byte))
		return true
	}
	fe, err := hffetcher.New(hffetcher.WithEndpoint(hub.URL()), hffetcher.WithToken(""))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		page.Store(body)
		res, err := fe.Resolve(context.Background(), fetchers.Source{URI: "hf://org/m"})
		if err != nil {
			return
		}
		for _, fl := range res.Files {
			if fl.Size < -1 {
				t.Fatalf("a file of size %d from %q", fl.Size, body)
			}
		}
	})
}
