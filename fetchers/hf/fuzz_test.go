package hf_test

import (
	"strings"
	"testing"

	"github.com/modelcache/modelcache/fetchers"
	hffetcher "github.com/modelcache/modelcache/fetchers/hf"
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
