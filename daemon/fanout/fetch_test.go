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
	f, tr := waitingOn(t, peer.URL, 10*time.Millisecond, body)
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

// waitingOn is node "me" of a cluster whose one other node, "p" (the
// peer port at url), is the recorded origin node of llama and fetches it:
// a Fleet with --peer-wait 1h and poll, and a Transfer of body into a
// store of the test's.
func waitingOn(t *testing.T, url string, poll time.Duration, body []byte) (*Fleet, Transfer) {
	var p k8ssync.ModelCacheNode
	p.Name, p.Status.PeerAddress, p.Status.Heartbeat = "p", url, metav1.NewTime(time.Now())
	p.Status.Artifacts = []k8ssync.ArtifactStatus{{Name: "llama", Phase: "Downloading"}}
	pc := DefaultConfig()
	pc.Wait, pc.Poll = time.Hour, poll
	f := &Fleet{cfg: pc, cluster: true, self: "me", fetcher: testFetcher(t), changed: make(chan struct{}), listed: map[string]time.Time{}}
	f.SetNodes([]k8ssync.ModelCacheNode{p})
	st, _, err := cachestore.Open(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	tr := storeTransfer(st, "llama", body)
	tr.Desire = func() api.Desire { return api.Desire{Name: "llama", OriginNodes: []string{"p"}} }
	return f, tr
}

// TestFetchSaysItWaitsWhileHeld: a node that may not use the origin asks
// its one peer, which holds the ask (the wait header) without the blob.
// The pull is told it waits for a peer while the ask is held, not when
// the hold ends (up to 30 s later: a status that said "fetching" for the
// whole of a peer's hold).
func TestFetchSaysItWaitsWhileHeld(t *testing.T) {
	body := bytes.Repeat([]byte("shard "), 20000)
	held, release := make(chan struct{}, 1), make(chan struct{})
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(p2p.HeaderWait) == "" {
			http.NotFound(w, r)
			return
		}
		select {
		case held <- struct{}{}:
		default:
		}
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
	}))
	defer peer.Close()
	f, tr := waitingOn(t, peer.URL, DefaultConfig().Poll, body)
	said := make(chan string, 1)
	tr.Waiting = func(msg string) { said <- msg }
	done := make(chan error, 1)
	go func() {
		_, _, err := f.Fetch(context.Background(), tr)
		done <- err
	}()
	<-held // the ask is held at the peer now: the pull must have been told
	select {
	case msg := <-said:
		if !strings.Contains(msg, "waiting for a peer") || !strings.Contains(msg, "p fetch it from the origin first") {
			t.Errorf("waiting message %q", msg)
		}
	default:
		t.Error("the ask is held at the peer and the pull was not told it waits for one")
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestFetchMovesAHeldAskWhenThePlanMoves: a node whose first view lists
// only the blob's root (the recorded origin node) holds its ask there;
// when the view grows so that its parent in the blob's tree is another
// node, the held ask is given up and the blob comes from that parent,
// without the origin and without a failed pull.
func TestFetchMovesAHeldAskWhenThePlanMoves(t *testing.T) {
	body := bytes.Repeat([]byte("tree "), 30000)
	rootHeld, rootLeft := make(chan struct{}, 1), make(chan struct{}, 1)
	root := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(p2p.HeaderWait) == "" {
			http.NotFound(w, r)
			return
		}
		rootHeld <- struct{}{}
		<-r.Context().Done() // held until the caller leaves
		rootLeft <- struct{}{}
	}))
	defer root.Close()
	var served sync.WaitGroup
	served.Add(1)
	parent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer served.Done()
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
	}))
	defer parent.Close()
	f, tr := waitingOn(t, root.URL, time.Hour, body)
	tr.Desire = func() api.Desire { return api.Desire{Name: "llama", OriginNodes: []string{"p"}} }
	tr.Origin = func(context.Context, int64) (io.ReadCloser, error) {
		t.Error("the origin was asked by a node that may not use it")
		return nil, errors.New("not this node's")
	}
	// A node that ranks before "me" for this blob: "me"'s parent once
	// the view lists it.
	var name string
	for i := 0; name == ""; i++ {
		n := "q" + strconv.Itoa(i)
		if ps := treeParents("llama\x00"+tr.Blob.Digest, "p", "me", []string{"me", n}); len(ps) > 0 && ps[0] == n {
			name = n
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // held at the root for ever, else
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, _, err := f.Fetch(ctx, tr)
		done <- err
	}()
	<-rootHeld
	var p, q k8ssync.ModelCacheNode
	p.Name, p.Status.PeerAddress, p.Status.Heartbeat = "p", root.URL, metav1.NewTime(time.Now())
	p.Status.Artifacts = []k8ssync.ArtifactStatus{{Name: "llama", Phase: "Downloading"}}
	q.Name, q.Status.PeerAddress, q.Status.Heartbeat = name, parent.URL, metav1.NewTime(time.Now())
	q.Status.Artifacts = []k8ssync.ArtifactStatus{{Name: "llama", Phase: "Downloading"}}
	f.SetNodes([]k8ssync.ModelCacheNode{p, q})
	if err := <-done; err != nil {
		t.Fatalf("fetch: %v; want the blob from the new parent", err)
	}
	<-rootLeft // the held ask at the root was given up
	served.Wait()
}
