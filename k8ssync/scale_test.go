package k8ssync_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/internal/kubetest"
	"github.com/modelcache/modelcache/k8ssync"
)

// fakeNode is a daemon whose pulls finish at once: what the scale test
// measures is the sync loop's traffic, not downloads.
type fakeNode struct {
	mu      sync.Mutex
	want    map[string]api.Desire
	changed chan struct{}
}

func (f *fakeNode) SetClusterDesires(want map[string]api.Desire, _ map[string]map[string]string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(want) != len(f.want) {
		close(f.changed)
		f.changed = make(chan struct{})
	}
	f.want = want
	return nil
}

func (f *fakeNode) Artifacts() ([]api.Artifact, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []api.Artifact
	for n, ds := range f.want {
		if ds.State != api.StateAbsent {
			out = append(out, api.Artifact{Name: n, Kind: api.KindModel, Phase: api.PhaseReady, Revision: "r1", Bytes: 1 << 30})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (f *fakeNode) StatusNow() (*api.Status, error) {
	return &api.Status{StoreBytes: 1 << 30, FSCapacityBytes: 1 << 40, FSFreeBytes: 1 << 39}, nil
}
func (f *fakeNode) GPUs() api.GPUInventory { return api.GPUInventory{Source: "simulated"} }
func (f *fakeNode) Root() string           { return "/var/lib/modelcache" }
func (f *fakeNode) Changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}
func (f *fakeNode) SetPodHolders(map[string][]api.Holder) {}

type countingRT struct {
	rt http.RoundTripper
	n  *atomic.Int64
}

func (c countingRT) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	return c.rt.RoundTrip(r)
}

// TestTwentyNodes runs the sync loops of 20 simulated nodes against one
// API server and reports API requests per node per hour at steady state
// and the seconds from a ModelCache change to the aggregated Ready count.
// MODELCACHE_SCALE_WINDOW sets the steady-state window (default 20s; the
// closing note's numbers used 5m).
func TestTwentyNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("a measurement; runs without -short")
	}
	window := 20 * time.Second
	if w := os.Getenv("MODELCACHE_SCALE_WINDOW"); w != "" {
		d, err := time.ParseDuration(w)
		if err != nil {
			t.Fatal(err)
		}
		window = d
	}
	cl := kubetest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kc := kubernetes.NewForConfigOrDie(cl.Config)
	dyn := dynamic.NewForConfigOrDie(cl.Config)
	kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "modelcache-system"}}, metav1.CreateOptions{})
	const nodes = 20
	counts := make([]*atomic.Int64, nodes)
	var wg sync.WaitGroup
	for i := 0; i < nodes; i++ {
		name := fmt.Sprintf("sim-%02d", i)
		kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pool": "gpu"}}}, metav1.CreateOptions{})
		counts[i] = &atomic.Int64{}
		cfg := rest.CopyConfig(cl.Config)
		n := counts[i]
		cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return countingRT{rt, n} }
		s, err := k8ssync.New(k8ssync.Config{NodeName: name, Kube: cfg, Namespace: "modelcache-system", Aggregate: true}, &fakeNode{changed: make(chan struct{})})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); s.Run(ctx) }()
	}
	defer wg.Wait()
	defer cancel()

	// A change → the aggregated count.
	latency := func(name string) time.Duration {
		t0 := time.Now()
		if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc(name, map[string]any{"source": "https://example.com/" + name,
			"nodeSelector": map[string]any{"matchLabels": map[string]any{"pool": "gpu"}}}), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, name+" Ready on 20 nodes", 120*time.Second, func() error {
			m := getMC(t, dyn, name)
			if m == nil || m.Status.Nodes.ReadyText != "20/20" {
				return fmt.Errorf("%+v", m)
			}
			return nil
		})
		return time.Since(t0)
	}
	first := latency("m1")
	second := latency("m2")
	time.Sleep(3 * time.Second) // let the writes of that change settle
	before := make([]int64, nodes)
	for i := range counts {
		before[i] = counts[i].Load()
	}
	time.Sleep(window)
	var total int64
	per := make([]string, nodes)
	for i := range counts {
		d := counts[i].Load() - before[i]
		total += d
		per[i] = fmt.Sprint(d)
	}
	perHour := float64(total) / nodes / window.Hours()
	t.Logf("20 nodes, one API server: change → aggregated Ready 20/20 in %.2fs (first ModelCache, with the election) and %.2fs (second)", first.Seconds(), second.Seconds())
	t.Logf("steady state over %s: %d requests from 20 nodes (%s each) = %.0f requests per node per hour", window, total, strings.Join(per, " "), perHour)
	if perHour > 3600 {
		t.Errorf("%.0f requests per node per hour at steady state: the loop polls", perHour)
	}
}

func errorf(f string, a ...any) error { return fmt.Errorf(f, a...) }
