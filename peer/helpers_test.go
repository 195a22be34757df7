package peer_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/peer"
)

// openStore opens a store in a temp dir, closed at cleanup.
func openStore(t testing.TB) *cachestore.Store {
	t.Helper()
	s, _, err := cachestore.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// blobOf is n random bytes (seeded: the same for a test each run) and
// their digest.
func blobOf(n int, seed uint64) ([]byte, peer.Blob) {
	b := make([]byte, n)
	var s [32]byte
	binary.LittleEndian.PutUint64(s[:], seed)
	rand.NewChaCha8(s).Read(b)
	return b, peer.Blob{Digest: cachestore.DigestBytes(b), Size: int64(n)}
}

// commit puts data into s as a committed blob.
func commit(t testing.TB, s *cachestore.Store, data []byte) {
	t.Helper()
	if _, err := s.Ingest(context.Background(), "test:"+cachestore.DigestBytes(data), bytes.NewReader(data), int64(len(data)), ""); err != nil {
		t.Fatal(err)
	}
}

// tokenFile writes tok to a file and returns its TokenFile.
func tokenFile(t testing.TB, tok string) *peer.TokenFile {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return peer.NewTokenFile(p)
}

// servePeer serves s's blobs to holders of tok, as a daemon's peer port
// does; wrap, when not nil, wraps the handler (to observe requests).
func servePeer(t testing.TB, s *cachestore.Store, tok *peer.TokenFile, opts ...peer.ServerOption) (*httptest.Server, *peer.Server) {
	t.Helper()
	srv, err := peer.NewServer(peer.StoreBlobs{Store: s}, peer.StaticTokenAuthenticator{File: tok}, opts...)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return hs, srv
}

// get sends a request with the token (none when "") and an optional Range.
func get(t *testing.T, method, url, tok, rng string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	if rng != "" {
		req.Header.Set("Range", rng)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, body
}
