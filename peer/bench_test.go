package peer_test

import (
	"context"
	"testing"

	"github.com/modelcache/modelcache/peer"
)

// BenchmarkPeerIngest moves a 64 MiB blob from one store to another
// through a Server and a Fetcher on loopback: the token check, the
// handler, and the verified, fsynced ingest, with no rate bound. Both
// stores are on the test's temp dir.
func BenchmarkPeerIngest(b *testing.B) {
	data, blob := blobOf(64<<20, 40)
	holder := openStore(b)
	commit(b, holder, data)
	tok := tokenFile(b, "secret")
	hs, _ := servePeer(b, holder, tok)
	f, err := peer.NewFetcher(tok)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(blob.Size)
	for b.Loop() {
		b.StopTimer()
		s := openStore(b)
		b.StartTimer()
		if _, _, err := f.Ingest(context.Background(), blob, []string{hs.URL}, opener(s, blob), nil); err != nil {
			b.Fatal(err)
		}
	}
}
