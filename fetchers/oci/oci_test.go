package oci

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
	"github.com/modelcache/modelcache/fetchers/oci/ocitest"
	"github.com/modelcache/modelcache/internal/testenv"
)

func TestParseURI(t *testing.T) {
	f := New(WithInsecureRegistries("127.0.0.1:5000"))
	for _, tc := range []struct {
		uri  string
		want string
		ok   bool
	}{
		{"oci://ghcr.io/acme/llama:v1", "ghcr.io/acme/llama:v1", true},
		{"oci://127.0.0.1:5000/mm@sha256:" + "ab0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcd"[:64], "", true},
		{"oci://ghcr.io/acme/llama", "ghcr.io/acme/llama:latest", true},
		{"oci://", "", false},
		{"oci://Bad Name/x", "", false},
		{"docker://ghcr.io/x", "", false},
	} {
		ref, err := f.ParseURI(tc.uri)
		if (err == nil) != tc.ok {
			t.Errorf("ParseURI(%q) = %v", tc.uri, err)
			continue
		}
		if err != nil && !errors.Is(err, fetchers.ErrBadSource) {
			t.Errorf("ParseURI(%q): %v is not ErrBadSource", tc.uri, err)
		}
		if tc.want != "" && ref.Name() != tc.want {
			t.Errorf("ParseURI(%q) = %s, want %s", tc.uri, ref.Name(), tc.want)
		}
	}
	if ref, _ := f.ParseURI("oci://127.0.0.1:5000/mm:1"); ref == nil || ref.Context().Registry.Scheme() != "http" {
		t.Error("a registry configured insecure must be reached over http")
	}
}

// TestRedirectToInternalRefused: a registry (127.0.0.2 stands in for a
// remote one) that redirects to an address of this node is not followed.
func TestRedirectToInternalRefused(t *testing.T) {
	var asked atomic.Int64
	inside := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { asked.Add(1) }))
	defer inside.Close()
	reg := testenv.ServeOn(t, "127.0.0.2", http.RedirectHandler(inside.URL+"/v2/", http.StatusTemporaryRedirect))
	host := strings.TrimPrefix(reg.URL, "http://")
	remote := func(ip netip.Addr) bool { return ip != netip.MustParseAddr("127.0.0.2") && fetchers.IsInternal(ip) }
	f := New(WithInsecureRegistries(host), WithHTTP(fetchers.WithInternal(remote)))
	_, err := f.Resolve(context.Background(), fetchers.Source{URI: "oci://" + host + "/model:1"})
	if err == nil || !strings.Contains(err.Error(), "host-internal address") {
		t.Fatalf("Resolve through a redirect to loopback: %v; want the redirect refused", err)
	}
	if n := asked.Load(); n != 0 {
		t.Fatalf("the internal server was asked %d times", n)
	}
}

// TestOpenFromOffsetFetchesOnlyTheRest: a layer continued from an offset
// is asked of the registry (a real docker-registry, behind a proxy that
// counts what it sends) with a Range, so the bytes before the offset are
// not sent again, and the bytes are the layer's.
func TestOpenFromOffsetFetchesOnlyTheRest(t *testing.T) {
	reg := testenv.Registry(t)
	var blobBytes atomic.Int64
	target, _ := url.Parse("http://" + reg)
	proxy := httputil.NewSingleHostReverseProxy(target)
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.URL.Path, "/blobs/") && r.Method == http.MethodGet {
			w = &hubtest.CountingWriter{ResponseWriter: w, N: &blobBytes}
		}
		proxy.ServeHTTP(w, r)
	}))
	defer front.Close()
	host := strings.TrimPrefix(front.URL, "http://")
	data := make([]byte, 4<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>12)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, "application/vnd.unknown.config.v1+json")
	img, err := mutate.Append(img, mutate.Addendum{Layer: static.NewLayer(data, "application/vnd.oci.image.layer.v1.raw"), Annotations: map[string]string{AnnotationTitle: "w.bin"}})
	if err != nil {
		t.Fatal(err)
	}
	ocitest.Push(t, reg, "bench/w:latest", img)
	f := New(WithInsecureRegistries(host))
	res, err := f.Resolve(context.Background(), fetchers.Source{URI: "oci://" + host + "/bench/w:latest"})
	if err != nil {
		t.Fatal(err)
	}
	const off = 3<<20 + 5
	blobBytes.Store(0)
	rc, err := f.Open(context.Background(), res.Files[0], off)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data[off:]) {
		t.Fatalf("from %d: %d bytes, %v: not the layer's", off, len(got), err)
	}
	// The proxy counts a write after the client may have read it: wait
	// for the count to reach what was read, then check it is not more.
	testenv.Poll(30*time.Second, func() error { // the count is checked below
		if n := blobBytes.Load(); n < int64(len(data)-off) {
			return fmt.Errorf("%d bytes", n)
		}
		return nil
	})
	if n := blobBytes.Load(); n != int64(len(data)-off) {
		t.Fatalf("the registry sent %d bytes of the blob for the last %d; want only those", n, len(data)-off)
	}
}
