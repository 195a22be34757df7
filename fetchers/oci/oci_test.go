package oci

import (
	"errors"
	"testing"

	"github.com/modelcache/modelcache/fetchers"
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
