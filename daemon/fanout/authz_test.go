package fanout

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/k8ssync"
	p2p "github.com/modelcache/modelcache/peer"
)

// noSelection selects no node and knows no address.
type noSelection struct{}

func (noSelection) Selects(context.Context, string, string) (bool, error)         { return false, nil }
func (noSelection) From(context.Context, k8ssync.Bound, netip.Addr) (bool, error) { return false, nil }

// tokenFile writes a peer token to a file and returns its path.
func tokenFile(t testing.TB) string {
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	return tok
}

// testFetcher is a peer fetcher with defaults but a token.
func testFetcher(t testing.TB) *p2p.Fetcher {
	f, err := p2p.NewFetcher(p2p.NewTokenFile(tokenFile(t)))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// staticFleet is a static fleet's Fleet with no peers: every blob from
// the origin.
func staticFleet(t testing.TB) *Fleet {
	tok := tokenFile(t)
	cfg := DefaultConfig()
	cfg.Addr, cfg.Advertise, cfg.StaticTokenFile = "127.0.0.1:0", "http://127.0.0.1:1", tok
	f, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// storeTransfer is a Transfer of body into st, from an origin that
// serves body, for artifact name.
func storeTransfer(st *cachestore.Store, name string, body []byte) Transfer {
	sum := sha256.Sum256(body)
	b := p2p.Blob{Digest: cachestore.DigestPrefix + hex.EncodeToString(sum[:]), Size: int64(len(body))}
	return Transfer{
		Blob: b, Path: "w.bin", Revision: "r1", Started: time.Now(),
		Desire: func() api.Desire { return api.Desire{Name: name} },
		Open: func(ctx context.Context) (p2p.Partial, error) {
			return st.Writer(ctx, cachestore.WriterOpts{Ref: "test:" + b.Digest, Size: b.Size})
		},
		Origin: func(_ context.Context, off int64) (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(body[off:])), nil
		},
		Backoff: fetchers.Backoff{Attempts: 1},
	}
}

// TestAuthzKnowsWhatAFetchFetched: a blob Fetch committed is its
// artifact's from the moment it is committed (a downloading node serves
// it to the nodes that wait), and leaves that record once a version of
// the artifact holds it.
func TestAuthzKnowsWhatAFetchFetched(t *testing.T) {
	st, _, err := cachestore.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	access := &AccessTable{}
	access.Set(map[string]Access{"pub": {Public: true}})
	f := staticFleet(t)
	a := NewAuthz(st, access, noSelection{})
	f.authz = a
	w := bytes.Repeat([]byte("weights "), 500)
	d, waited, err := f.Fetch(context.Background(), storeTransfer(st, "pub", w))
	if err != nil || waited {
		t.Fatalf("fetch: %v (waited %v)", err, waited)
	}
	if got := a.Fresh(d); len(got) != 1 || got[0] != "pub" {
		t.Fatalf("fresh %v: the blob the fetch committed is not recorded as pub's", got)
	}
	if err := a.Authorize(context.Background(), p2p.Identity{User: "sa"}, d); err != nil {
		t.Fatalf("a public artifact's fresh blob: %v", err)
	}
	if _, err := st.CommitVersion(context.Background(), cachestore.VersionSpec{Name: "pub", Revision: "r1",
		Manifest: cachestore.Manifest{{Path: "w.bin", Digest: d, Size: int64(len(w))}}}); err != nil {
		t.Fatal(err)
	}
	if err := a.Authorize(context.Background(), p2p.Identity{User: "sa"}, d); err != nil {
		t.Fatalf("a public artifact's blob: %v", err)
	}
	if got := a.Fresh(d); len(got) != 0 {
		t.Errorf("fresh %v once the version holds the blob, want none", got)
	}
}

// BenchmarkPeerAuthzIndex is the store side of one peer request: the
// blob index brought up to date against 1,000 artifacts of 6 files each
// (up to date: the summaries compared, no manifest read), and the first
// build, which reads every manifest once.
func BenchmarkPeerAuthzIndex(b *testing.B) {
	st, _, err := cachestore.Open(context.Background(), b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	for i := range 1000 {
		var m cachestore.Manifest
		for j := range 6 {
			body := fmt.Appendf(nil, "artifact %d file %d", i, j)
			d, err := st.Ingest(context.Background(), "x", bytes.NewReader(body), int64(len(body)), "")
			if err != nil {
				b.Fatal(err)
			}
			m = append(m, cachestore.Entry{Path: fmt.Sprintf("f%d", j), Digest: d, Size: int64(len(body))})
		}
		if _, err := st.CommitVersion(context.Background(), cachestore.VersionSpec{Name: fmt.Sprintf("model-%04d", i), Manifest: m}); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("first", func(b *testing.B) {
		for b.Loop() {
			x := newBlobIndex()
			if _, err := x.update(st); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("up-to-date", func(b *testing.B) {
		x := newBlobIndex()
		if _, err := x.update(st); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if changed, err := x.update(st); err != nil || changed {
				b.Fatal(changed, err)
			}
		}
	})
}
