package ngc

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/fetchers/ngc/ngctest"
	"github.com/modelcache/modelcache/internal/testenv"
)

const testKey = "k3y-0f-the-test-ngc-4711"

func TestParseURI(t *testing.T) {
	for _, tc := range []struct {
		uri  string
		want Ref
		ok   bool
	}{
		{"ngc://nvidia/nemo/llama:1.0", Ref{"nvidia", "nemo", "llama", "1.0"}, true},
		{"ngc://nvidia/llama:2", Ref{"nvidia", "", "llama", "2"}, true},
		{"ngc://nvidia/nemo/llama", Ref{"nvidia", "nemo", "llama", ""}, true},
		{"ngc://nvidia/llama", Ref{"nvidia", "", "llama", ""}, true},
		{"ngc://nvidia", Ref{}, false},
		{"ngc://a/b/c/d", Ref{}, false},
		{"ngc://a/../c", Ref{}, false},
		{"ngc://a/b:", Ref{}, false},
		{"ngc://a/b:1+x", Ref{}, false},
		{"ngc://a/b:../x", Ref{}, false},
		{"ngc://a//b", Ref{}, false},
		{"hf://a/b", Ref{}, false},
	} {
		got, err := ParseURI(tc.uri)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseURI(%q) = %+v, %v", tc.uri, got, err)
		}
		if err == nil && got.String() != tc.uri {
			t.Errorf("String() = %q, want %q", got.String(), tc.uri)
		}
	}
	// "no-team" is the ngc CLI's spelling of no team.
	if got, err := ParseURI("ngc://nvidia/no-team/llama:1"); err != nil || got != (Ref{"nvidia", "", "llama", "1"}) {
		t.Errorf("no-team: %+v %v", got, err)
	}
}

// reg starts a registry and a fetcher of it; errs collects every error
// string the test sees, to check the key is in none.
type reg struct {
	t    *testing.T
	s    *ngctest.Server
	errs []string
}

func newReg(t *testing.T) *reg {
	s := ngctest.New()
	t.Cleanup(s.Close)
	r := &reg{t: t, s: s}
	t.Cleanup(func() {
		for _, e := range r.errs {
			if strings.Contains(e, testKey) {
				t.Errorf("the API key is in an error: %s", e)
			}
		}
	})
	return r
}

func (r *reg) fetcher(key string, opts ...Option) *Fetcher {
	r.t.Helper()
	f, err := New(append([]Option{WithAPIEndpoint(r.s.API.URL), WithAuthEndpoint(r.s.Auth.URL), WithAPIKey(key), WithAPIKeyFile(""), WithPageSize(500)}, opts...)...)
	if err != nil {
		r.t.Fatal(err)
	}
	return f
}

func (r *reg) note(err error) error {
	if err != nil {
		r.errs = append(r.errs, err.Error())
	}
	return err
}

func (r *reg) readAll(f *Fetcher, fl fetchers.File, off int64) []byte {
	r.t.Helper()
	rc, err := f.Open(context.Background(), fl, off)
	if r.note(err) != nil {
		r.t.Fatalf("open %s: %v", fl.Path, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if r.note(err) != nil {
		r.t.Fatalf("read %s: %v", fl.Path, err)
	}
	return b
}

func files(n int) map[string][]byte {
	out := map[string][]byte{}
	for i := 0; i < n; i++ {
		b := bytes.Repeat([]byte{byte('a' + i)}, 1000+i)
		out[string(rune('a'+i))+"/w"+string(rune('0'+i))+".bin"] = b
	}
	return out
}

func TestResolvePinnedPaginated(t *testing.T) {
	r := newReg(t)
	fs := files(5)
	r.s.AddVersion("nvidia/nemo/tiny", "1.0", fs, true, true)
	r.s.AddVersion("nvidia/nemo/tiny", "2.0", files(1), true, true)
	f := r.fetcher("")
	res, err := f.Resolve(context.Background(), fetchers.Source{URI: "ngc://nvidia/nemo/tiny:1.0"})
	if r.note(err) != nil {
		t.Fatal(err)
	}
	if res.Revision != "1.0" || len(res.Files) != 5 {
		t.Fatalf("resolve: revision %q, %d files; want 1.0 and 5 over 3 pages", res.Revision, len(res.Files))
	}
	for _, fl := range res.Files {
		b := fs[fl.Path]
		if fl.Size != int64(len(b)) || fl.Digest != "sha256:"+ngctest.Sum(b) {
			t.Fatalf("%s: size %d digest %s", fl.Path, fl.Size, fl.Digest)
		}
		if got := r.readAll(f, fl, 0); !bytes.Equal(got, b) {
			t.Fatalf("%s: wrong bytes", fl.Path)
		}
		if got := r.readAll(f, fl, 100); !bytes.Equal(got, b[100:]) {
			t.Fatalf("%s from 100: wrong bytes", fl.Path)
		}
	}
	if r.s.RangeGets.Load() != 5 {
		t.Fatalf("%d Range requests reached storage; want one per resumed file", r.s.RangeGets.Load())
	}
	if n := r.s.ListPages.Load(); n != 3 {
		t.Fatalf("%d listing pages read; want pages 0, 1 and 2 of 2 files each", n)
	}
	if m, p := r.s.ManifestRequests.Load(), r.s.PerFileRequests.Load(); m != 5 || p != 0 {
		t.Fatalf("%d URL manifest answers, %d per-file downloads; want one presigned URL per file, kept for its resume, and no deprecated path", m, p)
	}
	if r.s.TokenRequests.Load() != 0 || r.s.StorageSawAuth.Load() {
		t.Fatal("a public model without a key asked for a token or sent credentials to storage")
	}
	// The latest version is resolved once, to its name.
	res, err = f.Resolve(context.Background(), fetchers.Source{URI: "ngc://nvidia/nemo/tiny"})
	if r.note(err) != nil || res.Revision != "2.0" || len(res.Files) != 1 {
		t.Fatalf("latest: %+v %v", res, err)
	}
}

// TestVersionOfExactlyOnePage: a version whose files fill page 0 and no
// more is read from page 0 alone.
func TestVersionOfExactlyOnePage(t *testing.T) {
	r := newReg(t)
	r.s.PageSize = 3
	fs := files(3)
	r.s.AddVersion("nvidia/one", "1", fs, true, true)
	var pages []string
	r.s.Hook = func(w http.ResponseWriter, q *http.Request) bool {
		if strings.HasSuffix(q.URL.Path, "/versions/1/files") {
			pages = append(pages, q.URL.Query().Get("page-number")+"/"+q.URL.Query().Get("page-size"))
		}
		return false
	}
	res, err := r.fetcher("").Resolve(context.Background(), fetchers.Source{URI: "ngc://nvidia/one:1"})
	if r.note(err) != nil || len(res.Files) != 3 {
		t.Fatalf("one page: %+v %v", res, err)
	}
	if len(pages) != 1 || pages[0] != "0/500" {
		t.Fatalf("listing requests (page-number/page-size) %v; want page 0 once, of the size asked for", pages)
	}
}

func TestListingWithoutDigestsAndShortListings(t *testing.T) {
	r := newReg(t)
	r.s.AddVersion("org/m", "v1", files(3), true, false)
	var logs bytes.Buffer
	f := r.fetcher("", WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	res, err := f.Resolve(context.Background(), fetchers.Source{URI: "ngc://org/m:v1"})
	if r.note(err) != nil || len(res.Files) != 3 || res.Files[0].Digest != "" || res.Files[0].Size != 1000 {
		t.Fatalf("size-only listing: %+v %v", res, err)
	}
	if n := strings.Count(logs.String(), "only its size is checked"); n != 3 {
		t.Fatalf("%d log lines say a file is checked by size only; want one per file:\n%s", n, logs.String())
	}
	// sha256_base64 is read as the base64 of the sha256; anything else is
	// the source contradicting itself.
	b := []byte("x")
	r.s.AddVersion("org/b64", "v1", map[string][]byte{"x": b}, true, true)
	res, err = f.Resolve(context.Background(), fetchers.Source{URI: "ngc://org/b64:v1"})
	if r.note(err) != nil || res.Files[0].Digest != "sha256:"+ngctest.Sum(b) {
		t.Fatalf("sha256_base64: %+v %v", res, err)
	}
	r.s.EditListing("org/b64", "v1", func(l []ngctest.File) []ngctest.File { l[0].SHA256Base64 = ngctest.Sum(b); return l })
	_, err = f.Resolve(context.Background(), fetchers.Source{URI: "ngc://org/b64:v1"})
	if r.note(err) == nil || !fetchers.IsPermanent(err) || !errors.Is(err, fetchers.ErrInconsistent) {
		t.Fatalf("hex where base64 belongs passed: %v", err)
	}
	// A listing that holds fewer files than the version counts (pages
	// lost) is refused, not committed as a partial model.
	r.s.AddVersion("org/short", "v1", files(3), true, false)
	r.s.Hook = func(w http.ResponseWriter, q *http.Request) bool {
		if strings.HasSuffix(q.URL.Path, "/files") && q.URL.Query().Get("page-number") == "1" {
			w.Write([]byte(`{"modelFiles":[],"paginationInfo":{"totalPages":2}}`))
			return true
		}
		return false
	}
	_, err = f.Resolve(context.Background(), fetchers.Source{URI: "ngc://org/short:v1"})
	if r.note(err) == nil || !strings.Contains(err.Error(), "the file listing holds 2 files but the version says 3") || !errors.Is(err, fetchers.ErrInconsistent) || !fetchers.IsPermanent(err) {
		t.Fatalf("short listing: %v; want ErrInconsistent", err)
	}
}

func TestPrivateModelKeyAndScopes(t *testing.T) {
	r := newReg(t)
	fs := files(2)
	r.s.AddVersion("acme/research/secret", "3", fs, false, true)
	r.s.Keys[testKey] = []string{"group/ngc:acme", "group/ngc:acme/research"}
	r.s.Keys["other-org-key"] = []string{"group/ngc:acme"}
	src := fetchers.Source{URI: "ngc://acme/research/secret:3"}
	ctx := context.Background()

	_, err := r.fetcher("").Resolve(ctx, src)
	if r.note(err); !errors.Is(err, fetchers.ErrUnauthorized) || !fetchers.IsPermanent(err) || !strings.Contains(err.Error(), "no NGC API key is set") ||
		!strings.Contains(err.Error(), "NGC_API_KEY") || !strings.Contains(err.Error(), `org "acme"`) {
		t.Fatalf("a private model without a key: %v; want a permanent error naming NGC_API_KEY and org acme", err)
	}
	_, err = r.fetcher("wrong").Resolve(ctx, src)
	if r.note(err); !errors.Is(err, fetchers.ErrUnauthorized) || !strings.Contains(err.Error(), "rejected NGC_API_KEY") {
		t.Fatalf("a wrong key: %v", err)
	}
	_, err = r.fetcher("other-org-key").Resolve(ctx, src)
	if r.note(err); !errors.Is(err, fetchers.ErrUnauthorized) || !strings.Contains(err.Error(), "group/ngc:acme/research") || !strings.Contains(err.Error(), `team "research"`) {
		t.Fatalf("a key without the team scope: %v", err)
	}

	f := r.fetcher(testKey)
	res, err := f.Resolve(ctx, src)
	if r.note(err) != nil {
		t.Fatal(err)
	}
	for _, fl := range res.Files {
		if !bytes.Equal(r.readAll(f, fl, 0), fs[fl.Path]) {
			t.Fatalf("%s differs", fl.Path)
		}
	}
	if r.s.StorageSawAuth.Load() {
		t.Fatal("the bearer token crossed to the storage origin")
	}
	if n := r.s.TokenRequests.Load(); n != 3 {
		t.Fatalf("%d token requests; want 1 for the good key (cached across resolve and downloads) + 2 for the refused ones", n)
	}
}

func TestTokenRefreshedBeforeExpiryAndAfterRevocation(t *testing.T) {
	r := newReg(t)
	r.s.AddVersion("acme/m", "1", files(1), false, false)
	r.s.Keys[testKey] = []string{"group/ngc:acme"}
	var mu sync.Mutex
	now := time.Unix(1e9, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	f := r.fetcher(testKey, WithClock(clock))
	ctx := context.Background()
	res, err := f.Resolve(ctx, fetchers.Source{URI: "ngc://acme/m:1"})
	if r.note(err) != nil {
		t.Fatal(err)
	}
	mu.Lock()
	now = now.Add(r.s.TokenTTL - 30*time.Second) // within the last minute
	mu.Unlock()
	r.readAll(f, res.Files[0], 0)
	if n := r.s.TokenRequests.Load(); n != 2 {
		t.Fatalf("%d token requests; want a new token a minute before expiry", n)
	}
	r.s.RevokeTokens()
	if _, err := f.Resolve(ctx, fetchers.Source{URI: "ngc://acme/m:1"}); r.note(err) != nil {
		t.Fatalf("after revocation: %v; want one retry with a new token", err)
	}
	// The URL manifest refused with 401 gets a new token and asks again.
	r.s.RevokeTokens()
	before := r.s.TokenRequests.Load()
	r.readAll(f, fetchers.File{Path: res.Files[0].Path, Size: res.Files[0].Size, Locator: res.Files[0].Locator + "&x=1"}, 0)
	if r.s.TokenRequests.Load() != before+1 {
		t.Fatal("the manifest's 401 did not fetch a new token")
	}
	// The deprecated per-file path (where the manifest is refused): a 401
	// is retryable, and the retry gets a new token.
	r.s.RefuseManifest = true
	f = r.fetcher(testKey, WithClock(clock))
	if res, err = f.Resolve(ctx, fetchers.Source{URI: "ngc://acme/m:1"}); r.note(err) != nil {
		t.Fatal(err)
	}
	r.s.RevokeTokens()
	rc, err := f.Open(ctx, res.Files[0], 0)
	if r.note(err) == nil || fetchers.IsPermanent(err) {
		t.Fatalf("a download refused with 401: %v; want a retryable error", err)
	} else if rc != nil {
		rc.Close()
	}
	r.readAll(f, res.Files[0], 0) // the retry gets a new token
}

func TestErrorsNameTheRemedy(t *testing.T) {
	r := newReg(t)
	r.s.AddVersion("org/m", "1", files(1), true, true)
	f := r.fetcher("")
	ctx := context.Background()
	for _, c := range []struct{ uri, want string }{
		{"ngc://org/none", "no model none"},
		{"ngc://org/m:9", `no version "9"`},
		{"ngc://org/t/m:1", `no version "1"`},
		{"ngc://org/m/x/y", "write ngc://<org>[/<team>]/<model>[:<version>]"},
	} {
		_, err := f.Resolve(ctx, fetchers.Source{URI: c.uri})
		if r.note(err); !fetchers.IsPermanent(err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want a permanent error with %q", c.uri, err, c.want)
		}
	}
	// A file listed but not served.
	r.s.EditListing("org/m", "1", func(l []ngctest.File) []ngctest.File {
		return append(l, ngctest.File{Path: "ghost.bin", SizeInBytes: 3})
	})
	res, err := f.Resolve(ctx, fetchers.Source{URI: "ngc://org/m:1"})
	if r.note(err) != nil {
		t.Fatal(err)
	}
	for _, fl := range res.Files {
		if fl.Path == "ghost.bin" {
			_, err := f.Open(ctx, fl, 0)
			if r.note(err); !errors.Is(err, fetchers.ErrNotFound) || !strings.Contains(err.Error(), "does not serve it") {
				t.Fatalf("missing file: %v", err)
			}
		}
	}
}

func TestTooManyRequestsHonoursRetryAfter(t *testing.T) {
	r := newReg(t)
	r.s.AddVersion("org/m", "1", files(1), true, true)
	var hits int
	r.s.Hook = func(w http.ResponseWriter, q *http.Request) bool {
		if strings.HasSuffix(q.URL.Path, "/versions/1") && hits < 2 {
			hits++
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(http.StatusTooManyRequests)
			return true
		}
		return false
	}
	f := r.fetcher("")
	var waits []time.Duration
	b := fetchers.Backoff{Initial: time.Millisecond, Max: time.Millisecond, Attempts: 5, MaxRetryAfter: time.Minute,
		Sleep: func(ctx context.Context, d time.Duration) error { waits = append(waits, d); return nil }}
	var res *fetchers.Resolved
	err := b.Do(context.Background(), func(int) error {
		var err error
		res, err = f.Resolve(context.Background(), fetchers.Source{URI: "ngc://org/m:1"})
		if err != nil && !strings.Contains(err.Error(), "NGC rate limit") {
			t.Errorf("429 not named: %v", err)
		}
		return r.note(err)
	}, nil)
	if err != nil || res.Revision != "1" {
		t.Fatalf("%v", err)
	}
	if len(waits) != 2 || waits[0] != 7*time.Second || waits[1] != 7*time.Second {
		t.Fatalf("waits %v; want the server's Retry-After of 7s twice", waits)
	}
}

func TestKeyFromFileAndEnvironment(t *testing.T) {
	dir := t.TempDir()
	p := dir + "/key"
	if err := os.WriteFile(p, []byte(testKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("NGC_API_KEY", "")
	t.Setenv("NGC_CLI_API_KEY", "")
	t.Setenv("NGC_API_KEY_FILE", p)
	f, err := New()
	if err != nil || f.key != testKey {
		t.Fatalf("key file: %v", err)
	}
	t.Setenv("NGC_CLI_API_KEY", "cli-key")
	t.Setenv("NGC_API_KEY", "api-key")
	if f, _ := New(); f.key != "cli-key" {
		t.Fatal("NGC_CLI_API_KEY not preferred over NGC_API_KEY, as the ngc CLI prefers it")
	}
	if _, err := New(WithAPIKey(""), WithAPIKeyFile(dir)); err == nil || strings.Contains(err.Error(), testKey) {
		t.Fatalf("a directory as key file: %v", err)
	}
	if _, err := New(WithAPIEndpoint("ftp://x")); err == nil || !strings.Contains(err.Error(), "NGC_API_ENDPOINT") {
		t.Fatalf("a bad endpoint: %v", err)
	}
}

func TestParallelRangesWithTokenMatchOneStream(t *testing.T) {
	r := newReg(t)
	big := make([]byte, 7<<20+777)
	for i := range big {
		big[i] = byte(i*13 + i>>9)
	}
	r.s.AddVersion("acme/big", "1", map[string][]byte{"w.bin": big}, false, true)
	r.s.Keys[testKey] = []string{"group/ngc:acme"}
	f := r.fetcher(testKey, WithHTTP(fetchers.WithConnections(3), fetchers.WithChunk(1<<20), fetchers.WithRangeBelow(math.Inf(1))))
	res, err := f.Resolve(context.Background(), fetchers.Source{URI: "ngc://acme/big:1"})
	if r.note(err) != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 1<<20 + 5} {
		before := r.s.StorageGets.Load()
		if got := r.readAll(f, res.Files[0], off); !bytes.Equal(got, big[off:]) {
			t.Fatalf("from %d: not the file", off)
		}
		if n := r.s.StorageGets.Load() - before; n < 3 {
			t.Fatalf("from %d: %d requests; want the stream, then one per 1 MiB chunk", off, n)
		}
	}
	if r.s.StorageSawAuth.Load() {
		t.Fatal("a token reached storage")
	}
}

// TestRedirectToInternalRefused: a registry (127.0.0.2 stands in for a
// remote one) whose download redirects to an address of this node is not
// followed.
func TestRedirectToInternalRefused(t *testing.T) {
	r := newReg(t)
	r.s.AddVersion("org/m", "1", files(1), true, true)
	api := testenv.ServeOn(t, "127.0.0.2", r.s.API.Config.Handler)
	remote := func(ip netip.Addr) bool { return ip != netip.MustParseAddr("127.0.0.2") && fetchers.IsInternal(ip) }
	f, err := New(WithAPIEndpoint(api.URL), WithAuthEndpoint(r.s.Auth.URL), WithAPIKey(""), WithHTTP(fetchers.WithInternal(remote)))
	if err != nil {
		t.Fatal(err)
	}
	res, err := f.Resolve(context.Background(), fetchers.Source{URI: "ngc://org/m:1"})
	if r.note(err) != nil {
		t.Fatal(err)
	}
	_, err = f.Open(context.Background(), res.Files[0], 0)
	if r.note(err); !errors.Is(err, fetchers.ErrInternalAddress) || !fetchers.IsPermanent(err) {
		t.Fatalf("a presigned URL to loopback: %v; want a permanent refusal", err)
	}
	// The same through the deprecated per-file path's redirect.
	r.s.RefuseManifest = true
	_, err = f.Open(context.Background(), res.Files[0], 0)
	if r.note(err); !errors.Is(err, fetchers.ErrInternalAddress) || !fetchers.IsPermanent(err) {
		t.Fatalf("a download redirected to loopback: %v; want a permanent refusal", err)
	}
}
