package k8ssync_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore/storetest"
	"github.com/modelcache/modelcache/daemon"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
	"github.com/modelcache/modelcache/internal/kubetest"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/k8ssync"
)

type node struct {
	name   string
	d      *daemon.Daemon
	c      *api.Client
	root   string
	cancel context.CancelFunc
	done   chan error
}

func startNode(t *testing.T, kcfg *rest.Config, name string, gpus string, localPVs bool) *node {
	t.Helper()
	return startNodeIn(t, kcfg, name, gpus, localPVs, "modelcache-system")
}

// startNodeIn starts a node whose aggregator Lease lives in namespace.
// opts adjust the daemon's configuration.
func startNodeIn(t *testing.T, kcfg *rest.Config, name string, gpus string, localPVs bool, namespace string, opts ...func(*daemon.Config)) *node {
	t.Helper()
	dir := t.TempDir()
	cfg := daemon.DefaultConfig()
	cfg.Root, cfg.Socket, cfg.MetricsAddr = filepath.Join(dir, "root"), filepath.Join(dir, "s.sock"), ""
	cfg.ModelsDir, cfg.SocketGroup = filepath.Join(dir, "models.d"), ""
	cfg.RetryInitial, cfg.RetryMax = 50*time.Millisecond, 200*time.Millisecond
	cfg.CapacityInterval = 200 * time.Millisecond
	inv := filepath.Join(dir, "gpus.json")
	os.WriteFile(inv, []byte(gpus), 0o644)
	cfg.GPUInventory = inv
	cfg.Cluster = &k8ssync.Config{NodeName: name, Kube: kcfg, Namespace: namespace, Self: namespace + "/modelcached-" + name, StatusInterval: 200 * time.Millisecond,
		PublishInterval: 200 * time.Millisecond, LocalPVs: localPVs, PVQPS: 1, PVBurst: 1, Aggregate: true}
	for _, o := range opts {
		o(&cfg)
	}
	d, err := daemon.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &node{name: name, d: d, c: &api.Client{Socket: cfg.Socket}, root: cfg.Root, cancel: cancel, done: make(chan error, 1)}
	go func() { n.done <- d.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-n.done })
	return n
}

func phaseOf(n *node, name string) api.Phase {
	a, err := n.c.Get(context.Background(), name)
	if err != nil {
		return ""
	}
	return a.Phase
}

func mc(name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "modelcache.io/v1alpha1", "kind": "ModelCache",
		"metadata": map[string]any{"name": name}, "spec": spec,
	}}
}

func getMC(t testing.TB, dyn dynamic.Interface, name string) *k8ssync.ModelCache {
	u, err := dyn.Resource(k8ssync.ModelCacheGVR).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	var m k8ssync.ModelCache
	runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &m)
	return &m
}

func nodeStatus(dyn dynamic.Interface, name string) (*k8ssync.ModelCacheNode, error) {
	u, err := dyn.Resource(k8ssync.ModelCacheNodeGVR).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var m k8ssync.ModelCacheNode
	return &m, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &m)
}

func artifactOn(n *k8ssync.ModelCacheNode, name string) *k8ssync.ArtifactStatus {
	for i := range n.Status.Artifacts {
		if n.Status.Artifacts[i].Name == name {
			return &n.Status.Artifacts[i]
		}
	}
	return nil
}

// TestClusterSync runs two daemons as two nodes against a real
// kube-apiserver and etcd.
func TestClusterSync(t *testing.T) {
	cl := kubetest.Start(t)
	ctx := context.Background()
	kc := kubernetes.NewForConfigOrDie(cl.Config)
	dyn := dynamic.NewForConfigOrDie(cl.Config)
	kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "modelcache-system"}}, metav1.CreateOptions{})
	for name, gpu := range map[string]string{"node-a": "h100", "node-b": "a100"} {
		if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"gpu": gpu}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// A file server whose "slow" file trickles, for the API-server-down case.
	files := map[string][]byte{"/w.bin": storetest.Data(1<<20, 1), "/h100.bin": storetest.Data(300<<10, 2), "/slow.bin": storetest.Data(2<<20, 3)}
	var slowGate atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		if r.URL.Path == "/slow.bin" && r.Method == http.MethodGet { // the elected daemon resolves it (HEAD) first
			for !slowGate.Load() && r.Context().Err() == nil {
				time.Sleep(10 * time.Millisecond)
			}
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(b))
	}))
	defer srv.Close()
	// A private hub repo: only with the token from the Secret.
	hub := hubtest.New()
	defer hub.Close()
	hub.Token = "hf_secret_token"
	hub.Commit("org/private", map[string][]byte{"config.json": []byte(`{"model_type":"x"}`), "w.safetensors": storetest.Data(200<<10, 4)}, "main")
	t.Setenv("HF_ENDPOINT", hub.URL())
	t.Setenv("HF_TOKEN", "")

	// The daemons reach the API server through a proxy the test can cut.
	proxy, pcfg := cl.Proxy(t)
	a := startNode(t, pcfg, "node-a", `{"cudaDriverVersion":"12.4","devices":[{"name":"NVIDIA H100","uuid":"GPU-a","computeCapability":"9.0"}]}`, true)
	b := startNode(t, pcfg, "node-b", `{"cudaDriverVersion":"12.2","devices":[{"name":"NVIDIA A100","uuid":"GPU-b","computeCapability":"8.0"}]}`, true)

	// Selected by every node; the aggregated count follows.
	t0 := time.Now()
	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc("both", map[string]any{"source": srv.URL + "/w.bin"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "both Ready on two nodes in the aggregated status", 30*time.Second, func() error {
		m := getMC(t, dyn, "both")
		if m == nil || m.Status.Nodes.Ready != 2 || m.Status.Nodes.Total != 2 || m.Status.Nodes.ReadyText != "2/2" {
			return fmt.Errorf("status %+v", m)
		}
		return nil
	})
	t.Logf("ModelCache created → aggregated Ready 2/2 in %.2fs", time.Since(t0).Seconds())
	if phaseOf(a, "both") != api.PhaseReady || phaseOf(b, "both") != api.PhaseReady {
		t.Fatal("both must be Ready on both nodes")
	}

	// Selected by labels: only the H100 node.
	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc("h100only", map[string]any{"source": srv.URL + "/h100.bin",
		"nodeSelector": map[string]any{"matchLabels": map[string]any{"gpu": "h100"}}}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "h100only on node-a only", 30*time.Second, func() error {
		m := getMC(t, dyn, "h100only")
		if m == nil || m.Status.Nodes.Ready != 1 || m.Status.Nodes.Total != 1 {
			return fmt.Errorf("status %+v", m)
		}
		return nil
	})
	if phaseOf(b, "h100only") != "" {
		t.Fatalf("node-b must not hold h100only: %s", phaseOf(b, "h100only"))
	}

	// kubectl get modelcaches: the printer columns.
	table, err := kc.Discovery().RESTClient().Get().AbsPath("/apis/modelcache.io/v1alpha1/modelcaches").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"name":"Source"`, `"name":"Revision"`, `"name":"Ready"`, `"name":"Age"`, `"2/2"`, srv.URL + "/w.bin"} {
		if !strings.Contains(string(table), want) {
			t.Errorf("kubectl get modelcaches lacks %s: %s", want, table)
		}
	}

	// kubectl get modelcachenodes: the artifacts by phase.
	testenv.Eventually(t, "kubectl get modelcachenodes", 20*time.Second, func() error {
		table, err := kc.Discovery().RESTClient().Get().AbsPath("/apis/modelcache.io/v1alpha1/modelcachenodes/node-a").
			SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(ctx)
		if err != nil {
			return err
		}
		if !strings.Contains(string(table), `"name":"Artifacts"`) || !regexp.MustCompile(`"node-a","[1-9]\d* Ready`).Match(table) {
			return fmt.Errorf("no Artifacts column or no Ready count in %s", table)
		}
		return nil
	})

	// Admission rejects a bad spec.
	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc("bad", map[string]any{"source": "ftp://x/y", "state": "Maybe"}), metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "source") {
		t.Fatalf("a bad ModelCache must be rejected at admission: %v", err)
	}
	// The CRD's limits are the store's: what a node would refuse,
	// admission refuses.
	long := strings.Repeat("n", 124)
	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc(long, map[string]any{"source": srv.URL + "/w.bin"}), metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "128") {
		t.Fatalf("a name no node can store must be rejected at admission: %v", err)
	}
	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc(strings.Repeat("v", 100), map[string]any{"source": srv.URL + "/w.bin",
		"versions": []any{map[string]any{"suffix": strings.Repeat("s", 30), "source": srv.URL + "/w.bin"}}}), metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "version name") {
		t.Fatalf("a version name no node can store must be rejected at admission: %v", err)
	}

	// A private source with credentials from a Secret.
	if _, err := kc.CoreV1().Secrets("modelcache-system").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "hf"}, StringData: map[string]string{"HF_TOKEN": "hf_secret_token"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc("private", map[string]any{"source": "hf://org/private",
		"secretRef": map[string]any{"namespace": "modelcache-system", "name": "hf"}, "nodeSelector": map[string]any{"matchLabels": map[string]any{"gpu": "a100"}}}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Generous: the elected daemon resolves the branch with the Secret's
	// token first, and a loaded CI machine (the real-node test beside it)
	// once took longer than 30 s; the failure shows how far it got.
	testenv.Eventually(t, "the private repo Ready on node-b with the Secret's token", 90*time.Second, func() error {
		if p := phaseOf(b, "private"); p != api.PhaseReady {
			a, err := b.c.Get(ctx, "private")
			m := getMC(t, dyn, "private")
			if m != nil {
				return fmt.Errorf("node-b: phase %q %+v (%v); the ModelCache's status: %+v", p, a, err, m.Status)
			}
			return fmt.Errorf("node-b: phase %q %+v (%v)", p, a, err)
		}
		return nil
	})

	// Node status: GPUs, capacity, per-artifact phase, bytes, download speed.
	testenv.Eventually(t, "node-a's ModelCacheNode", 20*time.Second, func() error {
		n, err := nodeStatus(dyn, "node-a")
		if err != nil {
			return err
		}
		as := artifactOn(n, "both")
		if len(n.Status.GPUs) != 1 || n.Status.GPUs[0].UUID != "GPU-a" || n.Status.CapacityBytes <= 0 || as == nil ||
			as.Phase != "Ready" || as.Bytes != 1<<20 || as.ModelCache != "both" || as.DownloadSeconds <= 0 || as.LastUsed == "" {
			return fmt.Errorf("%+v", n.Status)
		}
		return nil
	})

	// Events on the ModelCache for the transitions.
	testenv.Eventually(t, "Downloaded events", 20*time.Second, func() error {
		evs, err := kc.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=both,reason=Downloaded"})
		if err != nil || len(evs.Items) < 2 {
			return fmt.Errorf("%d events: %v", len(evs.Items), err)
		}
		return nil
	})

	// Local PVs for Ready models of ModelCaches, one per node and model.
	testenv.Eventually(t, "local PVs", 30*time.Second, func() error {
		pvs, err := kc.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		names := map[string]bool{}
		for _, pv := range pvs.Items {
			names[pv.Name] = true
			if pv.Spec.Local == nil || !strings.HasPrefix(pv.Spec.Local.Path, "/") || pv.Spec.AccessModes[0] != corev1.ReadOnlyMany || !slices.Equal(pv.Spec.MountOptions, []string{"ro"}) {
				return fmt.Errorf("PV %s: %+v", pv.Name, pv.Spec)
			}
		}
		for _, want := range []string{k8ssync.PVName("node-a", "both"), k8ssync.PVName("node-b", "both"), k8ssync.PVName("node-a", "h100only")} {
			if !names[want] {
				return fmt.Errorf("missing %s in %v", want, names)
			}
		}
		// A private model (fetched with credentials) gets none: a claim
		// of any namespace could bind it.
		if names[k8ssync.PVName("node-b", "private")] {
			return fmt.Errorf("a PV for the private model: %v", names)
		}
		return nil
	})
	// A PV as a daemon made it before PVs were read-only, or with "rw"
	// beside "ro", gets exactly "ro".
	old, err := kc.CoreV1().PersistentVolumes().Get(ctx, k8ssync.PVName("node-a", "h100only"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old.Spec.MountOptions = []string{"ro", "rw"}
	if _, err := kc.CoreV1().PersistentVolumes().Update(ctx, old, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "an old PV made read-only", 20*time.Second, func() error {
		pv, err := kc.CoreV1().PersistentVolumes().Get(ctx, old.Name, metav1.GetOptions{})
		if err != nil || !slices.Equal(pv.Spec.MountOptions, []string{"ro"}) {
			return fmt.Errorf("mountOptions %v %v", pv.Spec.MountOptions, err)
		}
		return nil
	})
	// Created through a token bucket of 1/s, burst 1: node-a's two PVs
	// are at least a second apart.
	pa, _ := kc.CoreV1().PersistentVolumes().Get(ctx, k8ssync.PVName("node-a", "both"), metav1.GetOptions{})
	pb, _ := kc.CoreV1().PersistentVolumes().Get(ctx, k8ssync.PVName("node-a", "h100only"), metav1.GetOptions{})
	if d := pb.CreationTimestamp.Sub(pa.CreationTimestamp.Time); d < 0 {
		d = -d
		if d < time.Second {
			t.Errorf("PVs of one node created %v apart; the bucket allows one a second", d)
		}
	} else if d < time.Second {
		t.Errorf("PVs of one node created %v apart; the bucket allows one a second", d)
	}

	// The daemon's own pod mounts the whole store: never a holder.
	selfPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "modelcached-node-a", Namespace: "modelcache-system"}, Spec: corev1.PodSpec{
		NodeName:   "node-a",
		Containers: []corev1.Container{{Name: "modelcached", Image: "modelcached"}},
		Volumes:    []corev1.Volume{{Name: "store", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: a.root}}}},
	}}
	if _, err := kc.CoreV1().Pods("modelcache-system").Create(ctx, selfPod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A running pod on node-a mounts "both" by hostPath: Absent evicts it
	// from node-b, not from node-a, until the pod goes.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "vllm", Namespace: "default"}, Spec: corev1.PodSpec{
		NodeName:   "node-a",
		Containers: []corev1.Container{{Name: "vllm", Image: "vllm"}},
		Volumes:    []corev1.Volume{{Name: "m", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: filepath.Join(a.root, "models", "both", "current")}}}},
	}}
	if _, err := kc.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the pod holds both on node-a", 20*time.Second, func() error {
		x, err := a.c.Get(ctx, "both")
		if err != nil || len(x.InUse) != 1 || x.InUse[0].Kind != "pod" || x.InUse[0].ID != "default/vllm" {
			return fmt.Errorf("want the one holder pod default/vllm (the daemon's own pod is none): %+v %v", x, err)
		}
		return nil
	})
	// Per-version status: the node reports the pod by name (the holder in
	// the one form), the download's start and end, the last use to the
	// hour; the ModelCache adds up every node's.
	testenv.Eventually(t, "node-a reports the pod, the download and the last use of both", 20*time.Second, func() error {
		n, err := nodeStatus(dyn, "node-a")
		if err != nil {
			return err
		}
		as := artifactOn(n, "both")
		if as == nil || !slices.Equal(as.InUseBy, []string{"pod default/vllm"}) || !slices.Equal(as.Pods, []string{"default/vllm"}) {
			return fmt.Errorf("holders %+v", as)
		}
		started, err1 := time.Parse(time.RFC3339, as.DownloadStarted)
		done, err2 := time.Parse(time.RFC3339, as.DownloadCompleted)
		used, err3 := time.Parse(time.RFC3339, as.LastUsed)
		if err := errors.Join(err1, err2, err3); err != nil || done.Before(started) || !used.Equal(used.Truncate(time.Hour)) {
			return fmt.Errorf("times started %q completed %q lastUsed %q (%v)", as.DownloadStarted, as.DownloadCompleted, as.LastUsed, err)
		}
		return nil
	})
	testenv.Eventually(t, "the ModelCache's status.versions of both", 20*time.Second, func() error {
		m := getMC(t, dyn, "both")
		if m == nil || len(m.Status.Versions) != 1 {
			return fmt.Errorf("%+v", m)
		}
		v := m.Status.Versions[0]
		x, err := a.c.Get(ctx, "both")
		if err != nil {
			return err
		}
		if v.Artifact != "both" || v.Nodes.ReadyText != "2/2" || len(v.Revisions) != 1 || v.Revisions[0] != (k8ssync.RevisionCount{Revision: x.Revision, Digest: x.ManifestDigest, Nodes: 2}) ||
			!slices.Equal(v.Pods, []string{"default/vllm"}) || v.PodCount != 1 || v.LastUsed == "" || v.LastDownloaded == "" {
			return fmt.Errorf("%+v", v)
		}
		return nil
	})
	u, _ := dyn.Resource(k8ssync.ModelCacheGVR).Get(ctx, "both", metav1.GetOptions{})
	unstructured.SetNestedField(u.Object, "Absent", "spec", "state")
	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "both evicted from node-b", 20*time.Second, func() error {
		if _, err := os.Stat(filepath.Join(b.root, "models", "both")); !os.IsNotExist(err) {
			return fmt.Errorf("still on disk: %v", err)
		}
		return nil
	})
	testenv.Eventually(t, "node-a has the Absent desire", 20*time.Second, func() error {
		x, err := a.c.Get(ctx, "both")
		if err != nil || x.Desire == nil || x.Desire.State != api.StateAbsent {
			return fmt.Errorf("%+v %v", x, err)
		}
		return nil
	})
	// The pass that keeps it says why in the view.
	testenv.Eventually(t, "node-a keeps both while the pod mounts it", 20*time.Second, func() error {
		x, err := a.c.Get(ctx, "both")
		if err != nil || !strings.Contains(x.Message, "kept while in use by pod") {
			return fmt.Errorf("%+v %v", x, err)
		}
		return nil
	})
	if _, err := os.Stat(filepath.Join(a.root, "models", "both", "current")); err != nil {
		t.Fatalf("a model a running pod mounts was evicted: %v", err)
	}
	// Its local PV goes at once, as the node's label does: no new claim
	// binds to a model the node is letting go (a bound one stays until its
	// claim goes, by the pv-protection finalizer).
	testenv.Eventually(t, "node-a's PV of both deleted on Absent", 20*time.Second, func() error {
		pv, err := kc.CoreV1().PersistentVolumes().Get(ctx, k8ssync.PVName("node-a", "both"), metav1.GetOptions{})
		if apierrors.IsNotFound(err) || err == nil && pv.DeletionTimestamp != nil {
			return nil
		}
		return fmt.Errorf("PV still there: %v", err)
	})
	kc.CoreV1().Pods("default").Delete(ctx, "vllm", metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	testenv.Eventually(t, "both evicted from node-a once the pod is gone", 20*time.Second, func() error {
		if _, err := os.Stat(filepath.Join(a.root, "models", "both")); !os.IsNotExist(err) {
			return fmt.Errorf("still on disk: %v", err)
		}
		return nil
	})
	// (envtest runs no controller manager, so the pv-protection finalizer
	// stays: a deleted PV shows as terminating.)
	testenv.Eventually(t, "the PVs of evicted models deleted", 30*time.Second, func() error {
		for _, n := range []string{"node-a", "node-b"} {
			pv, err := kc.CoreV1().PersistentVolumes().Get(ctx, k8ssync.PVName(n, "both"), metav1.GetOptions{})
			if err == nil && pv.DeletionTimestamp == nil {
				return fmt.Errorf("PV of %s/both still there", n)
			}
		}
		return nil
	})
	testenv.Eventually(t, "Evicted events", 20*time.Second, func() error {
		evs, err := kc.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=both,reason=Evicted"})
		if err != nil || len(evs.Items) < 1 {
			return fmt.Errorf("no Evicted event: %v", err)
		}
		return nil
	})

	// The API server goes away mid-pull (every connection to it dropped,
	// new ones refused): the pull finishes, the node keeps serving, and the
	// status catches up when it returns.
	dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc("late", map[string]any{"source": srv.URL + "/slow.bin", "nodeSelector": map[string]any{"matchLabels": map[string]any{"gpu": "a100"}}}), metav1.CreateOptions{})
	testenv.Eventually(t, "late Downloading on node-b", 20*time.Second, func() error {
		if p := phaseOf(b, "late"); p != api.PhaseDownloading {
			return fmt.Errorf("phase %q", p)
		}
		return nil
	})
	proxy.Down()
	slowGate.Store(true)
	testenv.Eventually(t, "late Ready on node-b while the API server is down", 20*time.Second, func() error {
		if p := phaseOf(b, "late"); p != api.PhaseReady {
			return fmt.Errorf("phase %q", p)
		}
		return nil
	})
	time.Sleep(time.Second) // the loops try and back off meanwhile
	if err := proxy.Up(); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "node-b's status catches up", 60*time.Second, func() error {
		n, err := nodeStatus(dyn, "node-b")
		if err != nil {
			return err
		}
		if as := artifactOn(n, "late"); as == nil || as.Phase != "Ready" {
			return fmt.Errorf("%+v", as)
		}
		return nil
	})
	testenv.Eventually(t, "the aggregated count of late catches up", 60*time.Second, func() error {
		m := getMC(t, dyn, "late")
		if m == nil || m.Status.Nodes.ReadyText != "1/1" {
			raw, _ := json.Marshal(m)
			return fmt.Errorf("%s", raw)
		}
		return nil
	})
}
