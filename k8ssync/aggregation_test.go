package k8ssync_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/modelcache/modelcache/internal/kubetest"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/k8ssync"
)

// TestMissingLeaseNamespaceIsReported: against a cluster where the Lease
// namespace does not exist, the node says why ModelCache status is not
// aggregated (its ModelCacheNode status and a Warning Event, with the
// remedy), and stops saying so once the namespace exists and a ModelCache
// is aggregated again.
func TestMissingLeaseNamespaceIsReported(t *testing.T) {
	cl := kubetest.Start(t)
	ctx := context.Background()
	kc := kubernetes.NewForConfigOrDie(cl.Config)
	dyn := dynamic.NewForConfigOrDie(cl.Config)
	if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-ns"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	startNodeIn(t, cl.Config, "node-ns", `{"devices":[]}`, false, "nowhere")
	testenv.Eventually(t, "the node's status names the missing namespace", 60*time.Second, func() error {
		n, err := nodeStatus(dyn, "node-ns")
		if err != nil {
			return err
		}
		for _, p := range n.Status.Problems {
			if strings.Contains(p, `namespace "nowhere" does not exist`) && strings.Contains(p, "kubectl create namespace nowhere") {
				return nil
			}
		}
		return fmt.Errorf("problems %q", n.Status.Problems)
	})
	testenv.Eventually(t, "a Warning Event on the ModelCacheNode", 30*time.Second, func() error {
		evs, err := kc.CoreV1().Events("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == k8ssync.EventAggregation && e.Type == corev1.EventTypeWarning && e.InvolvedObject.Name == "node-ns" {
				return nil
			}
		}
		return fmt.Errorf("%d events, none AggregationDisabled", len(evs.Items))
	})
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nowhere"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the problem clears once the namespace exists", 60*time.Second, func() error {
		n, err := nodeStatus(dyn, "node-ns")
		if err != nil {
			return err
		}
		if len(n.Status.Problems) != 0 {
			return fmt.Errorf("problems %q", n.Status.Problems)
		}
		return nil
	})
}
