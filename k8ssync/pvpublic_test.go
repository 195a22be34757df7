package k8ssync_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/k8ssync"
)

// TestNodeTokenMakesPVsOfPublicArtifactsOnly: with the bundle's
// admission policies on the real API server, node A's token (as a thief
// holds it) makes the local PV the daemon would make (k8ssync.LocalPV)
// of an artifact a ModelCache declares public, and is refused, with a
// message naming the rule and the ModelCache, one of an artifact a
// ModelCache makes private (a Secret of modelcache-system without
// spec.public, a Secret another namespace granted, public or not, a
// version of such a ModelCache) or Absent; a ModelCache that becomes
// private is refused from then on. The cluster's admin is not bound by
// it. A name no ModelCache declares is admitted: the limit the policy
// states (deploy/daemonset/base/admission.yaml).
func TestNodeTokenMakesPVsOfPublicArtifactsOnly(t *testing.T) {
	cl, kc, dyn := bundleCluster(t, "node-a")
	ctx := context.Background()
	pvs := kubernetes.NewForConfigOrDie(nodeToken(t, cl, kc, "node-a")).CoreV1().PersistentVolumes()

	own := map[string]any{"namespace": "modelcache-system", "name": "modelcache-credentials"}
	granted := map[string]any{"namespace": "team-a", "name": "hf"}
	for name, spec := range map[string]map[string]any{
		"open":        {"source": "hf://org/open"},
		"open-secret": {"source": "hf://org/open-secret", "secretRef": own, "public": true},
		"closed":      {"source": "hf://org/closed", "secretRef": own},
		"team":        {"source": "hf://team-a/finetune", "secretRef": granted, "public": true},
		"versioned": {"source": "hf://org/versioned", "secretRef": own,
			"versions": []any{map[string]any{"suffix": "next", "source": "hf://org/versioned@next"}}},
		"gone": {"source": "hf://org/gone", "state": "Absent"},
	} {
		if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc(name, spec), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	const rule = "a modelcached PV is of a public artifact only"
	pv := func(artifact string) *corev1.PersistentVolume {
		return k8ssync.LocalPV("node-a", "modelcache-local", api.Artifact{Name: artifact, Bytes: 1 << 20,
			Path: "/var/lib/modelcache/models/" + artifact + "/" + strings.Repeat("a", 40)})
	}
	// The policy loads a moment after it is created, and its parameters
	// (the ModelCaches) through the API server's own informer: a dry run
	// until it refuses the last ModelCache created (the informer delivers
	// them in order), so that nothing is left behind meanwhile.
	refusedFor := func(artifact string) func() error {
		return func() error {
			_, err := pvs.Create(ctx, pv(artifact), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), rule) {
				return fmt.Errorf("dry run: %v, want Forbidden naming %q", err, rule)
			}
			return nil
		}
	}
	testenv.Eventually(t, "the policy refuses node A's token a PV of a private ModelCache's artifact", time.Minute, refusedFor("closed"))
	testenv.Eventually(t, "... and of the last ModelCache created", time.Minute, refusedFor("gone"))

	for _, c := range []struct {
		artifact, why string // why: "" admitted, else what the refusal names
	}{
		{"open", ""},
		{"open-secret", ""},
		{"closed", "ModelCache closed makes closed private (spec.secretRef modelcache-system/modelcache-credentials without spec.public: true)"},
		{"team", "ModelCache team makes team private (spec.secretRef team-a/hf, granted by a ModelCacheCredentials of its namespace)"},
		{"versioned-next", "ModelCache versioned makes versioned-next private"},
		{"versioned", "ModelCache versioned makes versioned private"},
		{"gone", "ModelCache gone is Absent"},
		// The limit: no ModelCache declares it (a models.d artifact),
		// and no evaluation of the policy, which sees one ModelCache at a
		// time, can say that none does.
		{"local-finetune", ""},
	} {
		_, err := pvs.Create(ctx, pv(c.artifact), metav1.CreateOptions{})
		switch {
		case c.why == "" && err != nil:
			t.Errorf("node A's PV of %s: %v, want admitted", c.artifact, err)
		case c.why == "":
		case !apierrors.IsForbidden(err):
			t.Errorf("node A's PV of %s: %v, want Forbidden", c.artifact, err)
		case !strings.Contains(err.Error(), rule+": "+c.why):
			t.Errorf("node A's PV of %s: %v; want %q", c.artifact, err, rule+": "+c.why)
		}
	}

	// A public ModelCache that takes a Secret without spec.public is
	// private: its PV is refused from the moment the API server sees it.
	if err := pvs.Delete(ctx, k8ssync.PVName("node-a", "open"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Patch(ctx, "open", types.MergePatchType,
		[]byte(`{"spec":{"secretRef":{"namespace":"modelcache-system","name":"modelcache-credentials"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "node A's PV of a ModelCache that became private refused", time.Minute, refusedFor("open"))

	// The admin (no node token) is not bound by it.
	if _, err := kc.CoreV1().PersistentVolumes().Create(ctx, pv("closed"), metav1.CreateOptions{}); err != nil {
		t.Errorf("the admin's PV of a private artifact: %v, want admitted", err)
	}
}
