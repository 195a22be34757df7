package k8ssync_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore/storetest"
	"github.com/modelcache/modelcache/daemon"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
	"github.com/modelcache/modelcache/internal/kubetest"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/k8ssync"
	"github.com/modelcache/modelcache/peer"
)

// poolLabel is a label a node's own credentials cannot set
// (NodeRestriction keeps node-restriction.kubernetes.io/ from kubelets;
// the daemons' admission policy keeps them to their own model labels).
const poolLabel = "node-restriction.kubernetes.io/pool"

// TestNodeSelection, on a real API server: a ModelCache selects the
// nodes its nodeSelector matches, every node without one, none when
// Absent or missing; a node that does not exist is selected by no
// selector. What was read is used for TTL: a relabelled node is seen
// only after it.
func TestNodeSelection(t *testing.T) {
	cl := kubetest.Start(t)
	ctx := context.Background()
	kc := kubernetes.NewForConfigOrDie(cl.Config)
	dyn := dynamic.NewForConfigOrDie(cl.Config)
	for name, pool := range map[string]string{"node-a": "a", "node-b": "b"} {
		if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{poolLabel: pool}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for name, spec := range map[string]map[string]any{
		"pool-a": {"source": "hf://org/a", "nodeSelector": map[string]any{"matchLabels": map[string]any{poolLabel: "a"}}},
		"all":    {"source": "hf://org/all"},
		"gone":   {"source": "hf://org/gone", "state": "Absent"},
	} {
		if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc(name, spec), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	sel, err := k8ssync.NewNodeSelection(cl.Config)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	sel.Now = func() time.Time { return now }
	check := func(mc, node string, want bool) {
		t.Helper()
		if got, err := sel.Selects(ctx, mc, node); err != nil || got != want {
			t.Errorf("ModelCache %s, node %q: %v %v, want %v", mc, node, got, err, want)
		}
	}
	check("pool-a", "node-a", true)
	check("pool-a", "node-b", false)
	check("pool-a", "node-x", false) // no such Node
	check("pool-a", "", false)
	check("all", "node-b", true)
	check("gone", "node-a", false)
	check("missing", "node-a", false)

	n, err := kc.CoreV1().Nodes().Get(ctx, "node-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Labels[poolLabel] = "a"
	if _, err := kc.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	check("pool-a", "node-b", false) // within the TTL: the labels as read
	now = now.Add(sel.TTL)
	check("pool-a", "node-b", true)
}

// TestPeerPortGivesPrivateBlobsToSelectedNodes, on a real API server: a
// daemon on node-a serves its peer port to tokens of the daemons'
// service account bound to Nodes (TokenRequest's boundObjectRef, as a
// DaemonSet pod's projected token is bound to its pod and so to its
// node). A private artifact (credentials of the daemon's namespace)
// whose ModelCache selects pool a goes to node-a's and node-c's tokens,
// not to node-b's nor to a token bound to no node, and the refusal is
// the 404 of a blob not held; a public artifact's blob goes to all.
func TestPeerPortGivesPrivateBlobsToSelectedNodes(t *testing.T) {
	cl := kubetest.Start(t)
	ctx := context.Background()
	kc := kubernetes.NewForConfigOrDie(cl.Config)
	dyn := dynamic.NewForConfigOrDie(cl.Config)
	const ns, sa = "modelcache-system", "modelcached"
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "hf"},
		StringData: map[string]string{"HF_TOKEN": "team-token"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	nodes := map[string]*corev1.Node{}
	for name, pool := range map[string]string{"node-a": "a", "node-b": "b", "node-c": "a"} {
		n, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{poolLabel: pool}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		nodes[name] = n
	}
	token := func(bound *corev1.Node) string {
		spec := authenticationv1.TokenRequestSpec{Audiences: []string{peer.DefaultAudience}}
		if bound != nil {
			spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: bound.Name, UID: bound.UID}
		}
		tr, err := kc.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: spec}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	tokens := map[string]string{"node-a": token(nodes["node-a"]), "node-b": token(nodes["node-b"]), "node-c": token(nodes["node-c"]), "no node": token(nil)}
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte(tokens["node-a"]), 0o600); err != nil {
		t.Fatal(err)
	}

	hub := hubtest.New()
	defer hub.Close()
	secret, open := storetest.Data(64<<10, 71), storetest.Data(48<<10, 72)
	hub.Commit("team/private", map[string][]byte{"config.json": []byte(`{"model_type":"p"}`), "w.safetensors": secret}, "main")
	hub.Commit("org/open", map[string][]byte{"config.json": []byte(`{"model_type":"o"}`), "w.safetensors": open}, "main")
	t.Setenv("HF_ENDPOINT", hub.URL())
	t.Setenv("HF_TOKEN", "")

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	a := startNodeIn(t, cl.Config, "node-a", `{"devices":[]}`, false, ns, func(c *daemon.Config) {
		p := daemon.DefaultPeerConfig()
		p.Addr, p.Advertise, p.TokenFile, p.ServiceAccount = addr, "http://"+addr, tokFile, ns+"/"+sa
		c.Peer = &p
	})
	for name, spec := range map[string]map[string]any{
		"private": {"source": "hf://team/private", "secretRef": map[string]any{"namespace": ns, "name": "hf"},
			"nodeSelector": map[string]any{"matchLabels": map[string]any{poolLabel: "a"}}},
		"open": {"source": "hf://org/open"},
	} {
		if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc(name, spec), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"private", "open"} {
		testenv.Eventually(t, "node-a: "+name+" Ready", 60*time.Second, func() error {
			if p := phaseOf(a, name); p != api.PhaseReady {
				return fmt.Errorf("phase %q", p)
			}
			return nil
		})
	}
	if x, err := a.c.Get(ctx, "private"); err != nil || x.Desire == nil || len(x.Desire.AllowedNamespaces) == 0 {
		t.Fatalf("the artifact fetched with credentials is not private: %+v %v", x, err)
	}

	get := func(who, digest string) (int, string) {
		req, _ := http.NewRequest("GET", "http://"+addr+peer.BlobPath+digest, nil)
		req.Header.Set("Authorization", "Bearer "+tokens[who])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	digest := func(b []byte) string { s := sha256.Sum256(b); return "sha256:" + hex.EncodeToString(s[:]) }
	notHeldStatus, notHeldBody := get("node-a", digest([]byte("held by no one")))
	if notHeldStatus != http.StatusNotFound {
		t.Fatalf("a blob not held: %d", notHeldStatus)
	}
	for _, tc := range []struct {
		who  string
		blob []byte
		ok   bool
	}{
		{"node-a", secret, true},
		{"node-c", secret, true}, // selected too (pool a)
		{"node-b", secret, false},
		{"no node", secret, false},
		{"node-a", open, true},
		{"node-b", open, true},
		{"no node", open, true},
	} {
		status, body := get(tc.who, digest(tc.blob))
		switch {
		case tc.ok && (status != http.StatusOK || body != string(tc.blob)):
			t.Errorf("%s's token, %d bytes: %d with %d bytes, want the blob", tc.who, len(tc.blob), status, len(body))
		case !tc.ok && (status != notHeldStatus || body != notHeldBody):
			t.Errorf("%s's token, the private blob: %d with %d bytes, want what a blob not held gets: %d %q", tc.who, status, len(body), notHeldStatus, notHeldBody)
		}
	}
}
