package k8ssync_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/internal/kubetest"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/k8ssync"
)

// statusBodies records the statuses a node applies, and when.
type statusBodies struct {
	rt http.RoundTripper
	mu sync.Mutex
	at []time.Time
	st []k8ssync.ModelCacheNodeStatus
}

func (s *statusBodies) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPatch && strings.HasSuffix(r.URL.Path, "/status") && r.Body != nil {
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(b))
		var obj struct {
			Status k8ssync.ModelCacheNodeStatus `json:"status"`
		}
		json.Unmarshal(b, &obj)
		s.mu.Lock()
		s.at, s.st = append(s.at, time.Now()), append(s.st, obj.Status)
		s.mu.Unlock()
	}
	return s.rt.RoundTrip(r)
}

// TestNodeStatusWritesPhasesNotProgress: while a pull runs, the node's
// free and used bytes move at every pass, and none of that is written
// on its own (it is not 5% of the disk): each status written differs from
// the one before in more than its capacity figures, writes are at least
// StatusInterval apart, and the phase change that ends the pull is
// written.
func TestNodeStatusWritesPhasesNotProgress(t *testing.T) {
	cl := kubetest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kc := kubernetes.NewForConfigOrDie(cl.Config)
	kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "modelcache-system"}}, metav1.CreateOptions{})
	if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "busy"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	node := &simNode{name: "busy", fleet: 1, dl: time.Hour, changed: make(chan struct{}), arts: map[string]*api.Artifact{}, free: 1 << 39}
	rec := &statusBodies{}
	cfg := rest.CopyConfig(cl.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { rec.rt = rt; return rec }
	const interval = time.Second
	s, err := k8ssync.New(k8ssync.Config{NodeName: "busy", Kube: cfg, Namespace: "modelcache-system", StatusInterval: interval}, node)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	defer func() { cancel(); <-done }()
	// A pull that runs: Downloading, its bytes landing at every read of
	// the node's status (simNode.StatusNow).
	node.SetClusterDesires(map[string]api.Desire{"llama": {Name: "llama", URI: "https://example.com/llama", Revision: "r1"}}, nil)
	written := func(phase string) func() error {
		return func() error {
			rec.mu.Lock()
			defer rec.mu.Unlock()
			for _, st := range rec.st {
				if len(st.Artifacts) == 1 && st.Artifacts[0].Phase == phase {
					return nil
				}
			}
			return fmt.Errorf("no status with llama %s written yet (%d writes)", phase, len(rec.st))
		}
	}
	testenv.Eventually(t, "llama Downloading in the status", 60*time.Second, written(string(api.PhaseDownloading)))
	// Passes while bytes land: the loop runs at each change of the node.
	for range 40 {
		node.mu.Lock()
		node.notifyLocked()
		node.mu.Unlock()
		time.Sleep(100 * time.Millisecond)
	}
	node.mu.Lock()
	a := node.arts["llama"]
	a.Phase, a.Path, a.Progress = api.PhaseReady, "/var/lib/modelcache/models/llama/current", nil
	node.notifyLocked()
	node.mu.Unlock()
	testenv.Eventually(t, "llama Ready in the status", 60*time.Second, written(string(api.PhaseReady)))
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rest := func(st k8ssync.ModelCacheNodeStatus) string {
		st.FreeBytes, st.UsedBytes, st.ReservedBytes, st.CapacityBytes, st.Heartbeat = 0, 0, 0, 0, metav1.Time{}
		b, _ := json.Marshal(st)
		return string(b)
	}
	if rec.st[0].FreeBytes == rec.st[len(rec.st)-1].FreeBytes {
		t.Fatal("the free bytes never moved: the test shows nothing")
	}
	for i := 1; i < len(rec.st); i++ {
		if rest(rec.st[i]) == rest(rec.st[i-1]) {
			t.Errorf("write %d of %d changed only the capacity figures (free %d → %d): progress belongs in metrics, not in a status write",
				i+1, len(rec.st), rec.st[i-1].FreeBytes, rec.st[i].FreeBytes)
		}
		if gap := rec.at[i].Sub(rec.at[i-1]); gap < interval {
			t.Errorf("writes %d and %d %s apart, under the status interval %s", i, i+1, gap, interval)
		}
	}
}
