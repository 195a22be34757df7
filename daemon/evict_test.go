package daemon

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
)

// gatedServer serves files, holding every GET of a body until released.
func gatedServer(t *testing.T, files map[string][]byte) (*fileServer, func()) {
	srv := newFileServer(t, files)
	gate := make(chan struct{})
	srv.hook = func(rw http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodGet {
			select {
			case <-gate:
			case <-r.Context().Done():
			}
		}
		return false
	}
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	return srv, release
}

// TestEvictCancelsPullAtomically: evicting a model whose pull is in flight
// removes the desire and cancels the pull in one step: the cancelled
// pull's end does not start another one, nothing comes back Ready, and
// the pull slot is free for the next pull.
func TestEvictCancelsPullAtomically(t *testing.T) {
	w := data(1<<20, 31)
	srv, release := gatedServer(t, map[string][]byte{"w.bin": w, "x.bin": data(1000, 32)})
	cfg := testConfig(t)
	cfg.MaxConcurrentPulls = 1
	h := start(t, cfg)
	if _, err := h.c.Pull(context.Background(), api.PullRequest{Name: "m", URI: srv.URL + "/w.bin#sha256=" + sha(w)}, false, nil); err != nil {
		t.Fatal(err)
	}
	h.waitPhase("m", api.PhaseDownloading)
	h.d.mu.Lock()
	cancelled := h.d.arts["m"].done
	h.d.mu.Unlock()
	if _, err := h.c.Evict(context.Background(), "m", "", false); err != nil {
		t.Fatalf("evict of a model in flight: %v", err)
	}
	release()
	// The one slot serves the next pull: the evicted one does not hold it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if a, err := h.c.Pull(ctx, api.PullRequest{Name: "next", URI: srv.URL + "/x.bin"}, true, nil); err != nil || a.Phase != api.PhaseReady {
		t.Fatalf("the next pull after the evict: %+v %v", a, err)
	}
	// The cancelled pull's end, then a pass of the reconciler, are what
	// would start it again; a pull they started is awaited.
	select {
	case <-cancelled:
	case <-time.After(30 * time.Second):
		t.Fatal("the evicted model's pull did not end")
	}
	h.passAndSettle(t)
	if a, err := h.c.Get(context.Background(), "m"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("the evicted model came back: %+v %v", a, err)
	}
	if s, _ := h.c.Status(context.Background()); s.PullsInFlight != 0 {
		t.Fatalf("pulls in flight after the evict: %d", s.PullsInFlight)
	}
}

// TestRefusedEvictChangesNothing: an evict refused because the model is
// pinned leaves its desire and its refresh in flight alone; the refresh
// completes.
func TestRefusedEvictChangesNothing(t *testing.T) {
	v1, v2 := data(2000, 41), data(3000, 42)
	srv, release := gatedServer(t, map[string][]byte{"v1.bin": v1, "v2.bin": v2})
	release() // v1 goes through
	h := start(t, testConfig(t))
	if _, err := h.pull(api.PullRequest{Name: "m", URI: srv.URL + "/v1.bin#sha256=" + sha(v1), Pin: true}); err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	var gets atomic.Int32
	srv.hook = func(rw http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodGet {
			gets.Add(1)
			<-gate
		}
		return false
	}
	if _, err := h.c.Pull(context.Background(), api.PullRequest{Name: "m", URI: srv.URL + "/v2.bin#sha256=" + sha(v2), Pin: true, Replace: true}, false, nil); err != nil {
		t.Fatal(err)
	}
	h.waitPhase("m", api.PhaseDownloading)
	if _, err := h.c.Evict(context.Background(), "m", "", false); !errors.Is(err, api.ErrPinned) {
		t.Fatalf("evict of a pinned model: %v, want pinned", err)
	}
	close(gate)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := h.c.Wait(ctx, "m", 0, nil)
	if err != nil || a.Revision != sha(v2) {
		t.Fatalf("the refresh after a refused evict: %+v %v", a, err)
	}
	if a.Desire == nil && a.URI == "" {
		t.Fatal("the refused evict removed the desire")
	}
	if n := gets.Load(); n != 1 {
		t.Fatalf("the refresh was fetched %d times: the refused evict cancelled it", n)
	}
}

// TestAbsentEvictionDoesNotBlockReads: while the reconciler removes an
// absent model's tree, API reads answer: the removal runs without the
// daemon lock.
func TestAbsentEvictionDoesNotBlockReads(t *testing.T) {
	w := data(5000, 61)
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	cfg := testConfig(t)
	inEvict, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	cfg.Hook = func(point string) {
		if point == "evict.after-index" {
			once.Do(func() { close(inEvict) })
			<-release
		}
	}
	h := start(t, cfg)
	defer close(release)
	uri := srv.URL + "/w.bin#sha256=" + sha(w)
	if _, err := h.pull(api.PullRequest{Name: "m", URI: uri}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.Pull(context.Background(), api.PullRequest{Name: "m", URI: uri, State: api.StateAbsent}, false, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case <-inEvict:
	case <-time.After(30 * time.Second):
		t.Fatal("the absent model was never evicted")
	}
	// The eviction is stopped inside the store; reads must still answer.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := h.c.Status(ctx); err != nil {
		t.Fatalf("status while an absent model is evicted: %v", err)
	}
	if _, err := h.c.List(ctx); err != nil {
		t.Fatalf("list while an absent model is evicted: %v", err)
	}
}
