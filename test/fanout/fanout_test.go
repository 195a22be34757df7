package fanout

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestFanOutNetns: three daemons in namespaces of their own, given one
// ModelCache at once, all end Ready; the origin sends the model's bytes
// about once (the shards once, the small config.json to each node); each
// node's status names the peer address it serves on, and the nodes that
// did not go to the origin took their shards from peers.
func TestFanOutNetns(t *testing.T) {
	h := Start(t, Options{ModelBytes: 16 << 20, OriginRate: 32 << 20, StatusInterval: 200 * time.Millisecond,
		Binary: os.Getenv("FANOUT_MODELCACHED")})
	res := h.FanOut(t, 3)
	t.Logf("all Ready in %.2fs; the origin sent %d bytes (model %d) and its last at %.2fs; nodes %+v",
		res.AllReady.Seconds(), res.OriginBytes, res.ModelBytes, res.OriginDone.Seconds(), res.Nodes)
	if limit := h.ModelBytes() * 11 / 10; res.OriginBytes > limit {
		t.Errorf("the origin sent %d bytes for a %d-byte model (more than 1.1x): fan-out did not spare it", res.OriginBytes, h.ModelBytes())
	}
	var fromPeers int64
	for _, n := range res.Nodes {
		want := "http://" + net.JoinHostPort(n.Addr.String(), strconv.Itoa(PeerPort))
		if n.PeerAddress != want {
			t.Errorf("%s: status.peerAddress %q, want %q", n.Name, n.PeerAddress, want)
		}
		fromPeers += n.FromPeers
	}
	if fromPeers == 0 {
		t.Errorf("no node took a byte from a peer: %+v", res.Nodes)
	}
}

// BenchmarkFanOutNetns: N daemons (4, 8) as real processes, each in a
// network namespace of its own, and one hub origin throttled to a fixed
// rate, the model in 4 shards given to all N by one ModelCache at once,
// in the daemons' default settings. It reports the origin's bytes over
// the model's size (origin/model), the time until all N are Ready over
// one daemon's time alone from the same origin, measured first in the
// same harness (all-ready/alone), both times, and when the origin sent
// its last byte. FANOUT_BENCH_MIB (default 1024) sizes the model,
// FANOUT_BENCH_MIBPS (default 16) the origin's rate, FANOUT_MODELCACHED
// names a built modelcached (default: built here), FANOUT_LOG_DIR keeps
// the daemons' logs, FANOUT_DAEMON_ARGS adds flags to every daemon
// (space-separated, e.g. --peer-max-uploads 32).
func BenchmarkFanOutNetns(b *testing.B) {
	mib, mibps := benchEnv(b, "FANOUT_BENCH_MIB", 1024), benchEnv(b, "FANOUT_BENCH_MIBPS", 16)
	h := Start(b, Options{ModelBytes: int64(mib) << 20, OriginRate: int64(mibps) << 20, Binary: os.Getenv("FANOUT_MODELCACHED"), LogDir: os.Getenv("FANOUT_LOG_DIR"), Flags: strings.Fields(os.Getenv("FANOUT_DAEMON_ARGS"))})
	alone := h.Alone(b)
	a := alone.Nodes[0]
	for _, n := range []int{4, 8} {
		b.Run(fmt.Sprintf("N=%d", n), func(b *testing.B) {
			for range b.N {
				res := h.FanOut(b, n)
				// At most 10 lines: go test prints no more of a benchmark's log.
				b.Logf("alone: pull began at %.2fs, 1 MiB held at %.2fs, Ready at %.2fs; the origin sent %d bytes (model %d)",
					a.Started.Seconds(), a.Flowing.Seconds(), a.Ready.Seconds(), alone.OriginBytes, alone.ModelBytes)
				for _, nd := range res.Nodes {
					var gets []time.Duration
					for _, g := range res.OriginGets {
						if g.From == nd.Name {
							gets = append(gets, g.At)
						}
					}
					from := "none"
					if len(gets) > 0 {
						from = fmt.Sprintf("%d, %.2fs to %.2fs", len(gets), gets[0].Seconds(), gets[len(gets)-1].Seconds())
					}
					b.Logf("%s: pull began at %.2fs, 1 MiB held at %.2fs, Ready at %.2fs, %d bytes from peers; shard GETs to the origin: %s",
						nd.Name, nd.Started.Seconds(), nd.Flowing.Seconds(), nd.Ready.Seconds(), nd.FromPeers, from)
				}
				b.ReportMetric(float64(res.OriginBytes)/float64(res.ModelBytes), "origin/model")
				b.ReportMetric(res.AllReady.Seconds()/alone.AllReady.Seconds(), "all-ready/alone")
				b.ReportMetric(alone.AllReady.Seconds(), "alone-s")
				b.ReportMetric(res.AllReady.Seconds(), "all-ready-s")
				b.ReportMetric(res.OriginDone.Seconds(), "origin-done-s")
			}
		})
	}
}

// benchEnv is the positive whole number in k, def when k is unset.
func benchEnv(b *testing.B, k string, def int) int {
	v := os.Getenv(k)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		b.Fatalf("%s=%q: want a positive whole number (MiB, or MiB per second for the rate)", k, v)
	}
	return n
}
