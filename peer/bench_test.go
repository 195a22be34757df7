package peer_test

import (
	"bytes"
	"context"
	"io"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/fetchers"
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

// BenchmarkTiers is the tier effect of streaming: a 16 MiB blob goes
// origin → A → B → C, every link (the origin's and each peer port's)
// held to the same 64 MiB/s. Streamed, B asks A as soon as A has
// written a buffer of it and C asks B likewise (what a request held with
// HeaderWait gets), and the bytes flow through the three at once;
// stored and forwarded, each tier starts when the one before committed.
// It reports the time until C holds the blob each way and their ratio
// (streamed/forwarded: about 1/3 when the links bound it, more by a
// buffer's time per tier).
func BenchmarkTiers(b *testing.B) {
	const size, link = 16 << 20, 64 << 20
	data, blob := blobOf(size, 42)
	tok := tokenFile(b, "secret")
	var streamed, forwarded time.Duration
	for b.Loop() {
		streamed += tiers(b, data, blob, tok, link, true)
		forwarded += tiers(b, data, blob, tok, link, false)
	}
	b.ReportMetric(streamed.Seconds()/float64(b.N), "s-streamed/op")
	b.ReportMetric(forwarded.Seconds()/float64(b.N), "s-forwarded/op")
	b.ReportMetric(streamed.Seconds()/forwarded.Seconds(), "streamed/forwarded")
}

// tiers moves blob from a throttled origin through three fresh stores
// and returns the time until the third committed it.
func tiers(b *testing.B, data []byte, blob peer.Blob, tok *peer.TokenFile, link float64, stream bool) time.Duration {
	ctx := context.Background()
	stores := []*cachestore.Store{openStore(b), openStore(b), openStore(b)}
	var urls []string
	for _, s := range stores[:2] {
		hs, _ := servePeer(b, s, tok, peer.WithUploadRate(link))
		urls = append(urls, hs.URL)
	}
	limit := rate.NewLimiter(rate.Limit(link), 256<<10)
	origin := func(ctx context.Context, off int64) (io.ReadCloser, error) {
		return io.NopCloser(fetchers.RateLimited(ctx, bytes.NewReader(data[off:]), limit)), nil
	}
	f, err := peer.NewFetcher(tok)
	if err != nil {
		b.Fatal(err)
	}
	t0 := time.Now()
	var last *ingestion
	for i, s := range stores {
		var peers []string
		var from peer.Origin = origin
		if i > 0 {
			peers, from = urls[i-1:i], nil
			if stream {
				waitGrowing(b, stores[i-1], blob.Digest, 1)
			} else {
				<-last.done
			}
		}
		last = ingestAsync(ctx, f, blob, peers, newTap(s, blob).open, from)
	}
	<-last.done
	took := time.Since(t0)
	if last.err != nil || last.digest != blob.Digest {
		b.Fatalf("the third tier: %s, %v", last.digest, last.err)
	}
	return took
}
