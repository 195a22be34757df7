package daemon

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
)

// TestLoadManyClients: 100 socket clients list, inspect and pull while 20
// artifacts that share blobs are pulled at once. Every blob is fetched
// once, nothing deadlocks, and the API's p50/p99 latency is reported.
func TestLoadManyClients(t *testing.T) {
	if testing.Short() {
		t.Skip("load")
	}
	shared := [][]byte{data(2<<20, 1), data(2<<20, 2), data(2<<20, 3), data(2<<20, 4)}
	files := map[string][]byte{}
	for i, b := range shared {
		files[fmt.Sprintf("s%d.bin", i)] = b
	}
	fs := newFileServer(t, files)
	cfg := testConfig(t)
	cfg.MaxConcurrentPulls = 8
	// A stream that stalls past the idle timeout is fetched again, a
	// second GET that is not the one this test looks for: 100 clients on a
	// loaded 2-core CI machine stalled one for the test config's 2 s.
	cfg.IdleTimeout = time.Minute
	h := start(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// 20 artifacts, each one of the 4 shared files (by digest: fetched once).
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			n := i % len(shared)
			uri := fmt.Sprintf("%s/s%d.bin#sha256=%s", fs.URL, n, sha(shared[n]))
			if _, err := h.c.Pull(ctx, api.PullRequest{Name: fmt.Sprintf("a%02d", i), URI: uri}, true, nil); err != nil {
				errs <- fmt.Errorf("pull a%02d: %w", i, err)
			}
		}(i)
	}
	// 100 clients hammering reads (and re-pulls of what exists) meanwhile.
	var mu sync.Mutex
	var lat []time.Duration
	stop := make(chan struct{})
	for c := 0; c < 100; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			cl := &api.Client{Socket: cfg.Socket}
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				t0 := time.Now()
				var err error
				switch k % 4 {
				case 0, 1:
					_, err = cl.List(ctx)
				case 2:
					_, err = cl.Status(ctx)
				case 3:
					_, err = cl.Get(ctx, fmt.Sprintf("a%02d", (c+k)%20))
					if errors.Is(err, api.ErrNotFound) {
						err = nil // not desired yet
					}
				}
				d := time.Since(t0)
				if err != nil {
					errs <- fmt.Errorf("client %d: %w", c, err)
					return
				}
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
		}(c)
	}
	// The pulls finish while the readers run; then the readers stop.
	done := make(chan struct{})
	go func() {
		for i := 0; i < 20; i++ {
			h.waitPhase(fmt.Sprintf("a%02d", i), api.PhaseReady)
		}
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("deadlock or starvation: the pulls did not finish under load")
	}
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got, want := fs.gets.Load(), int64(len(shared)); got != want {
		t.Errorf("%d GETs for %d distinct blobs: a shared blob was fetched twice", got, want)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if len(lat) == 0 {
		t.Fatal("no API calls completed")
	}
	p := func(q float64) time.Duration { return lat[int(q*float64(len(lat)-1))] }
	t.Logf("100 clients, 20 pulls sharing 4 blobs: %d API calls, latency p50 %v p99 %v max %v; %d GETs for %d blobs",
		len(lat), p(0.5).Round(time.Microsecond), p(0.99).Round(time.Microsecond), lat[len(lat)-1].Round(time.Microsecond), fs.gets.Load(), len(shared))
}
