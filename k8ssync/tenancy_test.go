package k8ssync_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore/storetest"
	"github.com/modelcache/modelcache/csi"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
	"github.com/modelcache/modelcache/internal/kubetest"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/k8ssync"
)

func grantObj(ns, name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "modelcache.io/v1alpha1", "kind": "ModelCacheCredentials",
		"metadata": map[string]any{"name": name, "namespace": ns}, "spec": spec,
	}}
}

// TestCredentialsBelongToANamespace, on a real API server: a ModelCache
// (cluster-scoped) that names a Secret of another namespace is refused:
// the token never reaches the source, the artifact waits with the
// migration as its reason and a CredentialsRefused Event says it. A
// ModelCacheCredentials of that namespace that does not list the source
// is refused too (the Secret would go where the namespace did not say);
// one that does makes the Secret usable, and the artifact it fetches is
// private to that namespace: a pod of another namespace is refused its
// volume (PermissionDenied), a pod of the namespace holds it.
func TestCredentialsBelongToANamespace(t *testing.T) {
	cl := kubetest.Start(t)
	ctx := context.Background()
	kc := kubernetes.NewForConfigOrDie(cl.Config)
	dyn := dynamic.NewForConfigOrDie(cl.Config)
	for _, ns := range []string{"modelcache-system", "team-a"} {
		if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{})

	hub := hubtest.New()
	defer hub.Close()
	var withToken atomic.Int64
	apiHost := strings.TrimPrefix(strings.TrimPrefix(hub.URL(), "http://"), "https://")
	hub.Hook = func(w http.ResponseWriter, r *http.Request) bool {
		if r.Host != apiHost { // the file store a resolve redirects to: no token goes there
			return false
		}
		if r.Header.Get("Authorization") == "Bearer team-a-token" {
			withToken.Add(1)
			return false
		}
		w.WriteHeader(http.StatusUnauthorized)
		return true
	}
	hub.Commit("team-a/finetune", map[string][]byte{"config.json": []byte(`{"model_type":"x"}`), "w.safetensors": storetest.Data(32<<10, 7)}, "main")
	t.Setenv("HF_ENDPOINT", hub.URL())
	t.Setenv("HF_TOKEN", "")
	if _, err := kc.CoreV1().Secrets("team-a").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "hf"},
		StringData: map[string]string{"HF_TOKEN": "team-a-token"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	a := startNode(t, cl.Config, "node-a", `{"devices":[]}`, false)
	const src = "hf://team-a/finetune"
	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc("borrow", map[string]any{"source": src,
		"secretRef": map[string]any{"namespace": "team-a", "name": "hf"}}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	refused := func(want string) func() error {
		return func() error {
			for _, ev := range eventsFor(kc, "borrow", k8ssync.EventCredentialsRefused) {
				if strings.Contains(ev, "node node-a") && strings.Contains(ev, "team-a/hf") && strings.Contains(ev, want) {
					return nil
				}
			}
			return fmt.Errorf("no %s Event with %q: %v", k8ssync.EventCredentialsRefused, want, eventsFor(kc, "borrow", k8ssync.EventCredentialsRefused))
		}
	}
	testenv.Eventually(t, "the borrowed Secret refused, naming the migration", 30*time.Second,
		refused("create one there with modelCache: borrow, secretName: hf, sources: ["+src+"]"))
	if x, err := a.c.Get(ctx, "borrow"); err == nil && x.Phase == api.PhaseReady {
		t.Fatalf("pulled with a refused Secret: %+v", x)
	}
	if n := withToken.Load(); n != 0 {
		t.Fatalf("team-a's token reached the hub %d times for a ModelCache team-a did not grant it to", n)
	}

	// A grant for another source only: still refused.
	grants := dyn.Resource(k8ssync.ModelCacheCredentialsGVR).Namespace("team-a")
	if _, err := grants.Create(ctx, grantObj("team-a", "borrow", map[string]any{"modelCache": "borrow", "secretName": "hf",
		"sources": []any{"hf://team-a/other"}}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "a grant that does not list the source refused", 30*time.Second, refused("does not list "+src))
	if n := withToken.Load(); n != 0 {
		t.Fatalf("team-a's token reached the hub %d times for a source team-a did not grant", n)
	}

	// The namespace grants it: Ready with its token.
	g, err := grants.Get(ctx, "borrow", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	unstructured.SetNestedSlice(g.Object, []any{src}, "spec", "sources")
	if _, err := grants.Update(ctx, g, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "Ready with the granted Secret", 60*time.Second, func() error {
		if x, err := a.c.Get(ctx, "borrow"); err != nil || x.Phase != api.PhaseReady {
			return fmt.Errorf("%+v %v", x, err)
		}
		return nil
	})
	if withToken.Load() == 0 {
		t.Fatal("Ready, but the hub never saw the granted token")
	}

	// Private to team-a: CSI refuses a pod of team-b and holds for team-a.
	be := a.d.CSIBackend()
	_, _, err = be.Hold(ctx, csi.Volume{ID: "v-b", Target: "/x/b", Model: "borrow", KernelCaches: "none", PodNamespace: "team-b", PodName: "p"})
	if err == nil || !strings.Contains(err.Error(), "PermissionDenied") || !strings.Contains(err.Error(), "team-b") {
		t.Fatalf("a pod of team-b mounted team-a's private model: %v", err)
	}
	if _, _, err := be.Hold(ctx, csi.Volume{ID: "v-a", Target: "/x/a", Model: "borrow", KernelCaches: "none", PodNamespace: "team-a", PodName: "p"}); err != nil {
		t.Fatalf("a pod of team-a: %v", err)
	}
	be.Release(ctx, "v-a")
}
