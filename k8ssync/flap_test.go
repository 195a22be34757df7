package k8ssync_test

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/modelcache/modelcache/internal/kubetest"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/k8ssync"
)

// TestAPIServerFlapping: the API server comes and goes every second for
// 15 s. The loop keeps running (no crash, no exit), its request rate
// stays bounded (no storm of retries or status writes), and once the
// server stays up the node's status is current again.
func TestAPIServerFlapping(t *testing.T) {
	if testing.Short() {
		t.Skip("flapping")
	}
	cl := kubetest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kc := kubernetes.NewForConfigOrDie(cl.Config)
	dyn := dynamic.NewForConfigOrDie(cl.Config)
	kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "modelcache-system"}}, metav1.CreateOptions{})
	kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "flappy"}}, metav1.CreateOptions{})
	proxy, pcfg := cl.Proxy(t)
	var reqs atomic.Int64
	cfg := rest.CopyConfig(pcfg)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return countingRT{rt, &reqs} }
	node := &fakeNode{changed: make(chan struct{})}
	s, err := k8ssync.New(k8ssync.Config{NodeName: "flappy", Kube: cfg, Namespace: "modelcache-system", StatusInterval: 200 * time.Millisecond, Aggregate: true}, node)
	if err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- s.Run(ctx) }()
	dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc("one", map[string]any{"source": "https://example.com/one"}), metav1.CreateOptions{})
	testenv.Eventually(t, "first status", 30*time.Second, func() error { _, err := nodeStatus(dyn, "flappy"); return err })

	before := reqs.Load()
	const flapFor = 15 * time.Second
	end := time.Now().Add(flapFor)
	for up := false; time.Now().Before(end); up = !up {
		if up {
			if err := proxy.Up(); err != nil {
				t.Fatal(err)
			}
		} else {
			proxy.Down()
		}
		// Desires change while it flaps: the loop must catch up later.
		dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc("m"+time.Now().Format("150405.000")[7:], map[string]any{"source": "https://example.com/x"}), metav1.CreateOptions{})
		time.Sleep(time.Second)
	}
	proxy.Up()
	during := reqs.Load() - before
	select {
	case err := <-exited:
		t.Fatalf("the loop exited while the API server flapped: %v", err)
	default:
	}
	testenv.Eventually(t, "status current after the flapping", 60*time.Second, func() error {
		n, err := nodeStatus(dyn, "flappy")
		if err != nil {
			return err
		}
		mcs, err := dyn.Resource(k8ssync.ModelCacheGVR).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(n.Status.Artifacts) != len(mcs.Items) {
			return errorf("node lists %d artifacts, %d ModelCaches exist", len(n.Status.Artifacts), len(mcs.Items))
		}
		return nil
	})
	t.Logf("%d requests in %s of flapping (%.1f/s)", during, flapFor, float64(during)/flapFor.Seconds())
	if per := float64(during) / flapFor.Seconds(); per > 20 {
		t.Errorf("%.1f requests/s while the API server flaps: a retry storm", per)
	}
}
