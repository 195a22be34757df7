package k8ssync_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore/storetest"
	"github.com/modelcache/modelcache/daemon"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/k8ssync"
)

// TestSeizedLeaseForgeryEndsWithIt: on the real API server with the
// bundle's RBAC and admission policies, as the attacker of issue 43 with
// one node's daemon token. Nodes A and B (their own node tokens) hold a
// model Ready; the cluster records its folder checksum; they stop. The
// attacker takes the aggregator's Lease, writes a zero checksum into
// status.resolved and status.active and itself as the only origin node,
// reports the zero checksum Ready from its own ModelCacheNode, and
// releases the Lease. Node C joins (no aggregator) and fails
// SourceChanged, saying it pulls again when the record changes. Node D,
// an honest daemon, takes the Lease: the first status it writes has no
// trace of the forgery, and C ends Ready with the true checksum.
func TestSeizedLeaseForgeryEndsWithIt(t *testing.T) {
	cl, kc, dyn := bundleCluster(t, "node-a", "node-b", "node-c", "node-d", "node-evil")
	ctx := context.Background()
	data := storetest.Data(64<<10, 43)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/w.bin" {
			http.NotFound(w, r)
			return
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
	}))
	defer srv.Close()
	src := srv.URL + "/w.bin"
	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc("w", map[string]any{"source": src}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// A and B: Ready, the cluster's checksum recorded from their reports.
	a := startNode(t, nodeToken(t, cl, kc, "node-a"), "node-a", noGPU, false)
	b := startNode(t, nodeToken(t, cl, kc, "node-b"), "node-b", noGPU, false)
	var truth string
	testenv.Eventually(t, "A and B Ready, the cluster's checksum recorded", 60*time.Second, func() error {
		x, _ := a.c.Get(ctx, "w")
		y, _ := b.c.Get(ctx, "w")
		m := getMC(t, dyn, "w")
		r := resolvedOf(m, "w")
		if x == nil || y == nil || x.Phase != api.PhaseReady || y.Phase != api.PhaseReady || r == nil || r.Digest == "" || r.Digest != x.ManifestDigest ||
			len(m.Status.Active) != 1 || m.Status.Active[0].Digest != r.Digest {
			return fmt.Errorf("A %+v, B %+v, status %+v", x, y, m)
		}
		truth = r.Digest
		return nil
	})
	for _, n := range []*node{a, b} {
		n.cancel()
		<-n.done
		n.done <- nil // for the cleanup's wait
	}

	// The attacker, with node-evil's token: seize, forge, release.
	evil := nodeToken(t, cl, kc, "node-evil")
	ekc, edyn := kubernetes.NewForConfigOrDie(evil), dynamic.NewForConfigOrDie(evil)
	leases := ekc.CoordinationV1().Leases("modelcache-system")
	setLease := func(holder string, seconds int32) {
		t.Helper()
		testenv.Eventually(t, "the attacker writes the Lease", 10*time.Second, func() error {
			l, err := leases.Get(ctx, "modelcache-aggregator", metav1.GetOptions{})
			if err != nil {
				return err
			}
			now := metav1.NewMicroTime(time.Now())
			l.Spec.HolderIdentity, l.Spec.LeaseDurationSeconds, l.Spec.RenewTime, l.Spec.AcquireTime = ptr.To(holder), ptr.To(seconds), &now, &now
			_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
			return err
		})
	}
	setLease("node-evil", 3600)
	zero := "sha256:" + strings.Repeat("0", 64)
	var forgedRV string
	testenv.Eventually(t, "the attacker forges the ModelCache status", 10*time.Second, func() error {
		u, err := edyn.Resource(k8ssync.ModelCacheGVR).Get(ctx, "w", metav1.GetOptions{})
		if err != nil {
			return err
		}
		var m k8ssync.ModelCache
		runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &m)
		for i := range m.Status.Resolved {
			m.Status.Resolved[i].Digest, m.Status.Resolved[i].OriginNodes = zero, []string{"node-evil"}
		}
		for i := range m.Status.Active {
			m.Status.Active[i].Digest = zero
		}
		raw, _ := json.Marshal(m.Status)
		var st map[string]any
		json.Unmarshal(raw, &st)
		unstructured.SetNestedMap(u.Object, st, "status")
		out, err := edyn.Resource(k8ssync.ModelCacheGVR).UpdateStatus(ctx, u, metav1.UpdateOptions{FieldManager: "attacker"})
		if err == nil {
			forgedRV = out.GetResourceVersion()
		}
		return err
	})
	// Its own report bears the forgery out, alone.
	r := resolvedOf(getMC(t, dyn, "w"), "w")
	report := map[string]any{"status": map[string]any{"heartbeat": time.Now().UTC().Format(time.RFC3339), "artifacts": []any{map[string]any{
		"name": "w", "modelCache": "w", "phase": "Ready", "source": r.URI, "revision": r.Revision, "digest": zero}}}}
	if _, err := edyn.Resource(k8ssync.ModelCacheNodeGVR).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": k8ssync.Group + "/" + k8ssync.Version, "kind": "ModelCacheNode",
		"metadata": map[string]any{"name": "node-evil", "labels": map[string]any{k8ssync.LabelNode: "node-evil"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(report)
	if _, err := edyn.Resource(k8ssync.ModelCacheNodeGVR).Patch(ctx, "node-evil", types.MergePatchType, raw, metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	setLease("", 1)

	// C joins, follows the forged record, fails, and says why.
	follower := func(c *daemon.Config) { c.Cluster.Aggregate = false }
	c := startNodeIn(t, nodeToken(t, cl, kc, "node-c"), "node-c", noGPU, false, "modelcache-system", follower)
	testenv.Eventually(t, "C fails on the forged checksum and says it waits for the record", 60*time.Second, func() error {
		x, err := c.c.Get(ctx, "w")
		if err != nil || x.Phase != api.PhaseFailed || x.Reason != api.ReasonSourceChanged || !strings.Contains(x.Message, "cluster has "+zero) ||
			!strings.Contains(x.Message, "pulls again when the cluster's record changes") {
			return fmt.Errorf("%+v %v", x, err)
		}
		return nil
	})

	// D, honest, takes the Lease: its first write drops the forgery.
	w, err := dyn.Resource(k8ssync.ModelCacheGVR).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=w", ResourceVersion: forgedRV})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	d := startNode(t, nodeToken(t, cl, kc, "node-d"), "node-d", noGPU, false)
	deadline := time.After(3 * time.Minute)
	for first := true; first; {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch of the ModelCache ended")
			}
			if ev.Type != watch.Modified {
				continue
			}
			u := ev.Object.(*unstructured.Unstructured)
			var m k8ssync.ModelCache
			runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &m)
			first = false
			for _, e := range append(slices.Clone(m.Status.Resolved), m.Status.Active...) {
				if e.Digest == zero || slices.Contains(e.OriginNodes, "node-evil") {
					t.Fatalf("the honest leader's first status write keeps the forgery: %+v", m.Status)
				}
				if e.Digest != truth {
					t.Errorf("the honest leader's first status write: checksum %q, want %s (A's and B's)", e.Digest, truth)
				}
			}
		case <-deadline:
			t.Fatal("no status written by the honest leader within 3 minutes")
		}
	}
	if l, err := kc.CoordinationV1().Leases("modelcache-system").Get(ctx, "modelcache-aggregator", metav1.GetOptions{}); err != nil || ptr.Deref(l.Spec.HolderIdentity, "") != "node-d" {
		t.Fatalf("the Lease after the honest write: %v %+v", err, l)
	}
	for _, n := range []*node{c, d} {
		testenv.Eventually(t, n.name+" Ready with the true checksum", 60*time.Second, func() error {
			x, err := n.c.Get(ctx, "w")
			if err != nil || x.Phase != api.PhaseReady || x.ManifestDigest != truth {
				return fmt.Errorf("%+v %v", x, err)
			}
			return nil
		})
	}
}
