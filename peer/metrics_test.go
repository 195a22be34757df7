package peer_test

import (
	"bytes"
	"context"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/peer"
)

// One daemon's metrics after it served a blob to another and was refused
// once: the names lint clean (promlint, promtool) and the counts add up.
func TestMetricsExposition(t *testing.T) {
	data, b := blobOf(5000, 30)
	holder := openStore(t)
	commit(t, holder, data)
	tok := tokenFile(t, "secret")
	m := peer.NewMetrics()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m.Collectors()...)
	hs, _ := servePeer(t, holder, tok, peer.WithServerMetrics(m))
	get(t, "GET", hs.URL+peer.BlobPath+b.Digest, "", "") // refused: no token
	f := newFetcher(t, tok, m)
	s := openStore(t)
	if _, _, err := f.Ingest(context.Background(), b, []string{hs.URL}, opener(s, b), nil); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP modelcache_peer_fetched_bytes_total Bytes of blobs this daemon received through the peer fetcher, by source (peer, origin).
# TYPE modelcache_peer_fetched_bytes_total counter
modelcache_peer_fetched_bytes_total{source="peer"} 5000
# HELP modelcache_peer_refusals_total Peer requests this daemon refused, by reason.
# TYPE modelcache_peer_refusals_total counter
modelcache_peer_refusals_total{reason="unauthorized"} 1
# HELP modelcache_peer_upload_bytes_total Bytes of blobs this daemon sent to peers.
# TYPE modelcache_peer_upload_bytes_total counter
modelcache_peer_upload_bytes_total 5000
# HELP modelcache_peer_uploads_total Blob transfers this daemon served to peers (GET answered 200 or 206).
# TYPE modelcache_peer_uploads_total counter
modelcache_peer_uploads_total 1
# HELP modelcache_peer_waiting_requests Peer requests held now for a blob this daemon does not hold yet (X-Modelcache-Wait).
# TYPE modelcache_peer_waiting_requests gauge
modelcache_peer_waiting_requests 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	promtool := testenv.Require(t, "promtool", "apt-get install prometheus")
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(rec.Body.Bytes())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
}
