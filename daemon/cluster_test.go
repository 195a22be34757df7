package daemon

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/fetchers"
)

// TestClusterPinnedURI: the URI that names exactly the revision a
// cluster resolution found, per scheme.
func TestClusterPinnedURI(t *testing.T) {
	const commit = "0123456789abcdef0123456789abcdef01234567"
	const hex = "ab12000000000000000000000000000000000000000000000000000000000000"
	for _, c := range []struct {
		uri  string
		res  fetchers.Resolved
		want string
	}{
		{"hf://org/m", fetchers.Resolved{Revision: commit, Repo: "org/m", Ref: "main"}, "hf://org/m@" + commit},
		{"hf://org/m@v1", fetchers.Resolved{Revision: commit, Repo: "org/m", Ref: "v1"}, "hf://org/m@" + commit},
		{"oci://reg.example:5000/k/img:sm90", fetchers.Resolved{Revision: hex}, "oci://reg.example:5000/k/img@sha256:" + hex},
		{"oci://reg.example:5000/k/img", fetchers.Resolved{Revision: hex}, "oci://reg.example:5000/k/img@sha256:" + hex},
		{"oci://reg/k/img@sha256:" + hex, fetchers.Resolved{Revision: hex}, "oci://reg/k/img@sha256:" + hex},
		{"ngc://nvidia/team/llama", fetchers.Resolved{Revision: "1.2"}, "ngc://nvidia/team/llama:1.2"},
		{"s3://b/prefix/", fetchers.Resolved{Revision: "s3-abc"}, "s3://b/prefix/"},
		{"https://h/w.bin", fetchers.Resolved{}, "https://h/w.bin"},
	} {
		src, err := parseSource(c.uri)
		if err != nil {
			t.Fatal(err)
		}
		if got := pinnedURI(src, &c.res); got != c.want {
			t.Errorf("pinnedURI(%s) = %s, want %s", c.uri, got, c.want)
		}
	}
}

// TestClusterDigestError: a cluster desire's checksum mismatch is the
// cluster's reason; a user's digest keeps the store's message.
func TestClusterDigestError(t *testing.T) {
	m := cachestore.Manifest{{Path: "w.bin", Digest: "sha256:" + strings.Repeat("a", 64), Size: 1}}
	want := "sha256:" + strings.Repeat("b", 64)
	commitErr := fmt.Errorf("artifact x: %w: manifest digest is …", cachestore.ErrDigestMismatch)
	err := clusterDigestError(api.Desire{Digest: want, ClusterDigest: true}, m, commitErr)
	if !errors.Is(err, errSourceChanged) || permanentReason(err) != api.ReasonSourceChanged ||
		!strings.HasPrefix(err.Error(), "source changed since the cluster resolved it: digest "+m.Digest()+", cluster has "+want+" (this node keeps what it serves") {
		t.Fatalf("%v (%s)", err, permanentReason(err))
	}
	if err := clusterDigestError(api.Desire{Digest: want}, m, commitErr); err != commitErr {
		t.Fatalf("a user's digest: %v", err)
	}
	if fingerprint(api.Desire{URI: "s3://b/p", Digest: want, ClusterDigest: true}) != fingerprint(api.Desire{URI: "s3://b/p"}) {
		t.Fatal("the cluster's checksum must not change a desire's fingerprint")
	}
}

// TestClusterHFRef: a commit the cluster pinned keeps the branch it was
// resolved from in the HF view; a pull of a branch keeps its own.
func TestClusterHFRef(t *testing.T) {
	const c = "0123456789abcdef0123456789abcdef01234567"
	if got := hfRef(api.Desire{Ref: "main"}, &fetchers.Resolved{Revision: c, Ref: c}); got != "main" {
		t.Errorf("pinned commit: %q", got)
	}
	if got := hfRef(api.Desire{Ref: "main"}, &fetchers.Resolved{Revision: c, Ref: "v1"}); got != "v1" {
		t.Errorf("a ref asked for: %q", got)
	}
	if got := hfRef(api.Desire{}, &fetchers.Resolved{Revision: c, Ref: c}); got != c {
		t.Errorf("no cluster ref: %q", got)
	}
}
