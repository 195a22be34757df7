package k8ssync_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore/storetest"
	"github.com/modelcache/modelcache/daemon"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
	"github.com/modelcache/modelcache/fetchers/oci"
	"github.com/modelcache/modelcache/fetchers/oci/ocitest"
	"github.com/modelcache/modelcache/internal/kubetest"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/k8ssync"
)

const noGPU = `{"devices":[]}`

func fleetCluster(t *testing.T, nodes ...string) (*kubetest.Cluster, kubernetes.Interface, dynamic.Interface) {
	t.Helper()
	cl := kubetest.Start(t)
	ctx := context.Background()
	kc := kubernetes.NewForConfigOrDie(cl.Config)
	dyn := dynamic.NewForConfigOrDie(cl.Config)
	kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "modelcache-system"}}, metav1.CreateOptions{})
	for _, n := range nodes {
		if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"pool": n}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return cl, kc, dyn
}

func resolvedOf(m *k8ssync.ModelCache, artifact string) *k8ssync.ResolvedSource {
	if m == nil {
		return nil
	}
	for i := range m.Status.Resolved {
		if m.Status.Resolved[i].Artifact == artifact {
			return &m.Status.Resolved[i]
		}
	}
	return nil
}

func labelsOf(kc kubernetes.Interface, node string) map[string]string {
	n, err := kc.CoreV1().Nodes().Get(context.Background(), node, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	return n.Labels
}

func updateSpec(t *testing.T, dyn dynamic.Interface, name string, f func(spec map[string]any)) {
	t.Helper()
	updateMC(t, dyn, name, func(u *unstructured.Unstructured) {
		spec, _, _ := unstructured.NestedMap(u.Object, "spec")
		f(spec)
		unstructured.SetNestedMap(u.Object, spec, "spec")
	})
}

// updateMC reads a ModelCache, changes it with f and writes it back,
// again on a conflict.
func updateMC(t *testing.T, dyn dynamic.Interface, name string, f func(u *unstructured.Unstructured)) {
	t.Helper()
	testenv.Eventually(t, "update "+name, 10*time.Second, func() error {
		u, err := dyn.Resource(k8ssync.ModelCacheGVR).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		f(u)
		_, err = dyn.Resource(k8ssync.ModelCacheGVR).Update(context.Background(), u, metav1.UpdateOptions{})
		return err
	})
}

// TestBranchMovesBetweenPulls: main moves after node A is Ready; node B
// starts afterwards. Both serve the first commit, the status names it,
// no node ever served the second; the scheduling labels follow.
func TestBranchMovesBetweenPulls(t *testing.T) {
	cl, kc, dyn := fleetCluster(t, "node-a", "node-b")
	ctx := context.Background()
	hub := hubtest.New()
	defer hub.Close()
	c1 := hub.Commit("org/m", map[string][]byte{"config.json": []byte(`{"model_type":"x"}`), "w.safetensors": storetest.Data(100<<10, 1)}, "main")
	t.Setenv("HF_ENDPOINT", hub.URL())
	t.Setenv("HF_TOKEN", "")

	a := startNode(t, cl.Config, "node-a", noGPU, false)
	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc("m", map[string]any{"source": "hf://org/m"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "m Ready on node-a at the cluster's resolution", 30*time.Second, func() error {
		x, err := a.c.Get(ctx, "m")
		if err != nil || x.Phase != api.PhaseReady {
			return fmt.Errorf("%+v %v", x, err)
		}
		if x.Revision != c1 || x.URI != "hf://org/m@"+c1 {
			return fmt.Errorf("node-a pulled %s from %s, want %s", x.Revision, x.URI, c1)
		}
		return nil
	})
	testenv.Eventually(t, "status.resolved names commit 1", 30*time.Second, func() error {
		m := getMC(t, dyn, "m")
		r := resolvedOf(m, "m")
		if r == nil || r.Revision != c1 || r.URI != "hf://org/m@"+c1 || r.ResolvedAt.IsZero() || m.Status.Revision != c1 {
			return fmt.Errorf("%+v", m.Status)
		}
		return nil
	})
	if r := resolvedOf(getMC(t, dyn, "m"), "m"); r.Digest != "" {
		t.Fatalf("one node's report set the cluster's folder checksum %s", r.Digest)
	}
	testenv.Eventually(t, "node-a labelled ready", 20*time.Second, func() error {
		if l := labelsOf(kc, "node-a"); l[k8ssync.LabelModelPrefix+"m"] != "ready" {
			return fmt.Errorf("%v", l)
		}
		return nil
	})

	// main moves; node B joins.
	c2 := hub.Commit("org/m", map[string][]byte{"config.json": []byte(`{"model_type":"y"}`), "w.safetensors": storetest.Data(100<<10, 2)}, "main")
	b := startNode(t, cl.Config, "node-b", noGPU, false)
	testenv.Eventually(t, "m Ready on node-b", 30*time.Second, func() error {
		x, err := b.c.Get(ctx, "m")
		if err != nil || x.Phase != api.PhaseReady {
			return fmt.Errorf("%+v %v", x, err)
		}
		return nil
	})
	// Two nodes agree: their folder checksum is the cluster's.
	var digest string
	testenv.Eventually(t, "status.resolved records the folder checksum both nodes report", 30*time.Second, func() error {
		r := resolvedOf(getMC(t, dyn, "m"), "m")
		x, _ := a.c.Get(ctx, "m")
		if r == nil || r.Digest == "" || x == nil || r.Digest != x.ManifestDigest {
			return fmt.Errorf("%+v / %+v", r, x)
		}
		digest = r.Digest
		return nil
	})
	for _, n := range []*node{a, b} {
		x, _ := n.c.Get(ctx, "m")
		if x.Revision != c1 || x.ManifestDigest != digest {
			t.Fatalf("%s serves %s (%s); the cluster resolved %s (%s)", n.name, x.Revision, x.ManifestDigest, c1, digest)
		}
		for _, v := range x.Versions {
			if v.Revision == c2 {
				t.Fatalf("%s holds commit 2", n.name)
			}
		}
		if _, err := os.Stat(filepath.Join(n.root, "models", "m", c2)); !os.IsNotExist(err) {
			t.Fatalf("%s has a tree of commit 2: %v", n.name, err)
		}
	}
	// The HF view names the pinned commit by the branch, as a pull of
	// the branch would: HF_HUB_OFFLINE loads org/m at main.
	for _, n := range []*node{a, b} {
		ref, err := os.ReadFile(filepath.Join(n.root, "hf", "models--org--m", "refs", "main"))
		if err != nil || string(ref) != c1 {
			t.Fatalf("%s: refs/main = %q (%v), want %s", n.name, ref, err, c1)
		}
	}
	m := getMC(t, dyn, "m")
	if r := resolvedOf(m, "m"); r == nil || r.Revision != c1 || r.Digest != digest {
		t.Fatalf("the resolution moved: %+v", m.Status.Resolved)
	}
	testenv.Eventually(t, "both nodes labelled", 20*time.Second, func() error {
		for _, n := range []string{"node-a", "node-b"} {
			if l := labelsOf(kc, n); l[k8ssync.LabelModelPrefix+"m"] != "ready" {
				return fmt.Errorf("%s: %v", n, l)
			}
		}
		return nil
	})

	// Absent: evicted, the labels go.
	updateSpec(t, dyn, "m", func(spec map[string]any) { spec["state"] = "Absent" })
	testenv.Eventually(t, "labels removed on Absent", 20*time.Second, func() error {
		for _, n := range []string{"node-a", "node-b"} {
			if l := labelsOf(kc, n); l[k8ssync.LabelModelPrefix+"m"] != "" {
				return fmt.Errorf("%s: %v", n, l)
			}
		}
		return nil
	})
}

// TestFolderChecksumPerCluster: a source without revisions (plain HTTP)
// whose bytes change after two nodes committed them (their agreement is
// the cluster's folder checksum): a node that pulls it afterwards fails
// with the cluster's reason and keeps serving what it had.
func TestFolderChecksumPerCluster(t *testing.T) {
	cl, _, dyn := fleetCluster(t, "node-a", "node-b", "node-c")
	ctx := context.Background()
	var mu sync.Mutex
	files := map[string][]byte{"/v1.bin": storetest.Data(64<<10, 1), "/v2.bin": storetest.Data(64<<10, 2)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		b, ok := files[r.URL.Path]
		mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(b))
	}))
	defer srv.Close()
	a := startNode(t, cl.Config, "node-a", noGPU, false)
	b := startNode(t, cl.Config, "node-b", noGPU, false)
	c := startNode(t, cl.Config, "node-c", noGPU, false)
	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc("drift", map[string]any{"source": srv.URL + "/v1.bin"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*node{a, b, c} {
		testenv.Eventually(t, "v1 Ready on "+n.name, 30*time.Second, func() error {
			if p := phaseOf(n, "drift"); p != api.PhaseReady {
				return fmt.Errorf("phase %q", p)
			}
			return nil
		})
	}
	old, _ := c.c.Get(ctx, "drift")

	// v2 on node-a and node-b only: their folder checksum becomes the
	// cluster's.
	updateSpec(t, dyn, "drift", func(spec map[string]any) {
		spec["source"] = srv.URL + "/v2.bin"
		spec["nodeSelector"] = map[string]any{"matchExpressions": []any{map[string]any{"key": "pool", "operator": "In", "values": []any{"node-a", "node-b"}}}}
	})
	var digest string
	testenv.Eventually(t, "the cluster records the checksum of v2 that node-a and node-b agree on", 30*time.Second, func() error {
		r := resolvedOf(getMC(t, dyn, "drift"), "drift")
		x, _ := a.c.Get(ctx, "drift")
		if r == nil || r.Source != srv.URL+"/v2.bin" || r.Digest == "" || x == nil || x.ManifestDigest != r.Digest {
			return fmt.Errorf("%+v / %+v", r, x)
		}
		digest = r.Digest
		return nil
	})

	// The bytes change; node-c is selected again.
	mu.Lock()
	files["/v2.bin"] = storetest.Data(64<<10, 3)
	mu.Unlock()
	updateSpec(t, dyn, "drift", func(spec map[string]any) { delete(spec, "nodeSelector") })
	testenv.Eventually(t, "node-c fails with the cluster's reason", 30*time.Second, func() error {
		x, err := c.c.Get(ctx, "drift")
		if err != nil || x.Phase != api.PhaseFailed || x.Reason != api.ReasonSourceChanged ||
			!strings.Contains(x.Message, "source changed since the cluster resolved it: digest ") || !strings.Contains(x.Message, "cluster has "+digest) {
			return fmt.Errorf("%+v %v", x, err)
		}
		return nil
	})
	x, _ := c.c.Get(ctx, "drift")
	if x.Revision != old.Revision || x.ManifestDigest != old.ManifestDigest {
		t.Fatalf("node-c no longer serves what it had: %s (%s), had %s (%s)", x.Revision, x.ManifestDigest, old.Revision, old.ManifestDigest)
	}
	if _, err := os.Stat(filepath.Join(c.root, "models", "drift", "current")); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "node-c's status says why", 20*time.Second, func() error {
		n, err := nodeStatus(dyn, "node-c")
		if err != nil {
			return err
		}
		if as := artifactOn(n, "drift"); as == nil || as.Reason != api.ReasonSourceChanged {
			return fmt.Errorf("%+v", as)
		}
		return nil
	})
	if r := resolvedOf(getMC(t, dyn, "drift"), "drift"); r == nil || r.Digest != digest {
		t.Fatalf("the cluster's checksum moved: %+v", r)
	}
}

// TestOCITagMovesBetweenPulls: the same for an OCI tag, for a model and
// its kernel cache: the tags move after node A is Ready, node B starts
// afterwards; both serve the first manifests.
func TestOCITagMovesBetweenPulls(t *testing.T) {
	cl, kc, dyn := fleetCluster(t, "node-a", "node-b")
	ctx := context.Background()
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	model := func(seed byte) v1.Image {
		img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
		img = mutate.ConfigMediaType(img, "application/vnd.unknown.config.v1+json")
		img, err := mutate.Append(img, mutate.Addendum{Layer: static.NewLayer(storetest.Data(32<<10, seed), "application/vnd.oci.image.layer.v1.raw"),
			Annotations: map[string]string{oci.AnnotationTitle: "w.safetensors"}})
		if err != nil {
			t.Fatal(err)
		}
		return img
	}
	m1 := strings.TrimPrefix(ocitest.Push(t, host, "models/m:v1", model(1)), "sha256:")
	k1 := strings.TrimPrefix(ocitest.Push(t, host, "kernels/m:sm90", ocitest.SM90(map[string][]byte{"k.cubin": []byte("one")}).Image(t)), "sha256:")
	h100 := `{"cudaDriverVersion":"12.4","devices":[{"name":"NVIDIA H100","uuid":"GPU-%s","computeCapability":"9.0"}]}`
	insecure := func(c *daemon.Config) { c.InsecureRegistries = []string{host} }

	a := startNodeIn(t, cl.Config, "node-a", fmt.Sprintf(h100, "a"), false, "modelcache-system", insecure)
	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc("m", map[string]any{"source": "oci://" + host + "/models/m:v1",
		"kernelCaches": []any{map[string]any{"name": "m-sm90", "image": "oci://" + host + "/kernels/m:sm90", "signature": map[string]any{"policy": "off"}}}}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ready := func(n *node, name, rev string) func() error {
		return func() error {
			x, err := n.c.Get(ctx, name)
			if err != nil || x.Phase != api.PhaseReady || x.Revision != rev {
				return fmt.Errorf("%+v %v", x, err)
			}
			return nil
		}
	}
	testenv.Eventually(t, "model and kernel cache Ready on node-a", 30*time.Second, func() error {
		if err := ready(a, "m", m1)(); err != nil {
			return err
		}
		return ready(a, "m-sm90", k1)()
	})
	testenv.Eventually(t, "status.resolved pins both by digest", 20*time.Second, func() error {
		m := getMC(t, dyn, "m")
		r, k := resolvedOf(m, "m"), resolvedOf(m, "m-sm90")
		if r == nil || k == nil || r.URI != "oci://"+host+"/models/m@sha256:"+m1 || k.URI != "oci://"+host+"/kernels/m@sha256:"+k1 {
			return fmt.Errorf("%+v", m.Status.Resolved)
		}
		return nil
	})
	testenv.Eventually(t, "node-a labelled for the model and the kernel cache", 20*time.Second, func() error {
		l := labelsOf(kc, "node-a")
		if l[k8ssync.LabelModelPrefix+"m"] != "ready" || l[k8ssync.LabelKernelCachePrefix+"m-sm90"] != "compatible" {
			return fmt.Errorf("%v", l)
		}
		return nil
	})

	// Both tags move; node B joins.
	m2 := strings.TrimPrefix(ocitest.Push(t, host, "models/m:v1", model(2)), "sha256:")
	k2 := strings.TrimPrefix(ocitest.Push(t, host, "kernels/m:sm90", ocitest.SM90(map[string][]byte{"k.cubin": []byte("two")}).Image(t)), "sha256:")
	if m2 == m1 || k2 == k1 {
		t.Fatal("the tags did not move")
	}
	b := startNodeIn(t, cl.Config, "node-b", fmt.Sprintf(h100, "b"), false, "modelcache-system", insecure)
	testenv.Eventually(t, "node-b serves the first manifests", 30*time.Second, func() error {
		if err := ready(b, "m", m1)(); err != nil {
			return err
		}
		return ready(b, "m-sm90", k1)()
	})
	for _, n := range []*node{a, b} {
		for name, rev := range map[string]string{"m": m1, "m-sm90": k1} {
			if err := ready(n, name, rev)(); err != nil {
				t.Fatalf("%s %s: %v", n.name, name, err)
			}
		}
	}
}
