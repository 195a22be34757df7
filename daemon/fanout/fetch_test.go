package fanout

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/k8ssync"
	p2p "github.com/modelcache/modelcache/peer"
)

// TestFetchWaitsWithoutReopening: a node that may not use the origin
// waits for its one peer, which lacks the blob twice, then holds it. Each
// round asks the peer once, holding the request (the wait header); the
// partial ingest is opened once for the whole wait, not once a round
// (a reopened ingest re-hashes what it holds); the origin is never asked.
func TestFetchWaitsWithoutReopening(t *testing.T) {
	body := bytes.Repeat([]byte("shard "), 20000)
	var mu sync.Mutex
	var waits []string
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		waits = append(waits, r.Header.Get(p2p.HeaderWait))
		n := len(waits)
		mu.Unlock()
		if n <= 2 {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
	}))
	defer peer.Close()
	fetcher := testFetcher(t)
	now := time.Now()
	var p k8ssync.ModelCacheNode
	p.Name, p.Status.PeerAddress, p.Status.Heartbeat = "p", peer.URL, metav1.NewTime(now)
	p.Status.Artifacts = []k8ssync.ArtifactStatus{{Name: "llama", Phase: "Downloading"}}
	pc := DefaultConfig()
	pc.Wait, pc.Poll = time.Hour, 10*time.Millisecond
	f := &Fleet{cfg: pc, cluster: true, self: "me", fetcher: fetcher, changed: make(chan struct{}), listed: map[string]time.Time{}}
	f.SetNodes([]k8ssync.ModelCacheNode{p})

	st, _, err := cachestore.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tr := storeTransfer(st, "llama", body)
	tr.Desire = func() api.Desire { return api.Desire{Name: "llama", OriginNodes: []string{"p"}} }
	open, opens := tr.Open, 0
	tr.Open = func(ctx context.Context) (p2p.Partial, error) { opens++; return open(ctx) }
	tr.Origin = func(context.Context, int64) (io.ReadCloser, error) {
		t.Error("the origin was asked by a node that may not use it")
		return nil, errors.New("not this node's")
	}
	d, waited, err := f.Fetch(context.Background(), tr)
	if err != nil || !waited || d != tr.Blob.Digest {
		t.Fatalf("fetch: %s waited %v err %v; want the blob, after a wait", d, waited, err)
	}
	if opens != 1 {
		t.Errorf("the partial ingest was opened %d times over 3 rounds, want once", opens)
	}
	if len(waits) != 3 || strings.Join(waits, ",") != "30,30,30" {
		t.Errorf("requests with wait headers %q, want 3, each holding up to 30 s", waits)
	}
}
