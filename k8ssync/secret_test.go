package k8ssync_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore/storetest"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
	"github.com/modelcache/modelcache/internal/kubetest"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/k8ssync"
)

// secretRequests records the node's requests for Secrets.
type secretRequests struct {
	rt http.RoundTripper
	mu *sync.Mutex
	rs *[]string
}

func (c secretRequests) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.Contains(r.URL.Path, "/secrets") {
		q, _ := url.QueryUnescape(r.URL.RawQuery)
		c.mu.Lock()
		*c.rs = append(*c.rs, r.Method+" "+r.URL.Path+"?"+q)
		c.mu.Unlock()
	}
	return c.rt.RoundTrip(r)
}

// TestSecretRotationReachesTheFetcher: the node watches only the Secret
// a ModelCache names (a list and a watch with metadata.name), never GETs
// it again and again; when the token in it is rotated (the hub takes only
// the new one), the next pull uses the new token at once, over the open
// watch, with no further request for the Secret, and a pull that failed
// for want of it (AccessDenied) is retried at once. A Role narrowed by
// resourceNames to that Secret admits the node's watch and nothing else.
func TestSecretRotationReachesTheFetcher(t *testing.T) {
	cl := kubetest.Start(t)
	ctx := context.Background()
	kc := kubernetes.NewForConfigOrDie(cl.Config)
	dyn := dynamic.NewForConfigOrDie(cl.Config)
	kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "modelcache-system"}}, metav1.CreateOptions{})
	kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{})

	var token atomic.Value
	token.Store("tok-1")
	hub := hubtest.New()
	defer hub.Close()
	apiHost := strings.TrimPrefix(strings.TrimPrefix(hub.URL(), "http://"), "https://")
	var fileToken atomic.Value // when set, file downloads take only it (the API the last token)
	fileToken.Store("")
	hub.Hook = func(w http.ResponseWriter, r *http.Request) bool {
		want := token.Load().(string)
		if ft := fileToken.Load().(string); ft != "" && strings.Contains(r.URL.Path, "/resolve/") {
			want = ft
		}
		if r.Host == apiHost && r.Header.Get("Authorization") != "Bearer "+want {
			w.WriteHeader(http.StatusUnauthorized)
			return true
		}
		return false
	}
	hub.Commit("org/one", map[string][]byte{"config.json": []byte(`{"model_type":"x"}`), "w.safetensors": storetest.Data(50<<10, 1)}, "main")
	hub.Commit("org/two", map[string][]byte{"config.json": []byte(`{"model_type":"y"}`), "w.safetensors": storetest.Data(50<<10, 2)}, "main")
	hub.Commit("org/three", map[string][]byte{"config.json": []byte(`{"model_type":"z"}`), "w.safetensors": storetest.Data(50<<10, 3)}, "main")
	t.Setenv("HF_ENDPOINT", hub.URL())
	t.Setenv("HF_TOKEN", "")

	if _, err := kc.CoreV1().Secrets("modelcache-system").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "hf"}, StringData: map[string]string{"HF_TOKEN": "tok-1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var reqs []string
	cfg := rest.CopyConfig(cl.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return secretRequests{rt, &mu, &reqs} }
	a := startNode(t, cfg, "node-a", `{"devices":[]}`, false)
	ref := map[string]any{"namespace": "modelcache-system", "name": "hf"}
	ready := func(name string) {
		testenv.Eventually(t, name+" Ready with the Secret's token", 30*time.Second, func() error {
			if p := phaseOf(a, name); p != api.PhaseReady {
				x, _ := a.c.Get(ctx, name)
				return fmt.Errorf("phase %s %+v", p, x)
			}
			return nil
		})
	}
	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc("one", map[string]any{"source": "hf://org/one", "secretRef": ref}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ready("one")
	mu.Lock()
	before := append([]string(nil), reqs...)
	mu.Unlock()
	if len(before) == 0 {
		t.Fatal("no request for the Secret: the test does not see the node's traffic")
	}
	for _, r := range before {
		if !strings.HasPrefix(r, "GET /api/v1/namespaces/modelcache-system/secrets?") || !strings.Contains(r, "fieldSelector=metadata.name=hf") {
			t.Errorf("a request for Secrets that is not the list or watch of the one named: %s", r)
		}
	}

	// Rotate: the hub takes only the new token; the Secret has it.
	rotate := func(tok string) {
		sec, err := kc.CoreV1().Secrets("modelcache-system").Get(ctx, "hf", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		sec.Data = map[string][]byte{"HF_TOKEN": []byte(tok)}
		if _, err := kc.CoreV1().Secrets("modelcache-system").Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	token.Store("tok-2")
	rotate("tok-2")
	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc("two", map[string]any{"source": "hf://org/two", "secretRef": ref}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ready("two") // resolved by the elected daemon and pulled by the node, both with tok-2
	mu.Lock()
	after := append([]string(nil), reqs...)
	mu.Unlock()
	if len(after) != len(before) {
		t.Errorf("the rotation cost requests for the Secret (it must come over the open watch): %q", after[len(before):])
	}

	// A pull that failed for want of the new token (AccessDenied: not
	// retried on its own) is retried as soon as the Secret has it.
	fileToken.Store("tok-3")
	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc("three", map[string]any{"source": "hf://org/three", "secretRef": ref}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "three Failed: its files refuse tok-2", 30*time.Second, func() error {
		if x, _ := a.c.Get(ctx, "three"); x == nil || x.Phase != api.PhaseFailed || x.Reason != api.ReasonAccessDenied {
			return fmt.Errorf("%+v", x)
		}
		return nil
	})
	token.Store("tok-3")
	rotate("tok-3")
	ready("three")

	// RBAC: resourceNames narrow the node's list and watch to the Secret.
	u, err := cl.Env.AddUser(envtest.User{Name: "narrow"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kc.RbacV1().Roles("modelcache-system").Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "hf-only"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"list", "watch"}, ResourceNames: []string{"hf"}}}}, metav1.CreateOptions{})
	kc.RbacV1().RoleBindings("modelcache-system").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "hf-only"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "hf-only"},
		Subjects: []rbacv1.Subject{{Kind: "User", Name: "narrow"}}}, metav1.CreateOptions{})
	nc := kubernetes.NewForConfigOrDie(u.Config())
	testenv.Eventually(t, "the narrowed user lists and watches the one Secret", 10*time.Second, func() error {
		opts := metav1.ListOptions{FieldSelector: "metadata.name=hf"}
		if l, err := nc.CoreV1().Secrets("modelcache-system").List(ctx, opts); err != nil || len(l.Items) != 1 {
			return fmt.Errorf("list: %v", err)
		}
		w, err := nc.CoreV1().Secrets("modelcache-system").Watch(ctx, opts)
		if err != nil {
			return fmt.Errorf("watch: %v", err)
		}
		w.Stop()
		return nil
	})
	if _, err := nc.CoreV1().Secrets("modelcache-system").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("the narrowed user lists every Secret of the namespace: %v", err)
	}
}
