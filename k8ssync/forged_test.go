package k8ssync_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore/storetest"
	"github.com/modelcache/modelcache/daemon"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/k8ssync"
)

// forgeStatus writes a ModelCache's status.resolved and status.active as
// a node's token may (every node may update ModelCache status).
func forgeStatus(t *testing.T, dyn dynamic.Interface, name string, resolved, active []k8ssync.ResolvedSource) {
	t.Helper()
	testenv.Eventually(t, "forge the status of "+name, 10*time.Second, func() error {
		u, err := dyn.Resource(k8ssync.ModelCacheGVR).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		raw, _ := json.Marshal(k8ssync.ModelCacheStatus{Resolved: resolved, Active: active})
		var st map[string]any
		json.Unmarshal(raw, &st)
		unstructured.SetNestedMap(u.Object, st, "status")
		_, err = dyn.Resource(k8ssync.ModelCacheGVR).UpdateStatus(context.Background(), u, metav1.UpdateOptions{})
		return err
	})
}

// TestForgedResolutionRefused: a ModelCache names
// hf://meta-llama/Llama-3-8B@main; a node's token writes into its status
// a resolution of another repository, of an attacker's URL (the
// ModelCache's Secret carries an HTTP_AUTHORIZATION) and of a path under
// kubelet's directory. The node (not the elected one) pulls none of them,
// says why in an Event naming both URIs and in its status, and takes a
// legitimate pinned revision; a forged status.active does not move what
// it serves; the elected daemon, once one runs, records the source again.
func TestForgedResolutionRefused(t *testing.T) {
	cl, kc, dyn := fleetCluster(t, "node-a", "node-b")
	ctx := context.Background()
	hub := hubtest.New()
	defer hub.Close()
	const spec = "hf://meta-llama/Llama-3-8B@main"
	c1 := hub.Commit("meta-llama/Llama-3-8B", map[string][]byte{"config.json": []byte(`{"model_type":"llama"}`), "w.safetensors": storetest.Data(64<<10, 1)}, "main")
	evil := hub.Commit("attacker/backdoored-llama", map[string][]byte{"config.json": []byte(`{"model_type":"llama"}`), "w.safetensors": storetest.Data(64<<10, 9)}, "main")
	t.Setenv("HF_ENDPOINT", hub.URL())
	t.Setenv("HF_TOKEN", "")
	var stolen atomic.Int64
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { stolen.Add(1) }))
	defer attacker.Close()
	if _, err := kc.CoreV1().Secrets("modelcache-system").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds"},
		StringData: map[string]string{"HTTP_AUTHORIZATION": "Bearer team-secret"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	follower := func(c *daemon.Config) { c.Cluster.Aggregate = false }
	a := startNodeIn(t, cl.Config, "node-a", noGPU, false, "modelcache-system", follower)
	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc("llama", map[string]any{"source": spec,
		"secretRef": map[string]any{"namespace": "modelcache-system", "name": "creds"}}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	forged := []string{"hf://attacker/backdoored-llama@" + evil, attacker.URL + "/steal.bin", "file:///var/lib/kubelet/pods"}
	legit := "hf://meta-llama/Llama-3-8B@" + c1
	entry := func(uri string) []k8ssync.ResolvedSource {
		return []k8ssync.ResolvedSource{{Artifact: "llama", Source: spec, Revision: c1, URI: uri, ResolvedAt: metav1.Now()}}
	}
	refused := func(field, uri string) func() error {
		return func() error {
			for _, ev := range eventsFor(kc, "llama", k8ssync.EventResolutionRefused) {
				if strings.Contains(ev, "node node-a") && strings.Contains(ev, field+" uri "+uri) && strings.Contains(ev, "source "+spec) {
					return nil
				}
			}
			return fmt.Errorf("no %s Event for %s: %v", k8ssync.EventResolutionRefused, uri, eventsFor(kc, "llama", k8ssync.EventResolutionRefused))
		}
	}
	notPulled := func(uri string) {
		t.Helper()
		if x, err := a.c.Get(ctx, "llama"); err == nil && (x.URI == uri || holdsRev(x, evil)) {
			t.Fatalf("node-a took the forged %s: %+v", uri, x)
		}
	}

	// Nothing served yet: each forged resolution is refused; the node waits.
	for _, uri := range forged {
		forgeStatus(t, dyn, "llama", entry(uri), nil)
		testenv.Eventually(t, "node-a refuses "+uri, 20*time.Second, refused("status.resolved", uri))
		testenv.Eventually(t, "node-a's status says why", 20*time.Second, func() error {
			n, err := nodeStatus(dyn, "node-a")
			if err != nil {
				return err
			}
			if as := artifactOn(n, "llama"); as == nil || as.Phase != string(api.PhasePending) || !strings.Contains(as.Message, "refused the cluster's status.resolved") {
				return fmt.Errorf("%+v", as)
			}
			return nil
		})
		notPulled(uri)
	}

	// A legitimate pinned revision is taken.
	forgeStatus(t, dyn, "llama", entry(legit), nil)
	testenv.Eventually(t, "node-a Ready at the legitimate revision", 30*time.Second, func() error {
		x, err := a.c.Get(ctx, "llama")
		if err != nil || x.Phase != api.PhaseReady || x.Revision != c1 || x.URI != legit {
			return fmt.Errorf("%+v %v", x, err)
		}
		return nil
	})

	// A forged status.active beside it: refused, the node keeps serving c1.
	// Each pass hands the daemon the whole desire set, so once a probe
	// created after the refusal is desired there, a later pass has
	// handed over llama's desire too: it must still be the legitimate one.
	for i, uri := range forged {
		forgeStatus(t, dyn, "llama", entry(legit), entry(uri))
		testenv.Eventually(t, "node-a refuses the active "+uri, 20*time.Second, refused("status.active", uri))
		probe := fmt.Sprintf("probe%d", i)
		if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc(probe, map[string]any{"source": legit}), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		forgeStatus(t, dyn, probe, []k8ssync.ResolvedSource{{Artifact: probe, Source: legit, Revision: c1, URI: legit, ResolvedAt: metav1.Now()}}, nil)
		testenv.Eventually(t, "a pass of node-a after the refusal desires "+probe, 20*time.Second, func() error {
			_, err := a.c.Get(ctx, probe)
			return err
		})
		if err := dyn.Resource(k8ssync.ModelCacheGVR).Delete(ctx, probe, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		x, err := a.c.Get(ctx, "llama")
		if err != nil || x.Phase != api.PhaseReady || x.Revision != c1 || x.URI != legit || x.Desire == nil || x.Desire.URI != legit {
			t.Fatalf("node-a moved: %+v %v", x, err)
		}
		notPulled(uri)
	}
	if n := stolen.Load(); n != 0 {
		t.Fatalf("the attacker's server got %d requests", n)
	}

	// The elected daemon drops the forged entries on its pass.
	forgeStatus(t, dyn, "llama", entry(forged[0]), entry(forged[1]))
	startNode(t, cl.Config, "node-b", noGPU, false)
	testenv.Eventually(t, "the elected daemon records the source again", 30*time.Second, func() error {
		m := getMC(t, dyn, "llama")
		r := resolvedOf(m, "llama")
		if r == nil || r.URI != legit || len(m.Status.Active) != 1 || m.Status.Active[0].URI != legit {
			return fmt.Errorf("%+v", m.Status)
		}
		return nil
	})
	if x, _ := a.c.Get(ctx, "llama"); x.Revision != c1 || x.URI != legit {
		t.Fatalf("node-a: %+v", x)
	}
}
