package k8ssync_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore/storetest"
	"github.com/modelcache/modelcache/internal/kubetest"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/k8ssync"
)

// applyBundle creates the objects of the given files of deploy/daemonset/base
// (namespace included) as the cluster's admin.
func applyBundle(t *testing.T, cfg *rest.Config, files ...string) {
	t.Helper()
	ctx := context.Background()
	dyn := dynamic.NewForConfigOrDie(cfg)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cfg)))
	for _, f := range files {
		raw, err := os.ReadFile(filepath.Join("..", "deploy", "daemonset", "base", f))
		if err != nil {
			t.Fatal(err)
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
		for {
			var m map[string]any
			if err := dec.Decode(&m); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if m == nil {
				continue
			}
			u := &unstructured.Unstructured{Object: m}
			gvk := u.GroupVersionKind()
			mp, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				t.Fatalf("%s: %s: %v", f, gvk, err)
			}
			var ri dynamic.ResourceInterface = dyn.Resource(mp.Resource)
			if mp.Scope.Name() == meta.RESTScopeNameNamespace {
				ri = dyn.Resource(mp.Resource).Namespace(u.GetNamespace())
			}
			if _, err := ri.Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("%s: create %s %s: %v", f, gvk.Kind, u.GetName(), err)
			}
		}
	}
}

// bundleCluster is a real API server with the bundle's namespace,
// service account, RBAC and admission policies, and the named Nodes
// (each labelled with its hostname).
func bundleCluster(t *testing.T, nodes ...string) (*kubetest.Cluster, kubernetes.Interface, dynamic.Interface) {
	t.Helper()
	cl := kubetest.Start(t)
	kc := kubernetes.NewForConfigOrDie(cl.Config)
	applyBundle(t, cl.Config, "namespace.yaml", "serviceaccount.yaml", "rbac.yaml", "admission.yaml")
	for _, n := range nodes {
		if _, err := kc.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{corev1.LabelHostname: n}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return cl, kc, dynamic.NewForConfigOrDie(cl.Config)
}

// nodeToken is a token of the daemon's service account bound to a pod
// on node (as kubelet projects it into the DaemonSet's pod), and a
// client config that uses it and nothing else.
func nodeToken(t *testing.T, cl *kubetest.Cluster, kc kubernetes.Interface, node string) *rest.Config {
	t.Helper()
	ctx := context.Background()
	pod, err := kc.CoreV1().Pods("modelcache-system").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "modelcached-" + node},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "modelcached",
			Containers: []corev1.Container{{Name: "modelcached", Image: "ghcr.io/modelcache/modelcached"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := kc.CoreV1().ServiceAccounts("modelcache-system").CreateToken(ctx, "modelcached", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tokenConfig(cl, tr.Status.Token)
}

func tokenConfig(cl *kubetest.Cluster, token string) *rest.Config {
	return &rest.Config{Host: cl.Config.Host, BearerToken: token,
		TLSClientConfig: rest.TLSClientConfig{CAData: cl.Config.CAData, ServerName: cl.Config.ServerName}}
}

// localPV is the PV the daemon on node makes of artifact m at path,
// named name.
func localPV(name, node, path string) *corev1.PersistentVolume {
	pv := k8ssync.LocalPV(node, "modelcache-local", api.Artifact{Name: "m", Path: path, Bytes: 1 << 20})
	pv.Name = name
	return pv
}

// TestNodeTokenReachesOnlyItsNode: with the bundle's RBAC and admission
// policies on the real API server, a token of the daemon's service
// account bound to a pod on node A (the token kubelet gives the
// DaemonSet's pod there) writes A's scheduling labels, A's
// ModelCacheNode, A's local PVs and the aggregator's Lease, and nothing
// else: not node B, not A's other labels, taints or schedulability, not
// B's ModelCacheNode or PVs, not a PV outside the store or bound to a
// claim, not a Secret the bundle does not name, not a ModelCache's status
// unless the aggregator's Lease names it; a token of the account that
// names no node writes none of it. The daemon itself still works
// with that token: it reports its ModelCacheNode, takes the Lease,
// aggregates and labels its Node.
func TestNodeTokenReachesOnlyItsNode(t *testing.T) {
	cl, kc, dyn := bundleCluster(t, "node-a", "node-b")
	ctx := context.Background()
	cfg := nodeToken(t, cl, kc, "node-a")
	nc := kubernetes.NewForConfigOrDie(cfg)
	ndyn := dynamic.NewForConfigOrDie(cfg)

	// The API server puts the pod's node in the token's user info
	// (ServiceAccountTokenPodNodeInfo, on by default since v1.30).
	rev, err := nc.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := rev.Status.UserInfo.Extra["authentication.kubernetes.io/node-name"]; len(got) != 1 || got[0] != "node-a" {
		t.Fatalf("the pod-bound token's user info: %+v; want extra authentication.kubernetes.io/node-name [node-a]", rev.Status.UserInfo)
	}

	patchNode := func(c kubernetes.Interface, node, patch string) error {
		_, err := c.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		return err
	}
	// The bundle's RBAC and each of its policies take effect a moment
	// after they are created, each on its own (the API server loads a
	// policy and its binding from its informers): before asserting what
	// they refuse, wait until each refuses one request it exists to
	// refuse. The probes are dry runs, so none leaves anything behind
	// while its policy is not in force yet.
	dry := []string{metav1.DryRunAll}
	for _, probe := range []struct {
		policy string
		req    func() error
	}{
		{"modelcached-nodes: a label on node B", func() error {
			_, err := nc.CoreV1().Nodes().Patch(ctx, "node-b", types.MergePatchType, []byte(`{"metadata":{"labels":{"model.modelcache.io/m":"ready"}}}`), metav1.PatchOptions{DryRun: dry})
			return err
		}},
		{"modelcached-modelcachenodes: node B's ModelCacheNode", func() error {
			u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": k8ssync.Group + "/" + k8ssync.Version, "kind": "ModelCacheNode",
				"metadata": map[string]any{"name": "node-b", "labels": map[string]any{k8ssync.LabelNode: "node-b"}}}}
			_, err := ndyn.Resource(k8ssync.ModelCacheNodeGVR).Create(ctx, u, metav1.CreateOptions{DryRun: dry})
			return err
		}},
		{"modelcached-persistentvolumes: a PV of node B", func() error {
			_, err := nc.CoreV1().PersistentVolumes().Create(ctx, localPV("modelcache-node-b-m", "node-b", "/var/lib/modelcache/models/m/current"), metav1.CreateOptions{DryRun: dry})
			return err
		}},
		{"modelcached-leases: another Lease", func() error {
			_, err := nc.CoordinationV1().Leases("modelcache-system").Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "kube-scheduler"}}, metav1.CreateOptions{DryRun: dry})
			return err
		}},
	} {
		testenv.Eventually(t, "the policy "+probe.policy+" refused to node A's token", time.Minute, func() error {
			if err := probe.req(); !apierrors.IsForbidden(err) {
				return fmt.Errorf("dry run: %v, want Forbidden", err)
			}
			return nil
		})
	}
	refused := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: allowed, want refused", what)
		} else if !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want Forbidden", what, err)
		}
	}
	allowed := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v, want allowed", what, err)
		}
	}

	// Nodes.
	refused("node B's kernel cache label", patchNode(nc, "node-b", `{"metadata":{"labels":{"kernelcache.modelcache.io/k":"compatible"}}}`))
	refused("a label of node A outside modelcache's prefixes", patchNode(nc, "node-a", `{"metadata":{"labels":{"team":"a"}}}`))
	refused("removing node A's hostname label", patchNode(nc, "node-a", `{"metadata":{"labels":{"kubernetes.io/hostname":null}}}`))
	refused("an annotation on node A", patchNode(nc, "node-a", `{"metadata":{"annotations":{"x":"y"}}}`))
	refused("a taint on node A", patchNode(nc, "node-a", `{"spec":{"taints":[{"key":"k","value":"v","effect":"NoSchedule"}]}}`))
	refused("node A unschedulable", patchNode(nc, "node-a", `{"spec":{"unschedulable":true}}`))
	allowed("node A's model label", patchNode(nc, "node-a", `{"metadata":{"labels":{"model.modelcache.io/m":"ready","kernelcache.modelcache.io/k":"compatible"}}}`))
	allowed("removing node A's model label", patchNode(nc, "node-a", `{"metadata":{"labels":{"model.modelcache.io/m":null}}}`))
	if n, _ := kc.CoreV1().Nodes().Get(ctx, "node-a", metav1.GetOptions{}); n == nil || n.Labels["team"] != "" || n.Spec.Unschedulable || slices.ContainsFunc(n.Spec.Taints, func(t corev1.Taint) bool { return t.Key == "k" }) || n.Labels["kernelcache.modelcache.io/k"] != "compatible" {
		t.Errorf("node A after the patches: %+v", n)
	}

	// The peer port's reads: a caller's Pod (the addresses its request
	// may come from) and Node (its labels and addresses).
	_, err = nc.CoreV1().Pods("modelcache-system").Get(ctx, "modelcached-node-a", metav1.GetOptions{})
	allowed("getting a daemon's Pod", err)
	_, err = nc.CoreV1().Nodes().Get(ctx, "node-b", metav1.GetOptions{})
	allowed("getting a Node", err)

	// ModelCacheNodes: B's refused whether it exists or not, A's allowed.
	mcn := func(name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": k8ssync.Group + "/" + k8ssync.Version, "kind": "ModelCacheNode",
			"metadata": map[string]any{"name": name, "labels": map[string]any{k8ssync.LabelNode: name}}}}
	}
	apply := metav1.ApplyOptions{FieldManager: "modelcached", Force: true}
	_, err = ndyn.Resource(k8ssync.ModelCacheNodeGVR).Apply(ctx, "node-b", mcn("node-b"), apply)
	refused("creating node B's ModelCacheNode", err)
	if _, err := dyn.Resource(k8ssync.ModelCacheNodeGVR).Create(ctx, mcn("node-b"), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	_, err = ndyn.Resource(k8ssync.ModelCacheNodeGVR).Patch(ctx, "node-b", types.MergePatchType, []byte(`{"status":{"gpuSource":"forged"}}`), metav1.PatchOptions{}, "status")
	refused("patching node B's ModelCacheNode status", err)
	_, err = ndyn.Resource(k8ssync.ModelCacheNodeGVR).Patch(ctx, "node-b", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
	refused("patching node B's ModelCacheNode", err)
	_, err = ndyn.Resource(k8ssync.ModelCacheNodeGVR).Apply(ctx, "node-a", mcn("node-a"), apply)
	allowed("creating node A's ModelCacheNode", err)

	// Secrets: only those the bundle names, in the daemon's namespace,
	// the way the daemon reads them (a list and a watch by name).
	for _, ns := range []string{"team-b"} {
		kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	}
	for _, s := range [][2]string{{"team-b", "hf"}, {"modelcache-system", "modelcache-credentials"}, {"modelcache-system", "other"}} {
		if _, err := kc.CoreV1().Secrets(s[0]).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: s[1]}, StringData: map[string]string{"HF_TOKEN": "t"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	byName := func(name string) metav1.ListOptions {
		return metav1.ListOptions{FieldSelector: "metadata.name=" + name}
	}
	_, err = nc.CoreV1().Secrets("team-b").List(ctx, byName("hf"))
	refused("listing a Secret of another namespace by name", err)
	w, err := nc.CoreV1().Secrets("team-b").Watch(ctx, byName("hf"))
	if err == nil {
		w.Stop()
	}
	refused("watching a Secret of another namespace by name", err)
	_, err = nc.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
	refused("listing every Secret", err)
	_, err = nc.CoreV1().Secrets("modelcache-system").List(ctx, byName("other"))
	refused("listing a Secret of its own namespace the bundle does not name", err)
	l, err := nc.CoreV1().Secrets("modelcache-system").List(ctx, byName("modelcache-credentials"))
	allowed("listing the Secret the bundle names", err)
	if err == nil && len(l.Items) != 1 {
		t.Errorf("listing the Secret the bundle names: %d items", len(l.Items))
	}
	// A namespace's grants: read, never written (a node cannot grant
	// itself a namespace's Secret).
	_, err = ndyn.Resource(k8ssync.ModelCacheCredentialsGVR).List(ctx, metav1.ListOptions{})
	allowed("listing ModelCacheCredentials", err)
	_, err = ndyn.Resource(k8ssync.ModelCacheCredentialsGVR).Namespace("team-b").Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "modelcache.io/v1alpha1", "kind": "ModelCacheCredentials", "metadata": map[string]any{"name": "g"},
		"spec": map[string]any{"modelCache": "m", "secretName": "hf", "sources": []any{"hf://team-b/m"}}}}, metav1.CreateOptions{})
	refused("creating a ModelCacheCredentials (granting itself a namespace's Secret)", err)

	// PersistentVolumes: its own local PVs under the store's models/ only
	// (the API server itself refuses a local path with ".." in it).
	pvs := nc.CoreV1().PersistentVolumes()
	const path = "/var/lib/modelcache/models/m/current"
	_, err = pvs.Create(ctx, localPV("modelcache-node-b-m", "node-b", path), metav1.CreateOptions{})
	refused("a PV labelled and bound to node B", err)
	pv := localPV("modelcache-node-a-m1", "node-a", path)
	pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0].Values = []string{"node-b"}
	_, err = pvs.Create(ctx, pv, metav1.CreateOptions{})
	refused("a PV labelled node A with node affinity to node B", err)
	pv = localPV("modelcache-node-a-m2", "node-a", path)
	pv.Spec.NodeAffinity.Required.NodeSelectorTerms = append(pv.Spec.NodeAffinity.Required.NodeSelectorTerms, corev1.NodeSelectorTerm{
		MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{"node-b"}}}})
	_, err = pvs.Create(ctx, pv, metav1.CreateOptions{})
	refused("a PV with node affinity to node A or node B", err)
	for _, p := range []string{"/var/lib/kubelet/pods", "/var/lib/modelcache", "/var/lib/modelcache/blobs", "/var/lib/modelcache/modelsx"} {
		_, err = pvs.Create(ctx, localPV("modelcache-node-a-m3", "node-a", p), metav1.CreateOptions{})
		refused("a PV of node A at "+p, err)
	}
	pv = localPV("modelcache-node-a-m4", "node-a", path)
	pv.Spec.Local, pv.Spec.HostPath = nil, &corev1.HostPathVolumeSource{Path: path}
	_, err = pvs.Create(ctx, pv, metav1.CreateOptions{})
	refused("a hostPath PV", err)
	pv = localPV("modelcache-node-a-m5", "node-a", path)
	pv.Spec.ClaimRef = &corev1.ObjectReference{Namespace: "team-b", Name: "data"}
	_, err = pvs.Create(ctx, pv, metav1.CreateOptions{})
	refused("a PV bound in advance to another team's claim", err)
	pv = localPV("modelcache-node-a-m6", "node-a", path)
	pv.Spec.StorageClassName = "fast-ssd"
	_, err = pvs.Create(ctx, pv, metav1.CreateOptions{})
	refused("a PV of another storage class", err)
	_, err = pvs.Create(ctx, localPV("team-b-data", "node-a", path), metav1.CreateOptions{})
	refused("a PV of node A named outside its names", err)
	// Read-only, exactly: each other shape is refused naming its rule.
	for _, c := range []struct {
		what, rule string
		shape      func(pv *corev1.PersistentVolume)
	}{
		{"mountOptions [ro, rw]", "mountOptions are exactly [ro]", func(pv *corev1.PersistentVolume) { pv.Spec.MountOptions = []string{"ro", "rw"} }},
		{"mountOptions [rw, ro]", "mountOptions are exactly [ro]", func(pv *corev1.PersistentVolume) { pv.Spec.MountOptions = []string{"rw", "ro"} }},
		{"mountOptions [rw]", "mountOptions are exactly [ro]", func(pv *corev1.PersistentVolume) { pv.Spec.MountOptions = []string{"rw"} }},
		{"mountOptions [ro, remount]", "mountOptions are exactly [ro]", func(pv *corev1.PersistentVolume) { pv.Spec.MountOptions = []string{"ro", "remount"} }},
		{"no mountOptions", "mountOptions are exactly [ro]", func(pv *corev1.PersistentVolume) { pv.Spec.MountOptions = nil }},
		{"ReadWriteMany", "accessModes are exactly [ReadOnlyMany]", func(pv *corev1.PersistentVolume) {
			pv.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}
		}},
		{"ReadOnlyMany and ReadWriteOnce", "accessModes are exactly [ReadOnlyMany]", func(pv *corev1.PersistentVolume) {
			pv.Spec.AccessModes = []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany, corev1.ReadWriteOnce}
		}},
		{"the store's models/ directory", "local volume under /var/lib/modelcache/models/", func(pv *corev1.PersistentVolume) { pv.Spec.Local.Path = "/var/lib/modelcache/models" }},
		{"models/ itself", "the tree of one artifact revision", func(pv *corev1.PersistentVolume) { pv.Spec.Local.Path = "/var/lib/modelcache/models/" }},
		{"an artifact's directory of every revision", "the tree of one artifact revision", func(pv *corev1.PersistentVolume) { pv.Spec.Local.Path = "/var/lib/modelcache/models/m" }},
		{"a directory inside a revision", "the tree of one artifact revision", func(pv *corev1.PersistentVolume) { pv.Spec.Local.Path = path + "/sub" }},
		{"another artifact's tree than its label names", "the tree of one artifact revision", func(pv *corev1.PersistentVolume) { pv.Spec.Local.Path = "/var/lib/modelcache/models/private/current" }},
		{"no modelcache.io/model label", "the tree of one artifact revision", func(pv *corev1.PersistentVolume) { delete(pv.Labels, k8ssync.LabelModel) }},
		// Where the store keeps a private artifact's trees (a models.d one no
		// ModelCache declares included): no path there is admitted.
		{"a private artifact's tree", "local volume under /var/lib/modelcache/models/", func(pv *corev1.PersistentVolume) {
			pv.Spec.Local.Path = "/var/lib/modelcache/private/models/m/current"
		}},
		{"a private artifact's revision", "local volume under /var/lib/modelcache/models/", func(pv *corev1.PersistentVolume) {
			pv.Spec.Local.Path = "/var/lib/modelcache/private/models/m/" + strings.Repeat("a", 40)
		}},
	} {
		pv := localPV("modelcache-node-a-shape", "node-a", path)
		c.shape(pv)
		_, err = pvs.Create(ctx, pv, metav1.CreateOptions{})
		refused("a PV of node A with "+c.what, err)
		if err != nil && !strings.Contains(err.Error(), c.rule) {
			t.Errorf("a PV of node A with %s: %v; want the rule %q named", c.what, err, c.rule)
		}
	}
	_, err = pvs.Create(ctx, localPV(k8ssync.PVName("node-a", "m"), "node-a", path), metav1.CreateOptions{})
	allowed("node A's local PV", err)
	if _, err := kc.CoreV1().PersistentVolumes().Create(ctx, localPV("modelcache-node-b-m", "node-b", path), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	refused("deleting node B's PV", pvs.Delete(ctx, "modelcache-node-b-m", metav1.DeleteOptions{}))
	_, err = pvs.Patch(ctx, k8ssync.PVName("node-a", "m"), types.MergePatchType, []byte(`{"spec":{"storageClassName":"fast-ssd"}}`), metav1.PatchOptions{})
	refused("changing its own PV", err)
	allowed("deleting node A's PV", pvs.Delete(ctx, k8ssync.PVName("node-a", "m"), metav1.DeleteOptions{}))

	// Leases: the aggregator's only.
	leases := nc.CoordinationV1().Leases("modelcache-system")
	_, err = leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "kube-scheduler"}}, metav1.CreateOptions{})
	refused("another Lease", err)

	// A token of the account that names no node writes nothing per node.
	tr, err := kc.CoreV1().ServiceAccounts("modelcache-system").CreateToken(ctx, "modelcached", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	loose := kubernetes.NewForConfigOrDie(tokenConfig(cl, tr.Status.Token))
	refused("a token naming no node patching node A's model label", patchNode(loose, "node-a", `{"metadata":{"labels":{"model.modelcache.io/m":"ready"}}}`))
	_, err = loose.CoreV1().PersistentVolumes().Create(ctx, localPV(k8ssync.PVName("node-a", "m"), "node-a", path), metav1.CreateOptions{})
	refused("a token naming no node creating node A's PV", err)

	// The daemon with node A's token: its ModelCacheNode, the Lease, the
	// aggregated status and its Node's label.
	files := map[string][]byte{"/w.bin": storetest.Data(64<<10, 1)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(b))
	}))
	defer srv.Close()
	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc("w", map[string]any{"source": srv.URL + "/w.bin",
		"nodeSelector": map[string]any{"matchLabels": map[string]any{corev1.LabelHostname: "node-a"}}}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// ModelCache status: only the Lease's holder writes it.
	writeStatus := func(c dynamic.Interface, opts metav1.UpdateOptions) error {
		u, err := c.Resource(k8ssync.ModelCacheGVR).Get(ctx, "w", metav1.GetOptions{})
		if err != nil {
			return err
		}
		raw, _ := json.Marshal(k8ssync.ModelCacheStatus{Resolved: []k8ssync.ResolvedSource{{Artifact: "w", Source: srv.URL + "/w.bin", URI: "https://attacker.example/steal.bin"}}})
		var st map[string]any
		json.Unmarshal(raw, &st)
		unstructured.SetNestedMap(u.Object, st, "status")
		_, err = c.Resource(k8ssync.ModelCacheGVR).UpdateStatus(ctx, u, opts)
		return err
	}
	if _, err := kc.CoordinationV1().Leases("modelcache-system").Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "modelcache-aggregator"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the policy refuses node A's token a ModelCache's status while no node holds the Lease", time.Minute, func() error {
		if err := writeStatus(ndyn, metav1.UpdateOptions{DryRun: dry}); !apierrors.IsForbidden(err) { // a dry run: nothing written while the policy is not in force
			return fmt.Errorf("update status: %v", err)
		}
		return nil
	})
	startNode(t, cfg, "node-a", `{"devices":[]}`, false)
	testenv.Eventually(t, "the daemon with node A's token: w Ready in its ModelCacheNode and the aggregated status, its Node labelled, the Lease its own", 60*time.Second, func() error {
		st, err := nodeStatus(dyn, "node-a")
		if err != nil || artifactOn(st, "w") == nil {
			return fmt.Errorf("ModelCacheNode: %v %+v", err, st)
		}
		if m := getMC(t, dyn, "w"); m == nil || m.Status.Nodes.Ready != 1 {
			return fmt.Errorf("ModelCache status %+v", m)
		}
		if l := labelsOf(kc, "node-a"); l[k8ssync.LabelKey(k8ssync.LabelModelPrefix, "w")] != k8ssync.LabelReady {
			return fmt.Errorf("node A's labels %v", l)
		}
		le, err := kc.CoordinationV1().Leases("modelcache-system").Get(ctx, "modelcache-aggregator", metav1.GetOptions{})
		if err != nil || le.Spec.HolderIdentity == nil || *le.Spec.HolderIdentity != "node-a" {
			return fmt.Errorf("Lease: %v %+v", err, le)
		}
		return nil
	})
	bdyn := dynamic.NewForConfigOrDie(nodeToken(t, cl, kc, "node-b"))
	refused("node B's token writing a ModelCache's status while node A holds the Lease", writeStatus(bdyn, metav1.UpdateOptions{}))
}
