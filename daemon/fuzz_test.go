package daemon

import (
	"bytes"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/sources"
	"github.com/modelcache/modelcache/fetchers"
	ocifetcher "github.com/modelcache/modelcache/fetchers/oci"
)

// FuzzPullRequest: the socket API's pull body goes through decode and
// validateDesire without a panic, and a desire they accept has a valid
// name, a known scheme, a known kind and clean kernel cache parts.
func FuzzPullRequest(f *testing.F) {
	for _, s := range []string{
		`{"name":"m","uri":"hf://org/repo"}`,
		`{"name":"m","uri":"oci://r/x:1","kind":"kernelcache","signature":{"keys":["-----BEGIN PUBLIC KEY-----"]}}`,
		`{"name":"m","uri":"file:///x","kernelCaches":[{"uri":"oci://r/k:sm90"}]}`,
		`{"name":"../x","uri":"file:///x"}`, `{"name":"m","uri":"ftp://x"}`, `{"name":"m","uri":"s3://b/p","include":["[" ]}`,
		`{"name":"m","uri":"oci://r/x","kind":"kernelcache","signature":{"keys":["/etc/shadow"]}}`, `{"unknown":1}`, `[]`, ``,
		`{"name":"m","uri":"oci://r/x","kind":"kernelcache","serves":"llama","signature":{"policy":"off"}}`,
		`{"name":"m","uri":"oci://r/x","kind":"kernelcache","signature":{"policy":"off"}}`,
		`{"name":"m","uri":"oci://r/x","kind":"kernelcache","signature":{"identity":"a","issuer":"b","trustedRoot":"/dev/zero"}}`,
		`{"name":"m","uri":"oci://r/x","kind":"kernelcache","signature":{"identity":"a","issuer":"b","trustedRoot":"{}"}}`,
		`{"name":"m","uri":"file:///x","origin":"file:/etc/x","requester":{"uid":0}}`,
	} {
		f.Add([]byte(s))
	}
	set, err := sources.New(sources.Config{}, nil, nil)
	if err != nil {
		f.Fatal(err)
	}
	d := &Daemon{cfg: Config{KernelCacheSignaturePolicy: api.PolicyRequired}, sources: set}
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest("POST", "/v1/pull", bytes.NewReader(body))
		var req api.PullRequest
		if decode(r, &req) != nil {
			return
		}
		ds := req.Desire()
		ds.Origin = sources.OriginAPI
		ds, err := d.validateDesire(ds)
		if err != nil {
			return
		}
		if cachestore.ValidateName(ds.Name) != nil {
			t.Fatalf("accepted the name %q", ds.Name)
		}
		if s, err := fetchers.Scheme(ds.URI); err != nil || s == "" {
			t.Fatalf("accepted the source %q", ds.URI)
		}
		if ds.Kind != "" && ds.Kind != api.KindModel && ds.Kind != api.KindKernelCache {
			t.Fatalf("accepted the kind %q", ds.Kind)
		}
		for _, kc := range ds.KernelCaches {
			if !strings.HasPrefix(kc.URI, "oci://") {
				t.Fatalf("accepted the kernel cache %q", kc.URI)
			}
			checkPolicy(t, kc.Signature)
		}
		checkPolicy(t, ds.Signature)
		if ds.Serves != "" || ds.Origin != sources.OriginAPI {
			t.Fatalf("a socket request set serves %q or origin %q", ds.Serves, ds.Origin)
		}
	})
}

// checkPolicy: what the socket accepted names no path of the node and does
// not go below the node's signature floor (required here).
func checkPolicy(t *testing.T, p *api.SignaturePolicy) {
	if p == nil {
		return
	}
	for _, k := range p.Keys {
		if !strings.Contains(k, "-----BEGIN") {
			t.Fatalf("accepted a key path over the socket: %q", k)
		}
	}
	if p.TrustedRoot != "" && !ocifetcher.IsInlineTrustedRoot(p.TrustedRoot) {
		t.Fatalf("accepted a trusted-root path over the socket: %q", p.TrustedRoot)
	}
	if p.Policy == api.PolicyOff {
		t.Fatal("accepted policy off below the node's floor")
	}
}
