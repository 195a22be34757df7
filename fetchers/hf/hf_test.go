package hf

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	nethttp "net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
	"github.com/modelcache/modelcache/internal/testenv"
)

func TestParseURI(t *testing.T) {
	for _, tc := range []struct {
		uri, repo, rev string
		ok             bool
	}{
		{"hf://meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B", "main", true},
		{"hf://gpt2@v1.0", "gpt2", "v1.0", true},
		{"hf://org/repo@refs/pr/1", "org/repo", "refs/pr/1", true},
		{"hf://org/repo@" + strings.Repeat("a", 40), "org/repo", strings.Repeat("a", 40), true},
		{"hf://org/../etc", "", "", false},
		{"hf://org/repo/extra", "", "", false},
		{"hf://org--x/repo", "", "", false},
		{"hf://org/repo@../x", "", "", false},
		{"hf:///abs", "", "", false},
		{"https://org/repo", "", "", false},
	} {
		repo, rev, err := ParseURI(tc.uri)
		if (err == nil) != tc.ok || repo != tc.repo || rev != tc.rev {
			t.Errorf("ParseURI(%q) = %q %q %v", tc.uri, repo, rev, err)
		}
	}
}

func TestNextLinkStaysOnTheHub(t *testing.T) {
	ep := "https://hub.example"
	if u, err := nextLink(`<https://hub.example/api/models/a/tree/x?cursor=3>; rel="next"`, ep); err != nil || !strings.HasSuffix(u, "cursor=3") {
		t.Fatalf("same origin: %q %v", u, err)
	}
	if _, err := nextLink(`<https://evil.example/steal>; rel="next"`, ep); err == nil {
		t.Fatal("followed a next page on another origin (the token would go with it)")
	}
	if u, _ := nextLink(`<https://hub.example/x>; rel="prev"`, ep); u != "" {
		t.Fatal("took a prev link for next")
	}
}

func TestResolvePaginatedTree(t *testing.T) {
	hub := hubtest.New()
	defer hub.Close()
	hub.PageSize = 2
	files := map[string][]byte{"a.json": []byte("{}"), "b/c.json": []byte("[]"), "big.bin": make([]byte, 5000), "d/e/f.txt": []byte("f")}
	sha := hub.Commit("org/m", files, "main")
	f, err := New(WithEndpoint(hub.URL()), WithToken(""), WithTokenFile("/nonexistent"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := f.Resolve(context.Background(), fetchers.Source{URI: "hf://org/m"})
	if err != nil {
		t.Fatal(err)
	}
	if res.Revision != sha || len(res.Files) != 4 || res.Repo != "org/m" || res.Ref != "main" {
		t.Fatalf("resolve: %+v", res)
	}
	for _, fl := range res.Files {
		if fl.Path == "big.bin" && (fl.Digest == "" || fl.Check != nil) {
			t.Fatalf("an LFS file must carry its sha256: %+v", fl)
		}
		if fl.Path == "a.json" && (fl.Digest != "" || fl.Check == nil) {
			t.Fatalf("a git file must carry a git sha1 check: %+v", fl)
		}
	}
	if _, err := f.Resolve(context.Background(), fetchers.Source{URI: "hf://org/none"}); !errors.Is(err, fetchers.ErrNotFound) {
		t.Fatalf("missing repo: %v", err)
	}
}

func TestGitBlobCheck(t *testing.T) {
	b := []byte("hello\n")
	if err := GitBlobCheck("ce013625030ba8dba906f756967f9e9ca394464a", 6)(strings.NewReader(string(b))); err != nil {
		t.Fatalf("git hash-object of hello\\n: %v", err) // the id `git hash-object` prints
	}
	if err := GitBlobCheck("ce013625030ba8dba906f756967f9e9ca394464a", 6)(strings.NewReader("hellO\n")); err == nil {
		t.Fatal("wrong content passed")
	}
}

// TestParallelRangesMatchOneStream: a file whose stream is taken for the
// limit (WithRangeBelow(+Inf)) is read with Range
// requests after its first chunks, and the bytes are the file's.
func TestParallelRangesMatchOneStream(t *testing.T) {
	hub := hubtest.New()
	defer hub.Close()
	big := make([]byte, 9<<20+12345)
	for i := range big {
		big[i] = byte(i*7 + i>>11)
	}
	hub.Commit("org/big", map[string][]byte{"w.bin": big}, "main")
	f, err := New(WithEndpoint(hub.URL()), WithToken(""), WithHTTP(fetchers.WithConnections(3), fetchers.WithChunk(1<<20), fetchers.WithRangeBelow(math.Inf(1))))
	if err != nil {
		t.Fatal(err)
	}
	res, err := f.Resolve(context.Background(), fetchers.Source{URI: "hf://org/big"})
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 3<<20 + 17} {
		before := hub.ResolveGets.Load()
		rc, err := f.Open(context.Background(), res.Files[0], off)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, big[off:]) {
			t.Fatalf("from %d: %d bytes, err %v: not the file", off, len(got), err)
		}
		if n := hub.ResolveGets.Load() - before; n < 4 {
			t.Fatalf("from %d: %d requests; want the stream, then one per 1 MiB chunk", off, n)
		}
	}
}

// TestRedirectToInternalRefused: a hub (127.0.0.2 stands in for a remote
// one) that redirects to an address of this node is not followed; one
// named on loopback keeps working (the other tests).
func TestRedirectToInternalRefused(t *testing.T) {
	inside := httptest.NewServer(nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		io.WriteString(w, `{"sha":"`+strings.Repeat("a", 40)+`"}`)
	}))
	defer inside.Close()
	hub := testenv.ServeOn(t, "127.0.0.2", nethttp.RedirectHandler(inside.URL+"/x", nethttp.StatusFound))
	remote := func(ip netip.Addr) bool { return ip != netip.MustParseAddr("127.0.0.2") && fetchers.IsInternal(ip) }
	f, err := New(WithEndpoint(hub.URL), WithToken("t"), WithHTTP(fetchers.WithInternal(remote)))
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Resolve(context.Background(), fetchers.Source{URI: "hf://org/repo"})
	if !errors.Is(err, fetchers.ErrInternalAddress) || !fetchers.IsPermanent(err) || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("Resolve through a redirect to loopback: %v; want a permanent refusal", err)
	}
}
