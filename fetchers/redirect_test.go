package fetchers_test

import (
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/internal/testenv"
)

func TestSameOrigin(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"https://h.test/x", "https://h.test/y?q", true},
		{"https://h.test/x", "https://H.TEST:443/y", true}, // the default port, case ignored
		{"http://h.test/x", "http://h.test:80/y", true},
		{"https://h.test/x", "http://h.test/x", false},     // http from https
		{"https://h.test/x", "https://h.test:80/x", false}, // not the default port
		{"https://h.test:8443/x", "https://h.test/x", false},
		{"https://h.test/x", "https://cdn.h.test/x", false}, // a subdomain
		{"https://cdn.h.test/x", "https://h.test/x", false},
		{"http://127.0.0.1:1/x", "http://127.0.0.2:1/x", false},
		{"http://[::1]:80/x", "http://[::1]/y", true},
	} {
		a, _ := url.Parse(tc.a)
		b, _ := url.Parse(tc.b)
		if got := fetchers.SameOrigin(a, b); got != tc.same {
			t.Errorf("SameOrigin(%s, %s) = %v, want %v", tc.a, tc.b, got, tc.same)
		}
	}
}

func TestIsCredentialHeader(t *testing.T) {
	for _, h := range []string{"Authorization", "Cookie", "X-Amz-Security-Token", "X-Api-Key", "Private-Token", "X-Auth-Token", "X-Access-Key"} {
		if !fetchers.IsCredentialHeader(h) {
			t.Errorf("%s: not a credential", h)
		}
	}
	for _, h := range []string{"Range", "If-Range", "User-Agent", "Accept-Encoding", "X-Amz-Content-Sha256", "X-Amz-Date"} {
		if fetchers.IsCredentialHeader(h) {
			t.Errorf("%s: a credential", h)
		}
	}
}

// redirector answers /self with a redirect to /final in its own origin,
// ?to=URL with a redirect to URL (with carry=1 it carries its query on,
// and adds a credential it minted for the target), and the rest with ok.
func redirector(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	switch {
	case r.URL.Path == "/self":
		http.Redirect(w, r, "/final", http.StatusFound)
	case q.Get("to") != "":
		to := q.Get("to")
		if q.Get("carry") != "" {
			q.Del("to")
			q.Set("X-Amz-Credential", "MINTED")
			to += "?" + q.Encode()
		}
		http.Redirect(w, r, to, http.StatusTemporaryRedirect)
	default:
		io.WriteString(w, "ok")
	}
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestRedirectCredentialsStayAtTheirOrigin: a request's credentials
// (headers, userinfo, a query signature) reach its origin and redirects
// within it, and never a redirect to another host (127.0.0.2), another
// port of the same host, or http from https; a credential the origin
// minted for the target is kept. A RoundTripper above the guard that
// adds Authorization by host alone (go-containerregistry's) is stripped
// too.
func TestRedirectCredentialsStayAtTheirOrigin(t *testing.T) {
	otherHost := testenv.ServeOrigin(t, "127.0.0.2", http.HandlerFunc(redirector))
	otherPort := testenv.ServeOrigin(t, "127.0.0.1", http.HandlerFunc(redirector))
	plain := testenv.ServeOrigin(t, "127.0.0.1", http.HandlerFunc(redirector))
	secure := testenv.NewOrigin(http.HandlerFunc(redirector))
	secure.Server = httptest.NewTLSServer(secure)
	t.Cleanup(secure.Close)
	tr := secure.Client().Transport.(*http.Transport) // trusts secure's certificate
	client := func(above func(*http.Request)) *http.Client {
		rt := fetchers.Guard{}.Transport(tr, nil)
		if above != nil {
			inner := rt
			rt = roundTripperFunc(func(r *http.Request) (*http.Response, error) { above(r); return inner.RoundTrip(r) })
		}
		return &http.Client{Transport: rt, CheckRedirect: fetchers.DropAuthAcrossOrigins}
	}
	const secret = "S3CRET-TOKEN"
	get := func(t *testing.T, c *http.Client, u string, withHeaders bool) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, u, nil)
		if withHeaders {
			req.Header.Set("Authorization", "Bearer "+secret)
			req.Header.Set("X-Api-Key", secret)
			req.Header.Set("Cookie", "session="+secret)
			req.Header.Set("X-Amz-Security-Token", secret)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", u, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s", u, resp.Status)
		}
	}
	basic := base64.StdEncoding.EncodeToString([]byte("user:" + secret))
	userinfo := func(u string) string { return strings.Replace(u, "://", "://user:"+secret+"@", 1) }
	for _, tc := range []struct {
		name   string
		from   *testenv.Origin
		to     *testenv.Origin
		userin bool // the credential is the URL's userinfo, not headers
	}{
		{"another host", plain, otherHost, false},
		{"another port", plain, otherPort, false},
		{"http from https", secure, otherPort, false},
		{"another host, userinfo", plain, otherHost, true},
		{"another port, userinfo", plain, otherPort, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := tc.from.URL + "/go?carry=1&X-Amz-Signature=" + secret + "&part=7&to=" + url.QueryEscape(tc.to.URL+"/landed")
			if tc.userin {
				u = userinfo(u)
			}
			get(t, client(nil), u, !tc.userin)
			if !tc.to.Saw("/landed ?") || !tc.to.Saw("part=7") || !tc.to.Saw("MINTED") {
				t.Fatalf("the redirect did not land as asked: %q", tc.to.Seen())
			}
			if tc.to.Saw(secret) || tc.to.Saw(basic) || tc.to.Saw("Authorization") {
				t.Fatalf("a credential reached the second origin: %q", tc.to.Seen())
			}
			want := "/go Authorization=Bearer " + secret
			if tc.userin {
				want = "/go Authorization=Basic " + basic
			}
			if !tc.from.Saw(want) {
				t.Fatalf("the credential did not reach its origin: %q", tc.from.Seen())
			}
			// Within the origin it still goes; through the second origin
			// and back, the second sees none (Go then keeps Authorization
			// and Cookie away from the first too).
			get(t, client(nil), userinfo(tc.from.URL+"/self"), false)
			get(t, client(nil), tc.from.URL+"/there?to="+url.QueryEscape(tc.to.URL+"/back?to="+url.QueryEscape(tc.from.URL+"/home")), true)
			if !tc.from.Saw("/final Authorization=Basic "+basic) || !tc.from.Saw("/home") || !tc.to.Saw("/back") || tc.to.Saw(secret) {
				t.Fatalf("origin saw %q; second origin saw %q", tc.from.Seen(), tc.to.Seen())
			}
		})
	}
	// A transport above the guard that adds Authorization by host alone
	// (go-containerregistry's does, ignoring the port and scheme).
	byHost := func(r *http.Request) {
		if r.URL.Hostname() == "127.0.0.1" {
			r.Header.Set("Authorization", "Bearer "+secret)
		}
	}
	get(t, client(byHost), secure.URL+"/go?to="+url.QueryEscape(otherPort.URL+"/byhost"), false)
	if !otherPort.Saw("/byhost") || otherPort.Saw(secret) {
		t.Fatalf("another port of the host: %q", otherPort.Seen())
	}
}

// A client made WithoutRedirects follows no redirect, not even one to its
// own origin, and says so with ErrRedirect (Permanent: a retry gets the
// same answer); the target is never asked.
func TestWithoutRedirectsRefusesEveryRedirect(t *testing.T) {
	var targetHits int
	mux := http.NewServeMux()
	mux.HandleFunc("/target", func(w http.ResponseWriter, r *http.Request) { targetHits++ })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/target", http.StatusFound) })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	var o fetchers.HTTPOptions
	o.Apply(fetchers.WithoutRedirects())
	resp, err := o.Client().Get(srv.URL + "/start")
	if err == nil {
		resp.Body.Close()
		t.Fatalf("a redirect was followed (status %d)", resp.StatusCode)
	}
	if !errors.Is(err, fetchers.ErrRedirect) || !fetchers.IsPermanent(err) {
		t.Fatalf("error %v: want a Permanent ErrRedirect", err)
	}
	if !strings.Contains(err.Error(), "/target") {
		t.Errorf("error %q does not name where the redirect led", err)
	}
	if targetHits != 0 {
		t.Errorf("the redirect's target was asked %d times", targetHits)
	}
	// The default client still follows it.
	resp, err = fetchers.DefaultHTTPOptions().Client().Get(srv.URL + "/start")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if targetHits != 1 {
		t.Errorf("the default client reached the target %d times, want 1", targetHits)
	}
}
