package fanout_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/fanout"
	"github.com/modelcache/modelcache/internal/kubetest"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/k8ssync"
	p2p "github.com/modelcache/modelcache/peer"
)

// BenchmarkFleetBytes rolls one model out to 10, 100 and 1,000 simulated
// nodes (FLEET_BENCH_NODES, comma-separated) in this process against one
// real kube-apiserver, with the bytes moving (fleetsim_test.go): each
// node a real k8ssync loop with its own client, the real fan-out planner
// and fetch (fanout.Fleet) and the real peer port on its own 127.x
// address, its own store, and a link of FLEET_BENCH_LINK bytes a second
// each way (default 1 MiB/s); one origin throttled to the same rate; a
// model of FLEET_BENCH_MODEL bytes (default 4 MiB) in 4 blobs. A node
// alone (the same loop, one node) runs first. For each N it prints what
// issue 42 asks: ModelCacheNode writes per node per minute (of a minute at least), watch events
// per write, peer requests per node per blob (counted by the peer ports:
// every answer, served or refused), origin bytes over the model's size
// (counted by the origin), and the time from the ModelCache's creation
// until every node is Ready over that of the node alone.
func BenchmarkFleetBytes(b *testing.B) {
	sizes := kubetest.FleetSizes(b)
	link, size := envBytes(b, "FLEET_BENCH_LINK", 1<<20), envBytes(b, "FLEET_BENCH_MODEL", 4<<20)
	model := newSimModel(size, 4)
	var alone *fleetRun
	b.Run("nodes=1", func(b *testing.B) {
		for range b.N {
			alone = runFleetBytes(b, 1, model, float64(link))
		}
	})
	for _, n := range sizes {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			for range b.N {
				r := runFleetBytes(b, n, model, float64(link))
				r.report(b, alone)
			}
		})
	}
}

// envBytes is a positive integer from the environment, or def.
func envBytes(b *testing.B, key string, def int64) int64 {
	s := os.Getenv(key)
	if s == "" {
		return def
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 4096 {
		b.Fatalf("%s=%q: want bytes, at least 4096", key, s)
	}
	return n
}

// fleetRun is what one rollout measured.
type fleetRun struct {
	nodes, blobs     int
	model            int64
	allReady         time.Duration // creation → the last node Ready
	pull             time.Duration // the longest pull (its desire's arrival → Ready)
	writes, events   float64       // ModelCacheNode writes and watch events in the window
	peerReqs, served float64       // peer requests answered (served or refused), transfers served
	busy, notFound   float64
	originBytes      int64
	originReqs       int64
	originSpan       [2]time.Duration // the origin's first request and last answer's end, from the creation
	firstReady       time.Duration    // creation → the first node Ready
	medianReady      time.Duration
}

func (r *fleetRun) report(b *testing.B, alone *fleetRun) {
	// Per minute of the rollout, or of one minute when it was shorter:
	// the goal bounds a node's writes in any minute, and a rollout of a
	// few seconds has each node write once or twice.
	perNodeMin := r.writes / float64(r.nodes) / max(r.allReady.Minutes(), 1)
	perBlob := r.peerReqs / float64(r.nodes*r.blobs)
	overModel := float64(r.originBytes) / float64(r.model)
	b.ReportMetric(perNodeMin, "mcn-writes/node/min")
	b.ReportMetric(r.events/max(r.writes, 1), "watch-events/write")
	b.ReportMetric(perBlob, "peer-reqs/node/blob")
	b.ReportMetric(overModel, "origin-bytes/model")
	b.Logf("%d nodes, a model of %d bytes in %d blobs, every link and the origin at the same rate", r.nodes, r.model, r.blobs)
	b.Logf("  ModelCacheNode writes: %.0f = %.1f a node = %.2f per node per minute of the rollout (a minute at least); watch events %.0f = %.2f per write",
		r.writes, r.writes/float64(r.nodes), perNodeMin, r.events, r.events/max(r.writes, 1))
	b.Logf("  peer requests: %.0f = %.2f per node per blob (%.0f transfers served, %.0f busy, %.0f not found)", r.peerReqs, perBlob, r.served, r.busy, r.notFound)
	b.Logf("  origin: %d bytes = %.3f× the model, in %d requests, from %.1fs to %.1fs after the creation; the first node Ready at %.1fs, half of them at %.1fs",
		r.originBytes, overModel, r.originReqs, r.originSpan[0].Seconds(), r.originSpan[1].Seconds(), r.firstReady.Seconds(), r.medianReady.Seconds())
	if alone != nil {
		ratio := r.allReady.Seconds() / alone.allReady.Seconds()
		b.ReportMetric(ratio, "all-ready/alone")
		b.Logf("  every node Ready %.1fs after the ModelCache's creation; one node alone %.1fs: %.2f×; the longest pull %.1fs, alone %.1fs: %.2f×",
			r.allReady.Seconds(), alone.allReady.Seconds(), ratio, r.pull.Seconds(), alone.pull.Seconds(), r.pull.Seconds()/alone.pull.Seconds())
	}
}

func runFleetBytes(b *testing.B, nodes int, model *simModel, link float64) *fleetRun {
	b.StopTimer()
	cl := kubetest.Start(b)
	ctx, cancel := context.WithCancel(context.Background())
	kc := kubernetes.NewForConfigOrDie(cl.Config)
	dyn := dynamic.NewForConfigOrDie(cl.Config)
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "modelcache-system"}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	origin, err := startOrigin(model, link)
	if err != nil {
		b.Fatal(err)
	}
	defer origin.srv.Close()
	tok := filepath.Join(b.TempDir(), "token")
	if err := os.WriteFile(tok, []byte("fleet-secret\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	auth := p2p.StaticTokenAuthenticator{File: p2p.NewTokenFile(tok)}
	metrics := p2p.NewMetrics()
	root := b.TempDir()
	sims := make([]*simDaemon, nodes)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	errc := make(chan error, nodes)
	for i := range nodes {
		sims[i] = startSimNode(ctx, b, kc, cl.Config, i, simEnv{root: root, tok: tok, auth: auth, metrics: metrics, model: model, origin: origin, link: link, errc: errc}, &wg)
		time.Sleep(10 * time.Millisecond) // agents that start over seconds, as a DaemonSet's do
	}
	defer func() {
		for _, s := range sims {
			s.fleet.Close()
			s.st.Close()
		}
	}()
	kubetest.FleetUp(ctx, b, cl.Config, nodes)
	before, err := kubetest.APIMetrics(ctx, kc)
	if err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
	t0 := time.Now()
	mc := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "modelcache.io/v1alpha1", "kind": "ModelCache",
		"metadata": map[string]any{"name": "fleet"}, "spec": map[string]any{"source": "https://example.com/fleet"}}}
	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	told := time.Now()
	testenv.Eventually(b, "every node Ready", 30*time.Minute, func() error {
		ready, failed := 0, ""
		for _, s := range sims {
			s.mu.Lock()
			if !s.readyAt.IsZero() {
				ready++
			} else if s.err != nil && failed == "" {
				failed = s.name + ": " + s.err.Error()
			}
			s.mu.Unlock()
		}
		if failed != "" {
			b.Fatalf("a pull failed: %s", failed)
		}
		if ready < nodes {
			if time.Since(told) > 30*time.Second { // progress, on a run that takes minutes
				told = time.Now()
				fmt.Fprintf(os.Stderr, "fleet of %d, %.0fs: %d Ready, origin sent %d bytes\n", nodes, time.Since(t0).Seconds(), ready, origin.sent.Load())
			}
			return fmt.Errorf("%d of %d nodes Ready", ready, nodes)
		}
		return nil
	})
	b.StopTimer()
	after, err := kubetest.APIMetrics(ctx, kc)
	if err != nil {
		b.Fatal(err)
	}
	r := &fleetRun{nodes: nodes, blobs: len(model.files), model: model.size, originBytes: origin.sent.Load(), originReqs: origin.reqs.Load(),
		originSpan: [2]time.Duration{time.Unix(0, origin.first.Load()).Sub(t0), time.Unix(0, origin.last.Load()).Sub(t0)}}
	for _, s := range sims {
		s.mu.Lock()
		if r.firstReady == 0 || s.readyAt.Sub(t0) < r.firstReady {
			r.firstReady = s.readyAt.Sub(t0)
		}
		r.allReady = max(r.allReady, s.readyAt.Sub(t0))
		r.pull = max(r.pull, s.readyAt.Sub(s.started))
		s.mu.Unlock()
	}
	r.writes = after["modelcachenodes writes"] - before["modelcachenodes writes"]
	r.events = after["modelcachenodes events"] - before["modelcachenodes events"]
	r.served = testutil.ToFloat64(metrics.Uploads())
	r.busy = testutil.ToFloat64(metrics.Refusals(p2p.RefusedBusy))
	r.notFound = testutil.ToFloat64(metrics.Refusals(p2p.RefusedNotFound))
	r.peerReqs = r.served
	for _, why := range []string{p2p.RefusedUnauthorized, p2p.RefusedAuthError, p2p.RefusedBusy, p2p.RefusedNotFound, p2p.RefusedForbidden,
		p2p.RefusedSourceMismatch, p2p.RefusedAuthzError, p2p.RefusedBadRequest, p2p.RefusedBadRange, p2p.RefusedWaitFull} {
		r.peerReqs += testutil.ToFloat64(metrics.Refusals(why))
	}
	var at []float64
	for _, s := range sims {
		at = append(at, s.readyAt.Sub(t0).Seconds())
	}
	slices.Sort(at)
	r.medianReady = time.Duration(at[len(at)/2] * float64(time.Second))
	if nodes == 1 {
		b.Logf("one node alone: Ready %.1fs after the ModelCache's creation (its pull %.1fs); origin sent %d bytes", r.allReady.Seconds(), r.pull.Seconds(), r.originBytes)
	}
	return r
}

// simEnv is what every simulated node shares.
type simEnv struct {
	root, tok string
	auth      p2p.Authenticator
	metrics   *p2p.Metrics
	model     *simModel
	origin    *simOrigin
	link      float64
	errc      chan error
}

// startSimNode starts node i: its Node object, its store, its Fleet
// serving on 127.x.y.z (the daemon's settings but the link), and its
// k8ssync loop with a client of its own, advertising that port.
func startSimNode(ctx context.Context, b *testing.B, kc kubernetes.Interface, kube *rest.Config, i int, e simEnv, wg *sync.WaitGroup) *simDaemon {
	name := fmt.Sprintf("node-%04d", i)
	if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	st, _, err := cachestore.Open(ctx, filepath.Join(e.root, name), cachestore.WithWriteBuffer(64<<10))
	if err != nil {
		b.Fatal(err)
	}
	n := &simDaemon{name: name, st: st, access: &fanout.AccessTable{}, link: rate.NewLimiter(rate.Limit(e.link), 64<<10),
		model: e.model, origin: e.origin, ctx: ctx, changed: make(chan struct{})}
	cfg := fanout.DefaultConfig()
	cfg.TokenFile, cfg.UploadRate = e.tok, int64(e.link)
	// The daemon's Settle in a cluster (daemon/run.go's clusterViewLag).
	cfg.Settle = max(cfg.Settle, k8ssync.DefaultStatusInterval+k8ssync.DefaultPublishInterval)
	if n.fleet, err = fanout.New(cfg, fanout.Options{NodeName: name, Access: n.access, Metrics: e.metrics}); err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.%d.%d.%d:0", 1+i>>16, (i>>8)&255, i&255))
	if err != nil {
		b.Fatal(err)
	}
	if err := n.fleet.ServeOn(ln, st, e.auth, publicOnly{}, e.errc); err != nil {
		b.Fatal(err)
	}
	s, err := k8ssync.New(k8ssync.Config{NodeName: name, Kube: rest.CopyConfig(kube), Namespace: "modelcache-system", Aggregate: true,
		PeerAddress: "http://" + ln.Addr().String()}, n)
	if err != nil {
		b.Fatal(err)
	}
	wg.Add(1)
	go func() { defer wg.Done(); s.Run(ctx) }()
	return n
}
