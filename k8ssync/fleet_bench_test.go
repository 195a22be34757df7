package k8ssync_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/internal/kubetest"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/k8ssync"
)

// simNode is a node agent's daemon for the fleet benchmark: a pull goes
// Downloading at once and Ready after dl, its free bytes moving at every
// read (as a download's do); it records when its peer view (what the
// fan-out planner would read) first showed the whole fleet Ready.
type simNode struct {
	name  string
	fleet int
	dl    time.Duration

	mu      sync.Mutex
	changed chan struct{}
	want    map[string]api.Desire
	arts    map[string]*api.Artifact
	free    int64
	readyAt time.Time // local Ready
	viewAt  time.Time // the peer view first lists every node Ready
}

func (n *simNode) notifyLocked() {
	close(n.changed)
	n.changed = make(chan struct{})
}

func (n *simNode) SetClusterDesires(want map[string]api.Desire, _ map[string]map[string]string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.want = want
	for name, ds := range want {
		if ds.State == api.StateAbsent || ds.Revision == "" {
			continue
		}
		if a, ok := n.arts[name]; ok && a.Revision == ds.Revision {
			continue
		}
		a := &api.Artifact{Name: name, Kind: api.KindModel, Phase: api.PhaseDownloading, Revision: ds.Revision, Source: ds.URI, Bytes: 1 << 30,
			Progress: &api.Progress{Started: time.Now()}}
		n.arts[name] = a
		n.notifyLocked()
		time.AfterFunc(n.dl, func() {
			n.mu.Lock()
			defer n.mu.Unlock()
			a.Phase, a.Path, a.ManifestDigest, a.Progress = api.PhaseReady, "/var/lib/modelcache/models/"+name+"/current", "sha256:"+ds.Revision, nil
			n.readyAt = time.Now()
			n.notifyLocked()
		})
	}
	return nil
}

func (n *simNode) Artifacts() ([]api.Artifact, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []api.Artifact
	for _, a := range n.arts {
		c := *a
		if a.Progress != nil {
			p := *a.Progress
			c.Progress = &p
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (n *simNode) StatusNow() (*api.Status, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, a := range n.arts {
		if a.Phase == api.PhaseDownloading {
			n.free -= 7 << 20 // bytes land
		}
	}
	return &api.Status{StoreBytes: 1<<40 - n.free, FSCapacityBytes: 1 << 40, FSFreeBytes: n.free}, nil
}
func (n *simNode) GPUs() api.GPUInventory { return api.GPUInventory{Source: "simulated"} }
func (n *simNode) Root() string           { return "/var/lib/modelcache" }
func (n *simNode) Changed() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.changed
}
func (n *simNode) SetPodHolders(map[string][]api.Holder, map[string]string) {}
func (n *simNode) Resolve(_ context.Context, ds api.Desire, _ map[string]string) (string, string, error) {
	return fakeRevision(ds.URI), ds.URI, nil
}

func (n *simNode) SetPeerNodes(nodes []k8ssync.ModelCacheNode) {
	ready := 0
	for _, p := range nodes {
		for _, a := range p.Status.Artifacts {
			if a.Phase == string(api.PhaseReady) && a.Revision != "" {
				ready++
			}
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if ready >= n.fleet && n.viewAt.IsZero() {
		n.viewAt = time.Now()
	}
}

// writeLog records, per node, when it wrote its ModelCacheNode and
// whether it opened a watch of ModelCacheNodes.
type writeLog struct {
	mu      sync.Mutex
	writes  []time.Time
	watches int
}

type loggingRT struct {
	rt  http.RoundTripper
	log *writeLog
}

func (l loggingRT) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.Contains(r.URL.Path, "/modelcachenodes") {
		l.log.mu.Lock()
		switch {
		case r.Method == http.MethodGet && r.URL.Query().Get("watch") == "true":
			l.log.watches++
		case r.Method != http.MethodGet:
			l.log.writes = append(l.log.writes, time.Now())
		}
		l.log.mu.Unlock()
	}
	return l.rt.RoundTrip(r)
}

// maxPerMinute is the most of ts in any minute.
func maxPerMinute(ts []time.Time) int {
	best := 0
	for i := range ts {
		j := i
		for j < len(ts) && ts[j].Sub(ts[i]) < time.Minute {
			j++
		}
		best = max(best, j-i)
	}
	return best
}

// BenchmarkFleet runs the sync loops of 10, 100 and 1,000 simulated node
// agents (FLEET_BENCH_NODES, comma-separated) in this process against
// one real kube-apiserver, rolls one model out to all of them, and prints
// what that cost the API server per node. Each agent is a real
// k8ssync.Syncer with its own client, advertising a peer port on its own
// 127.x address, and with it the peer view the fan-out planner reads; its
// daemon (simNode) takes FLEET_BENCH_PULL (default 30s) to pull. What it
// does not model: the bytes (no peer port listens, no origin): peer
// requests per blob, origin bytes and the time to Ready are measured by
// daemon's and test/fanout's benchmarks, with real daemons.
func BenchmarkFleet(b *testing.B) {
	sizes := kubetest.FleetSizes(b)
	dl := 30 * time.Second
	if s := os.Getenv("FLEET_BENCH_PULL"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatalf("FLEET_BENCH_PULL=%q: %v", s, err)
		}
		dl = d
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			for range b.N {
				fleetRollout(b, n, dl)
			}
		})
	}
}

func fleetRollout(b *testing.B, nodes int, dl time.Duration) {
	cl := kubetest.Start(b)
	ctx, cancel := context.WithCancel(context.Background())
	kc := kubernetes.NewForConfigOrDie(cl.Config)
	dyn := dynamic.NewForConfigOrDie(cl.Config)
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "modelcache-system"}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	sims := make([]*simNode, nodes)
	logs := make([]*writeLog, nodes)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for i := range nodes {
		name := fmt.Sprintf("node-%04d", i)
		if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		sims[i] = &simNode{name: name, fleet: nodes, dl: dl, changed: make(chan struct{}), arts: map[string]*api.Artifact{}, free: 1 << 39}
		logs[i] = &writeLog{}
		cfg := rest.CopyConfig(cl.Config)
		l := logs[i]
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return loggingRT{rt, l} }
		s, err := k8ssync.New(k8ssync.Config{NodeName: name, Kube: cfg, Namespace: "modelcache-system", Aggregate: true, Log: benchLog(name),
			PeerAddress: fmt.Sprintf("http://127.%d.%d.%d:7435", 1+i>>16, (i>>8)&255, i&255)}, sims[i])
		if err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); s.Run(ctx) }()
		time.Sleep(10 * time.Millisecond) // agents that start over seconds, as a DaemonSet's do
	}
	kubetest.FleetUp(ctx, b, cl.Config, nodes)
	before, err := kubetest.APIMetrics(ctx, kc)
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range logs {
		l.mu.Lock()
		l.writes = nil
		l.mu.Unlock()
	}
	b.ResetTimer()
	t0 := time.Now()
	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc("fleet", map[string]any{"source": "https://example.com/fleet"}), metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	all := fmt.Sprintf("%d/%d", nodes, nodes)
	var aggregated time.Duration
	var told time.Time
	testenv.Eventually(b, "the fleet Ready, and every peer view showing it", 20*time.Minute, func() error {
		if aggregated == 0 {
			m := getMC(b, dyn, "fleet")
			if m == nil || m.Status.Nodes.ReadyText != all {
				if m != nil && time.Since(told) > 30*time.Second { // progress, on a run that takes minutes
					told = time.Now()
					fmt.Fprintf(os.Stderr, "fleet of %d, %.0fs: aggregated %+v\n", nodes, time.Since(t0).Seconds(), m.Status.Nodes)
				}
				if m == nil {
					return fmt.Errorf("no ModelCache fleet")
				}
				return fmt.Errorf("aggregated %+v", m.Status.Nodes)
			}
			aggregated = time.Since(t0)
		}
		for _, s := range sims {
			s.mu.Lock()
			at := s.viewAt
			s.mu.Unlock()
			if at.IsZero() {
				return fmt.Errorf("%s's peer view lacks Ready nodes", s.name)
			}
		}
		return nil
	})
	window := time.Since(t0)
	b.StopTimer()
	after, err := kubetest.APIMetrics(ctx, kc)
	if err != nil {
		b.Fatal(err)
	}
	var lastReady, lastView time.Time
	var mostPerMinute, watchers int
	for i, s := range sims {
		s.mu.Lock()
		if s.readyAt.After(lastReady) {
			lastReady = s.readyAt
		}
		if s.viewAt.After(lastView) {
			lastView = s.viewAt
		}
		s.mu.Unlock()
		logs[i].mu.Lock()
		mostPerMinute = max(mostPerMinute, maxPerMinute(logs[i].writes))
		if logs[i].watches > 0 {
			watchers++
		}
		logs[i].mu.Unlock()
	}
	d := func(k string) float64 { return after[k] - before[k] }
	minutes := window.Minutes()
	writes := d("modelcachenodes writes")
	perNodeMin := writes / float64(nodes) / minutes
	b.ReportMetric(perNodeMin, "mcn-writes/node/min")
	b.ReportMetric(d("modelcachenodes events")/max(writes, 1), "watch-events/write")
	b.ReportMetric(d("modelcaches events")/float64(nodes)/minutes, "mc-events/node/min")
	b.ReportMetric(d("modelcaches event bytes")/float64(nodes)/window.Seconds(), "mc-event-B/node/s")
	b.ReportMetric(lastView.Sub(lastReady).Seconds(), "s-view-lag")
	b.Logf("%d nodes, one kube-apiserver, a pull of %s on each: rollout window %.1fs (ModelCache created → aggregated %s and every peer view all Ready)", nodes, dl, window.Seconds(), all)
	b.Logf("  ModelCacheNode writes: %.0f = %.2f per node per minute of the window (%.1f per node); the most of one node in any minute: %d", writes, perNodeMin, writes/float64(nodes), mostPerMinute)
	b.Logf("  ModelCacheNode watch events: %.0f = %.2f per write; agents that watch ModelCacheNodes: %d (the elected one)", d("modelcachenodes events"), d("modelcachenodes events")/max(writes, 1), watchers)
	b.Logf("  ModelCache writes: %.0f; watch events %.0f = %.2f per node per minute, %.0f bytes per node per second", d("modelcaches writes"), d("modelcaches events"), d("modelcaches events")/float64(nodes)/minutes, d("modelcaches event bytes")/float64(nodes)/window.Seconds())
	b.Logf("  last local Ready → aggregated %s: %.1fs after the creation (the last pull ended %.1fs after it); last local Ready → every peer view shows the fleet Ready: %.1fs", all, aggregated.Seconds(), lastReady.Sub(t0).Seconds(), lastView.Sub(lastReady).Seconds())
	b.Logf("  not modelled here (no bytes move): peer requests per blob, origin bytes over the model, time to Ready over one node alone")
	if mostPerMinute > 6 {
		b.Errorf("a node wrote its ModelCacheNode %d times in one minute; the docs promise at most 6", mostPerMinute)
	}
	if watchers > 1 {
		b.Errorf("%d agents watch ModelCacheNodes; only the elected one should", watchers)
	}
}

// benchLog is a node agent's logger: none, or with FLEET_BENCH_LOG=info
// (or warn, debug) its lines at that level and above on stderr, each
// with the node's name.
func benchLog(node string) *slog.Logger {
	var l slog.Level
	if s := os.Getenv("FLEET_BENCH_LOG"); s == "" || l.UnmarshalText([]byte(s)) != nil {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l})).With("bench_node", node)
}
