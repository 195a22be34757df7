package daemon

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore/storetest"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
)

// throttledWriter sends what a handler writes at the limiter's rate.
type throttledWriter struct {
	http.ResponseWriter
	ctx  context.Context
	lim  *rate.Limiter
	sent *atomic.Int64
}

func (w throttledWriter) Write(b []byte) (int, error) {
	var n int
	for len(b) > 0 {
		k := min(len(b), w.lim.Burst())
		if err := w.lim.WaitN(w.ctx, k); err != nil {
			return n, err
		}
		m, err := w.ResponseWriter.Write(b[:k])
		n += m
		w.sent.Add(int64(m))
		if err != nil {
			return n, err
		}
		b = b[k:]
	}
	return n, nil
}

// throttle makes hub's CDN (the shards' bytes) send at bps in all, as
// one origin behind one uplink, counting what it sends in sent.
func throttle(hub *hubtest.Hub, files map[string][]byte, bps int, sent *atomic.Int64) {
	byOID := map[string][]byte{}
	for _, b := range files {
		byOID[sha(b)] = b
	}
	lim := rate.NewLimiter(rate.Limit(bps), 256<<10)
	hub.Hook = func(w http.ResponseWriter, r *http.Request) bool {
		b, ok := byOID[strings.TrimPrefix(r.URL.Path, "/lfs/")]
		if !ok || r.Method != http.MethodGet {
			return false
		}
		http.ServeContent(throttledWriter{w, r.Context(), lim, sent}, r, "", time.Time{}, strings.NewReader(string(b)))
		return true
	}
}

func benchEnv(k string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v > 0 {
		return v
	}
	return def
}

// BenchmarkFanOut: N daemons of one cluster (in process, separate roots
// and loopback peer ports, each node's status handed to all as k8ssync's
// watch hands them over) get one ModelCache's model at once from one
// origin throttled to a fixed rate, with the default settings
// (--origin-concurrency 2, the settle time). It reports the origin's
// bytes over the model's size (origin/model) and the time until all N
// are Ready over one node's time alone from the same origin
// (all-ready/one-node). BENCH_FANOUT_MIB (default 256) sizes the model
// (4 shards), BENCH_FANOUT_MIBPS (default 64) the origin's rate.
func BenchmarkFanOut(b *testing.B) {
	mib, mibps := benchEnv("BENCH_FANOUT_MIB", 256), benchEnv("BENCH_FANOUT_MIBPS", 64)
	files := map[string][]byte{"config.json": []byte(`{"model_type":"llama"}`)}
	var size int64
	for i := range 4 {
		f := storetest.Data(mib<<20/4+i, byte(20+i))
		files["model-0000"+strconv.Itoa(i+1)+"-of-00004.safetensors"] = f
		size += int64(len(f))
	}
	size += int64(len(files["config.json"]))
	for _, n := range []int{4, 8} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			for range b.N {
				var sent atomic.Int64
				hub := newFanHub(b)
				throttle(hub, files, mibps<<20, &sent)
				rev := hub.Commit("acme/fan", files, "main")

				one, _ := fanFleet(b, 1, 2, nil)
				t0 := time.Now()
				if _, err := one[0].pull(api.PullRequest{Name: "fan", URI: "hf://acme/fan@" + rev}); err != nil {
					b.Fatal(err)
				}
				alone := time.Since(t0)
				one[0].stop()
				sent.Store(0)
				hub.Sent.Store(0)

				hs, _ := fanFleet(b, n, DefaultPeerConfig().OriginConcurrency, func(c *Config) {
					c.Peer.Poll, c.Peer.Settle = DefaultPeerConfig().Poll, DefaultPeerConfig().Settle
				})
				asCluster(b, hs)
				want := map[string]api.Desire{"fan": {Name: "fan", URI: "hf://acme/fan@" + rev, Ref: "main"}}
				t0 = time.Now()
				for _, h := range hs {
					if err := (clusterNode{h.d}).SetClusterDesires(want, nil); err != nil {
						b.Fatal(err)
					}
				}
				for _, h := range hs {
					h.waitPhaseWithin("fan", api.PhaseReady, 10*time.Minute)
				}
				all := time.Since(t0)
				origin := sent.Load() + hub.Sent.Load()
				b.ReportMetric(float64(origin)/float64(size), "origin/model")
				b.ReportMetric(all.Seconds()/alone.Seconds(), "all-ready/one-node")
				b.ReportMetric(alone.Seconds(), "one-node-s")
				b.ReportMetric(all.Seconds(), "all-ready-s")
				for _, h := range hs {
					h.stop()
				}
			}
		})
	}
}
