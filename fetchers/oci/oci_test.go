package oci

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcache/modelcache/fetchers"
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
	f := New(WithInsecureRegistries(host), WithInternal(remote))
	_, err := f.Resolve(context.Background(), fetchers.Source{URI: "oci://" + host + "/model:1"})
	if err == nil || !strings.Contains(err.Error(), "host-internal address") {
		t.Fatalf("Resolve through a redirect to loopback: %v; want the redirect refused", err)
	}
	if n := asked.Load(); n != 0 {
		t.Fatalf("the internal server was asked %d times", n)
	}
}
