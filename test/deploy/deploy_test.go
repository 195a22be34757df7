package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/modelcache/modelcache/internal/bundle"
	"github.com/modelcache/modelcache/internal/kubetest"
	"github.com/modelcache/modelcache/internal/testenv"
)

// A stand-in PodMonitor CRD: the Prometheus Operator's, reduced to what
// lets the API server take the monitoring bundle.
var podMonitorCRD = map[string]any{
	"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
	"metadata": map[string]any{"name": "podmonitors.monitoring.coreos.com"},
	"spec": map[string]any{
		"group": "monitoring.coreos.com", "scope": "Namespaced",
		"names": map[string]any{"kind": "PodMonitor", "plural": "podmonitors", "singular": "podmonitor", "listKind": "PodMonitorList"},
		"versions": []any{map[string]any{"name": "v1", "served": true, "storage": true,
			"schema": map[string]any{"openAPIV3Schema": map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}},
	},
}

// This package links kustomize, which links Go's plugin package, which
// makes the binary bind every symbol at load: NVML's lazily resolved
// symbols (the daemon) must stay out of it.

// TestDeployBundleServerSideDryRun builds deploy/daemonset (and its
// monitoring and examples) as make bundle does and applies every object with
// server-side apply in dry-run mode against the real API server of the
// Kubernetes tests: schemas, RBAC, the DaemonSet and the examples must be
// what that server accepts.
func TestDeployBundleServerSideDryRun(t *testing.T) {
	cl := kubetest.Start(t)
	ctx := context.Background()
	kc := kubernetes.NewForConfigOrDie(cl.Config)
	dyn := dynamic.NewForConfigOrDie(cl.Config)
	// Dry runs of namespaced objects need their namespace to exist.
	kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "modelcache-system"}}, metav1.CreateOptions{})
	crds := dyn.Resource(apiextensionsGVR)
	if _, err := crds.Create(ctx, &unstructured.Unstructured{Object: podMonitorCRD}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	// The bundle and examples as make bundle IMAGE=… renders them (the
	// kustomizations themselves refuse to render without the image).
	const image = "registry.example.com/modelcached:v1"
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	var objs []*unstructured.Unstructured
	kinds := map[string]int{}
	for _, dir := range []string{"daemonset", "daemonset/monitoring", "daemonset/examples"} {
		path := filepath.Join("..", "..", "deploy", dir)
		var y []byte
		if dir == "daemonset/monitoring" {
			res, err := k.Run(filesys.MakeFsOnDisk(), path)
			if err != nil {
				t.Fatalf("kustomize build deploy/%s: %v", dir, err)
			}
			if y, err = res.AsYaml(); err != nil {
				t.Fatal(err)
			}
		} else {
			var err error
			if y, err = bundle.Render(path, image); err != nil {
				t.Fatalf("make bundle deploy/%s: %v", dir, err)
			}
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(y), 4096)
		for {
			var m map[string]any
			if err := dec.Decode(&m); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("deploy/%s: %v", dir, err)
			} else if m == nil {
				continue
			}
			u := &unstructured.Unstructured{Object: m}
			objs = append(objs, u)
			kinds[u.GetKind()]++
		}
	}
	for _, want := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "CustomResourceDefinition", "DaemonSet", "StorageClass", "CSIDriver", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "PodMonitor", "ModelCache", "Pod", "PersistentVolumeClaim"} {
		if kinds[want] == 0 {
			t.Errorf("the bundle has no %s: %v", want, kinds)
		}
	}
	// The PodMonitor CRD must be known to discovery before mapping.
	var mapper *restmapper.DeferredDiscoveryRESTMapper
	testenv.Poll(5*time.Second, func() error { // a mapping still missing is reported per object below
		mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cl.Config)))
		_, err := mapper.RESTMapping(podMonitorGK, "v1")
		return err
	})
	for _, u := range objs {
		gvk := u.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Errorf("%s %s: %v", gvk.Kind, u.GetName(), err)
			continue
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == "namespace" {
			ns := u.GetNamespace()
			if ns == "" {
				t.Errorf("%s %s has no namespace", gvk.Kind, u.GetName())
				continue
			}
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		_, err = ri.Apply(ctx, u.GetName(), u, metav1.ApplyOptions{FieldManager: "deploy-test", Force: true, DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Errorf("server-side dry-run of %s %s/%s: %v", gvk.Kind, u.GetNamespace(), u.GetName(), err)
		}
	}
	// The DaemonSet runs the daemon the way k8ssync expects.
	for _, u := range objs {
		if u.GetKind() != "DaemonSet" {
			continue
		}
		v, _, _ := unstructured.NestedFieldNoCopy(u.Object, "spec", "template", "spec", "containers")
		c := v.([]any)[0].(map[string]any)
		img, _ := c["image"].(string)
		if img != image {
			t.Errorf("image %q: want the one make bundle was given, %s", img, image)
		}
		env, _ := c["env"].([]any)
		found := false
		for _, e := range env {
			if e.(map[string]any)["name"] == "NODE_NAME" {
				found = true
			}
		}
		if !found {
			t.Error("the DaemonSet does not set NODE_NAME from the downward API")
		}
		// The CSI node plugin: its socket on, the pods directory mounted
		// at its host path with Bidirectional propagation.
		args, _ := c["args"].([]any)
		csiOn := false
		for _, a := range args {
			csiOn = csiOn || strings.HasPrefix(a.(string), "--csi-socket=/var/lib/kubelet/plugins/csi.modelcache.io/")
		}
		mounts, _ := c["volumeMounts"].([]any)
		bidi := false
		for _, m := range mounts {
			mm := m.(map[string]any)
			bidi = bidi || mm["mountPath"] == "/var/lib/kubelet/pods" && mm["mountPropagation"] == "Bidirectional"
		}
		if !csiOn || !bidi {
			t.Errorf("the DaemonSet does not serve the CSI driver (--csi-socket %v) with kubelet's pods directory mounted Bidirectional (%v)", csiOn, bidi)
		}
	}
	for _, u := range objs {
		if u.GetKind() != "CSIDriver" {
			continue
		}
		spec, _, _ := unstructured.NestedMap(u.Object, "spec")
		if u.GetName() != "csi.modelcache.io" || spec["podInfoOnMount"] != true || spec["attachRequired"] != false || fmt.Sprint(spec["volumeLifecycleModes"]) != "[Ephemeral]" {
			t.Errorf("CSIDriver %s: %v; want csi.modelcache.io with podInfoOnMount, no attach, Ephemeral only", u.GetName(), spec)
		}
	}
}

var (
	apiextensionsGVR = schemaGVR("apiextensions.k8s.io", "v1", "customresourcedefinitions")
	podMonitorGK     = schemaGK("monitoring.coreos.com", "PodMonitor")
)
