package fetchers_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/fetchers"
)

func TestRedactURI(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"https://huggingface.co/x/y", "https://huggingface.co/x/y"},
		{"http://user:pass@host:8080/m/w.bin?token=SECRET&X-Amz-Signature=SECRET2&part=1#sha256=ab",
			"http://REDACTED@host:8080/m/w.bin?token=REDACTED&X-Amz-Signature=REDACTED&part=1#sha256=ab"},
		{"https://ghp_TOKEN@github.com/o/r", "https://REDACTED@github.com/o/r"},
		{"https://u:p%40ss@h/x", "https://REDACTED@h/x"},
		{"https://u:p@ss@h/x", "https://REDACTED@h/x"},
		{"https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIA%2F2024&X-Amz-Date=20240101T000000Z&X-Amz-Expires=900&X-Amz-SignedHeaders=host&X-Amz-Security-Token=FwoG&X-Amz-Signature=abc",
			"https://b.s3.amazonaws.com/k?X-Amz-Algorithm=REDACTED&X-Amz-Credential=REDACTED&X-Amz-Date=REDACTED&X-Amz-Expires=REDACTED&X-Amz-SignedHeaders=REDACTED&X-Amz-Security-Token=REDACTED&X-Amz-Signature=REDACTED"},
		{"https://a.blob.core.windows.net/c/w.bin?sv=2022-11-02&ss=b&srt=o&sp=r&se=2030-01-01T00:00:00Z&st=2024-01-01&spr=https&sig=abc%3D",
			"https://a.blob.core.windows.net/c/w.bin?sv=REDACTED&ss=REDACTED&srt=REDACTED&sp=REDACTED&se=REDACTED&st=REDACTED&spr=REDACTED&sig=REDACTED"},
		{"https://storage.googleapis.com/b/o?X-Goog-Algorithm=GOOG4&X-Goog-Signature=f00&GoogleAccessId=sa&Expires=1&Signature=s",
			"https://storage.googleapis.com/b/o?X-Goog-Algorithm=REDACTED&X-Goog-Signature=REDACTED&GoogleAccessId=REDACTED&Expires=1&Signature=REDACTED"},
		{"https://d.cloudfront.net/w?Policy=p&Key-Pair-Id=k&Signature=s", "https://d.cloudfront.net/w?Policy=REDACTED&Key-Pair-Id=REDACTED&Signature=REDACTED"},
		{"https://h/x?TOKEN=a&Access_Token=b&api_key=c&apikey=d&key=e&password=f&secret=g&hf_token=h&client_secret=i", "https://h/x?TOKEN=REDACTED&Access_Token=REDACTED&api_key=REDACTED&apikey=REDACTED&key=REDACTED&password=REDACTED&secret=REDACTED&hf_token=REDACTED&client_secret=REDACTED"},
		{"https://h/x?%74oken=a", "https://h/x?%74oken=REDACTED"}, // percent-encoded key
		{"http://cdn/m.bin?auth_key=1-0-0-abc&sign=def&hdnts=exp~hmac&code=xyz&part=2", "http://cdn/m.bin?auth_key=REDACTED&sign=REDACTED&hdnts=REDACTED&code=REDACTED&part=2"}, // CDN URL signing
		{"https://h/x?token=", "https://h/x?token="},
		{"https://h/x?token", "https://h/x?token"},
		{"https://h/cb#access_token=abc&state=s", "https://h/cb#access_token=REDACTED&state=s"},
		{"https://h/x?a=1;sig=abc", "https://h/x?a=1;sig=REDACTED"},
		{"https://h/x?token=a b&c=d", "https://h/x?token=REDACTED&c=d"}, // a URI is one value: spaces belong to it
		{"hf://gpt2@main", "hf://gpt2@main"},                            // a revision, not a user
		{"hf://org/repo@v1.0", "hf://org/repo@v1.0"},                    // idem
		{"hf://user:tok@org/repo", "hf://REDACTED@org/repo"},            // a colon: credentials
		{"oci://ghcr.io/o/kc@sha256:0123", "oci://ghcr.io/o/kc@sha256:0123"},
		{"s3://bucket/prefix/", "s3://bucket/prefix/"},
		{"file:///models/llama", "file:///models/llama"},
		{"", ""},
	} {
		if got := fetchers.RedactURI(tc.in); got != tc.want {
			t.Errorf("RedactURI(%q)\n = %q\nwant %q", tc.in, got, tc.want)
		}
		if got := fetchers.RedactURI(fetchers.RedactURI(tc.in)); got != tc.want {
			t.Errorf("RedactURI is not idempotent on %q: %q", tc.in, got)
		}
	}
}

func TestRedactText(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`resolve http://u:p@h/x?token=S: GET "http://u:***@h/x?token=S&X-Amz-Signature=S2": EOF`,
			`resolve http://REDACTED@h/x?token=REDACTED: GET "http://REDACTED@h/x?token=REDACTED&X-Amz-Signature=REDACTED": EOF`},
		{`source "https://h/x?a=\"&token=S": invalid`, `source "https://h/x?a=\"&token=REDACTED": invalid`},
		{"see <https://u:p@h/x?sig=S> now", "see <https://REDACTED@h/x?sig=REDACTED> now"},
		{"ref src:https://h/w.bin?token=S#w.bin", "ref src:https://h/w.bin?token=REDACTED#w.bin"},
		{"nothing here: a=b, c@d", "nothing here: a=b, c@d"},
		{"key=value pairs outside a URL stay", "key=value pairs outside a URL stay"},
		{"two: http://a:b@h1/ and https://c@h2/?key=K", "two: http://REDACTED@h1/ and https://REDACTED@h2/?key=REDACTED"},
		{"hf://gpt2@main: not found", "hf://gpt2@main: not found"},
	} {
		if got := fetchers.RedactText(tc.in); got != tc.want {
			t.Errorf("RedactText(%q)\n = %q\nwant %q", tc.in, got, tc.want)
		}
	}
}

func TestRedactHandler(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(fetchers.RedactHandler(slog.NewJSONHandler(&buf, nil)))
	log = slog.New(fetchers.RedactHandler(log.Handler())) // twice is once
	uri := "http://user:pass@h/x?token=SECRET1&X-Amz-Signature=SECRET2"
	log.With("source", uri).WithGroup("g").Info("pull "+uri, "uri", uri,
		"err", fmt.Errorf("GET %q: %w", uri, errors.New("EOF")), "list", []string{uri}, "n", 3,
		slog.Group("inner", "u", uri))
	out := buf.String()
	for _, s := range []string{"SECRET1", "SECRET2", "pass"} {
		if strings.Contains(out, s) {
			t.Fatalf("%q in the log: %s", s, out)
		}
	}
	if strings.Count(out, "http://REDACTED@h/x?token=REDACTED") != 6 || !strings.Contains(out, `"n":3`) {
		t.Fatalf("log: %s", out)
	}
}

// FuzzRedact: RedactURI and RedactText are idempotent on any input, a
// secret (a password, a secret parameter's value) never survives either,
// and the parts that are not secret are kept.
func FuzzRedact(f *testing.F) {
	f.Add("http://user:pass@host/x?token=SECRET&X-Amz-Signature=SECRET2", "u", "p", "host.example", "/m/w.bin", "part", "1", uint8(0), "v", "GET \"", "\": EOF")
	f.Add("hf://gpt2@main", "", "", "h", "/", "a", "", uint8(3), "x y", "", "")
	f.Add("https://h/x?a=\"&token=S", "ghp_x", "", "h:8080", "/a b/c", "sv", "2022", uint8(7), "%", "(", ")")
	f.Add("src:https://h/w.bin?token=S#w.bin&sig=x", "u@v", "p:q", "[::1]:80", "", "next", "http://u:p@h/", uint8(12), "'", "<", ">")
	secretKeys := []string{"token", "access_token", "X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token", "x-goog-signature",
		"Signature", "sig", "key", "api_key", "apikey", "password", "secret", "Policy", "Key-Pair-Id", "se", "sp", "sv", "AWSAccessKeyId", "hf_token"}
	schemes := []string{"http", "https", "s3", "oci", "hf"}
	f.Fuzz(func(t *testing.T, text, user, pass, host, path, key, val string, pick uint8, secret, before, after string) {
		for _, s := range []string{text, before + text + after} {
			if r := fetchers.RedactURI(s); fetchers.RedactURI(r) != r {
				t.Fatalf("RedactURI not idempotent: %q -> %q -> %q", s, r, fetchers.RedactURI(r))
			}
			if r := fetchers.RedactText(s); fetchers.RedactText(r) != r {
				t.Fatalf("RedactText not idempotent: %q -> %q -> %q", s, r, fetchers.RedactText(r))
			}
			if !strings.ContainsAny(s, "=@") && (fetchers.RedactText(s) != s || fetchers.RedactURI(s) != s) {
				t.Fatalf("%q has no secret but changed", s)
			}
		}

		// A URL built from the parts, with a secret parameter and a password.
		const mark, pmark = "S3CR3T", "P4SSW0RD"
		for _, s := range []string{text, user, pass, host, path, key, val, before, after} {
			if strings.Contains(s, mark) || strings.Contains(s, pmark) || strings.Contains(s, fetchers.Redacted) {
				t.Skip()
			}
		}
		host = strings.Map(func(r rune) rune {
			if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '-' {
				return r
			}
			return -1
		}, strings.ToLower(host))
		if host == "" || key == "" || fetchers.IsSecretParam(key) || strings.ContainsAny(before+after, "=@") {
			t.Skip()
		}
		scheme := schemes[int(pick)%len(schemes)]
		sk := secretKeys[int(pick)%len(secretKeys)]
		secretVal := mark + secret
		u := url.URL{Scheme: scheme, Host: host, Path: "/" + strings.TrimPrefix(path, "/")}
		if scheme != "hf" {
			u.User = url.UserPassword(user, pmark+pass)
		}
		q := url.QueryEscape(key) + "=" + url.QueryEscape(val) + "&" + sk + "=" + url.QueryEscape(secretVal)
		u.RawQuery = q
		uri := u.String()
		keep := []string{host, u.EscapedPath(), url.QueryEscape(key) + "=" + url.QueryEscape(val)}
		for _, got := range []string{fetchers.RedactURI(uri), fetchers.RedactText(before + uri + after), fetchers.RedactText(fmt.Sprintf("GET %q: EOF", uri))} {
			if strings.Contains(got, mark) || strings.Contains(got, pmark) {
				t.Fatalf("a secret survived: %q -> %q", uri, got)
			}
			for _, k := range keep {
				if !strings.Contains(got, k) {
					t.Fatalf("%q lost %q: %q", uri, k, got)
				}
			}
		}
	})
}
