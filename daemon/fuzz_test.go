package daemon

import (
	"bytes"
	"fmt"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
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
	d := &Daemon{cfg: Config{KernelCacheSignaturePolicy: api.PolicyRequired}, sources: &sources{shared: fetchers.Registry{"file": nil, "http": nil, "https": nil, "hf": nil, "s3": nil, "oci": nil}}}
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest("POST", "/v1/pull", bytes.NewReader(body))
		var req api.PullRequest
		if decode(r, &req) != nil {
			return
		}
		ds := req.Desire()
		ds.Origin = originAPI
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
		if ds.Serves != "" || ds.Origin != originAPI {
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

// FuzzCredentialsFile: a credentials file either parses or is refused
// with an error of a fixed form (the path, the line number, one of the
// fixed messages, and the key only where it is that line's key and looks
// like a key name), and no value of any line (the text after its first
// '=' or ':', 4 bytes or more) appears in the error but as part of the
// fixed text.
func FuzzCredentialsFile(f *testing.F) {
	for _, s := range []string{
		"HF_TOKEN=hf_abc\n", "export HTTP_AUTHORIZATION=\"Bearer TOKEN\"\n", "HTTP_AUTHORIZATION: Bearer TEAM-A-TOKEN\n",
		"root:$6$SALT$hash:19000:0:99999:7:::\n", "# c\n\nPASSWORD=hunter2\n", "Bearer abc=def==\n", "ghp_0123456789\n",
		"HF_TOKEN=SECRET_PART\nSECRET_PART=1\n", "AWS_ACCESS_KEY_ID=AKIA\nAWS_SECRET_ACCESS_KEY='s3cr3t'\n", "=value\n", "HF_TOKEN:HF_TOKEN\n",
	} {
		f.Add([]byte(s))
	}
	const path = "/etc/modelcache/creds.env"
	f.Fuzz(func(t *testing.T, b []byte) {
		_, err := parseCredentials(path, b)
		if err == nil {
			return
		}
		msg := err.Error()
		lines := strings.Split(string(b), "\n")
		rest, ok := strings.CutPrefix(msg, path+" line ")
		num, body, ok2 := strings.Cut(rest, ": ")
		n, nerr := strconv.Atoi(num)
		if !ok || !ok2 || nerr != nil || n < 1 || n > len(lines) {
			t.Fatalf("error %q: want %q, a line number, then the reason", msg, path+" line N: ")
		}
		key, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimSpace(lines[n-1]), "export "), "=")
		key = strings.TrimSpace(key)
		colonKey, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimSpace(lines[n-1]), "export "), ":")
		colonKey = strings.TrimSpace(colonKey)
		skeleton := body // the body with the key it names cut out
		switch {
		case body == credNotKeyValue || body == credHiddenKey:
		case body == fmt.Sprintf(credUnknownKey, key) && plausibleKey(key) && !credentialKeys[key]:
			skeleton = strings.Replace(body, `"`+key+`"`, "\x00", 1)
		case body == fmt.Sprintf(credColonNotEquals, colonKey, colonKey) && credentialKeys[colonKey]:
			skeleton = strings.ReplaceAll(body, colonKey, "\x00")
		case body == fmt.Sprintf(credUnclosedQuote, key) && credentialKeys[key]:
			skeleton = strings.Replace(body, key, "\x00", 1)
		default:
			t.Fatalf("error %q: not one of the fixed forms for line %d", msg, n)
		}
		fixed := path + " line " + num + ": " + skeleton + "\x00" + credentialKeyList
		for _, line := range lines {
			for _, sep := range []string{"=", ":"} {
				if _, v, ok := strings.Cut(line, sep); ok {
					if v = strings.TrimSpace(v); len(v) >= 4 && strings.Contains(msg, v) && !strings.Contains(fixed, v) {
						t.Fatalf("error %q shows the value %q", msg, v)
					}
				}
			}
		}
	})
}
