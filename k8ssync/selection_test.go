package k8ssync_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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

// TestNodeSelectionFrom, on a real API server: a request comes from
// what its token is bound to when its address is one of the pod's
// status.podIPs (IPv4 in IPv6 form too; a hostNetwork pod's are its
// node's), or, for a token bound to a Node, one of the Node's InternalIP
// or ExternalIP addresses. Not from a pod of another uid, one that has
// ended, one gone, one whose address changed, nor from its node's address
// for a pod on the pod network; a token bound to neither comes from
// nowhere. What was read is used for TTL.
func TestNodeSelectionFrom(t *testing.T) {
	cl := kubetest.Start(t)
	ctx := context.Background()
	kc := kubernetes.NewForConfigOrDie(cl.Config)
	const ns = "modelcache-system"
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: "node-a"},
		{Type: corev1.NodeInternalIP, Address: "192.0.2.1"}, {Type: corev1.NodeExternalIP, Address: "198.51.100.1"}}
	if _, err := kc.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	no := false
	setStatus := func(name, phase string, ips ...string) {
		t.Helper()
		var list []string
		for _, ip := range ips {
			list = append(list, fmt.Sprintf(`{"ip":%q}`, ip))
		}
		patch := fmt.Sprintf(`{"status":{"phase":%q,"podIP":%q,"podIPs":[%s]}}`, phase, ips[0], strings.Join(list, ","))
		if _, err := kc.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
	}
	pod := func(name string, hostNetwork bool, phase string, ips ...string) k8ssync.Bound {
		t.Helper()
		p, err := kc.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{
			NodeName: "node-a", HostNetwork: hostNetwork, AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "modelcached", Image: "modelcached"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		setStatus(name, phase, ips...)
		return k8ssync.Bound{Namespace: ns, Pod: name, PodUID: string(p.UID), Node: "node-a"}
	}
	onNet := pod("on-net", false, "Running", "10.0.0.5", "fd00::5")
	onHost := pod("on-host", true, "Running", "192.0.2.1")
	ended := pod("ended", false, "Failed", "10.0.0.6")
	otherUID := onNet
	otherUID.PodUID = "not-the-pods"
	noNS := onNet
	noNS.Namespace = ""

	sel, err := k8ssync.NewNodeSelection(cl.Config)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	sel.Now = func() time.Time { return now }
	check := func(what string, b k8ssync.Bound, src string, want bool) {
		t.Helper()
		a, _ := netip.ParseAddr(src) // "": the zero address
		if got, err := sel.From(ctx, b, a); err != nil || got != want {
			t.Errorf("%s, from %q: %v %v, want %v", what, src, got, err, want)
		}
	}
	check("a pod", onNet, "10.0.0.5", true)
	check("a pod", onNet, "::ffff:10.0.0.5", true)
	check("a pod", onNet, "fd00::5", true)
	check("a pod", onNet, "10.0.0.7", false)
	check("a pod on the pod network", onNet, "192.0.2.1", false)
	check("a pod", onNet, "", false)
	check("a hostNetwork pod", onHost, "192.0.2.1", true)
	check("a pod of another uid", otherUID, "10.0.0.5", false)
	check("a pod named without its namespace", noNS, "10.0.0.5", false)
	check("a pod that has ended", ended, "10.0.0.6", false)
	check("a pod that does not exist", k8ssync.Bound{Namespace: ns, Pod: "none", PodUID: "u", Node: "node-a"}, "10.0.0.5", false)
	check("a Node", k8ssync.Bound{Node: "node-a"}, "192.0.2.1", true)
	check("a Node", k8ssync.Bound{Node: "node-a"}, "198.51.100.1", true)
	check("a Node", k8ssync.Bound{Node: "node-a"}, "10.0.0.5", false)
	check("a Node that does not exist", k8ssync.Bound{Node: "node-x"}, "192.0.2.1", false)
	check("neither", k8ssync.Bound{}, "192.0.2.1", false)

	// A new address is seen after the TTL, and a pod gone, or made
	// again under its name (another uid), is no source.
	setStatus("on-net", "Running", "10.0.0.9")
	check("a pod whose address changed, within the TTL", onNet, "10.0.0.5", true)
	now = now.Add(sel.TTL)
	check("a pod whose address changed", onNet, "10.0.0.5", false)
	check("a pod at its new address", onNet, "10.0.0.9", true)
	var zero int64 // no kubelet to end it gracefully
	if err := kc.CoreV1().Pods(ns).Delete(ctx, "on-net", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(sel.TTL)
	check("a pod gone", onNet, "10.0.0.9", false)
	pod("on-net", false, "Running", "10.0.0.9")
	now = now.Add(sel.TTL)
	check("a pod gone, its name another pod's at its address", onNet, "10.0.0.9", false)
}

// peerPort is a daemon on node-a with a peer port, on a real API server,
// holding a private artifact (credentials of the daemon's namespace) whose
// ModelCache selects pool a, and a public one. Nodes node-a and node-c are
// in pool a, node-b in pool b, each with the address 127.0.0.1, where the
// test's requests come from; node-d is in pool a at 10.9.9.9, elsewhere.
type peerPort struct {
	t            *testing.T
	kc           kubernetes.Interface
	addr         string
	nodes        map[string]*corev1.Node
	secret, open []byte
	notHeld      [2]string // status and body of a blob not held
}

const peerNS, peerSA = "modelcache-system", "modelcached"

func startPeerPort(t *testing.T) *peerPort {
	cl := kubetest.Start(t)
	ctx := context.Background()
	p := &peerPort{t: t, kc: kubernetes.NewForConfigOrDie(cl.Config), nodes: map[string]*corev1.Node{}}
	dyn := dynamic.NewForConfigOrDie(cl.Config)
	if _, err := p.kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: peerNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.kc.CoreV1().ServiceAccounts(peerNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: peerSA}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.kc.CoreV1().Secrets(peerNS).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "hf"},
		StringData: map[string]string{"HF_TOKEN": "team-token"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, at := range map[string][2]string{"node-a": {"a", "127.0.0.1"}, "node-b": {"b", "127.0.0.1"}, "node-c": {"a", "127.0.0.1"}, "node-d": {"a", "10.9.9.9"}} {
		n, err := p.kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{poolLabel: at[0]}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: name}, {Type: corev1.NodeInternalIP, Address: at[1]}}
		if n, err = p.kc.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		p.nodes[name] = n
	}
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte(p.token("Node", "node-a", p.nodes["node-a"].UID)), 0o600); err != nil {
		t.Fatal(err)
	}

	hub := hubtest.New()
	t.Cleanup(hub.Close)
	p.secret, p.open = storetest.Data(64<<10, 71), storetest.Data(48<<10, 72)
	hub.Commit("team/private", map[string][]byte{"config.json": []byte(`{"model_type":"p"}`), "w.safetensors": p.secret}, "main")
	hub.Commit("org/open", map[string][]byte{"config.json": []byte(`{"model_type":"o"}`), "w.safetensors": p.open}, "main")
	t.Setenv("HF_ENDPOINT", hub.URL())
	t.Setenv("HF_TOKEN", "")

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = l.Addr().String()
	l.Close()
	a := startNodeIn(t, cl.Config, "node-a", `{"devices":[]}`, false, peerNS, func(c *daemon.Config) {
		pc := daemon.DefaultPeerConfig()
		pc.Addr, pc.Advertise, pc.TokenFile, pc.ServiceAccount = p.addr, "http://"+p.addr, tokFile, peerNS+"/"+peerSA
		c.Peer = &pc
	})
	for name, spec := range map[string]map[string]any{
		"private": {"source": "hf://team/private", "secretRef": map[string]any{"namespace": peerNS, "name": "hf"},
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
	status, body := p.get(p.token("Node", "node-a", p.nodes["node-a"].UID), []byte("held by no one"))
	if status != http.StatusNotFound {
		t.Fatalf("a blob not held: %d", status)
	}
	p.notHeld = [2]string{strconv.Itoa(status), body}
	return p
}

// token is a peer token of the daemons' service account bound to the
// object kind/name (TokenRequest's boundObjectRef, as a DaemonSet pod's
// projected token is bound to its pod); kind "": bound to nothing.
func (p *peerPort) token(kind, name string, uid types.UID) string {
	spec := authenticationv1.TokenRequestSpec{Audiences: []string{peer.DefaultAudience}}
	if kind != "" {
		spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: kind, APIVersion: "v1", Name: name, UID: uid}
	}
	tr, err := p.kc.CoreV1().ServiceAccounts(peerNS).CreateToken(context.Background(), peerSA, &authenticationv1.TokenRequest{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		p.t.Fatal(err)
	}
	return tr.Status.Token
}

// get asks the peer port, from 127.0.0.1, for the blob of content b.
func (p *peerPort) get(token string, b []byte) (int, string) {
	sum := sha256.Sum256(b)
	req, _ := http.NewRequest("GET", "http://"+p.addr+peer.BlobPath+"sha256:"+hex.EncodeToString(sum[:]), nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		p.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// check fails unless token gets blob (ok) or what a blob not held gets.
func (p *peerPort) check(what, token string, blob []byte, ok bool) {
	p.t.Helper()
	status, body := p.get(token, blob)
	switch {
	case ok && (status != http.StatusOK || body != string(blob)):
		p.t.Errorf("%s, %d bytes: %d with %d bytes, want the blob", what, len(blob), status, len(body))
	case !ok && [2]string{strconv.Itoa(status), body} != p.notHeld:
		p.t.Errorf("%s, %d bytes: %d with %d bytes, want what a blob not held gets: %v", what, len(blob), status, len(body), p.notHeld)
	}
}

// TestPeerPortGivesPrivateBlobsToSelectedNodes, on a real API server: a
// daemon on node-a serves its peer port to tokens of the daemons'
// service account bound to Nodes. A private artifact whose ModelCache
// selects pool a goes to node-a's and node-c's tokens, whose requests
// come from their Nodes' addresses, not to node-b's, nor to a token
// bound to no node, nor to node-d's, selected but at another address
// (its token replayed from here); the refusal is the 404 of a blob not
// held. A public artifact's blob goes to all.
func TestPeerPortGivesPrivateBlobsToSelectedNodes(t *testing.T) {
	p := startPeerPort(t)
	tokens := map[string]string{"no node": p.token("", "", "")}
	for name, n := range p.nodes {
		tokens[name] = p.token("Node", name, n.UID)
	}
	for _, tc := range []struct {
		who  string
		blob []byte
		ok   bool
	}{
		{"node-a", p.secret, true},
		{"node-c", p.secret, true}, // selected too (pool a)
		{"node-b", p.secret, false},
		{"no node", p.secret, false},
		{"node-d", p.secret, false}, // selected, but the request is not from node-d
		{"node-a", p.open, true},
		{"node-b", p.open, true},
		{"no node", p.open, true},
		{"node-d", p.open, true},
	} {
		p.check(tc.who+"'s token", tokens[tc.who], tc.blob, tc.ok)
	}
}

// TestPeerPortBindsPodTokensToTheirPods, on a real API server: a peer
// token bound to a pod (the DaemonSet's projected token) gets a private
// blob only from one of that pod's status.podIPs. No kubelet runs: the
// test writes the pods' status. A pod on node-a at 127.0.0.1 gets the
// private blob; a pod on node-a at 10.9.9.9, whose token is replayed
// from here, does not, nor a pod at 127.0.0.1 on node-b (not selected),
// nor a pod's token from its node's address; the public blob goes to
// each.
func TestPeerPortBindsPodTokensToTheirPods(t *testing.T) {
	p := startPeerPort(t)
	ctx := context.Background()
	no := false
	podToken := func(name, node, ip string) string {
		pod, err := p.kc.CoreV1().Pods(peerNS).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{
			NodeName: node, ServiceAccountName: peerSA, AutomountServiceAccountToken: &no,
			Containers: []corev1.Container{{Name: "modelcached", Image: "modelcached"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		patch := fmt.Sprintf(`{"status":{"podIP":%q,"podIPs":[{"ip":%q}]}}`, ip, ip)
		if _, err := p.kc.CoreV1().Pods(peerNS).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
		return p.token("Pod", name, pod.UID)
	}
	here, elsewhere := podToken("peer-here", "node-a", "127.0.0.1"), podToken("peer-elsewhere", "node-a", "10.9.9.9")
	onB := podToken("peer-b", "node-b", "127.0.0.1")
	// node-c is at 127.0.0.1, its pod at 10.9.9.10: the request comes
	// from the pod's node, not from the pod.
	onC := podToken("peer-c", "node-c", "10.9.9.10")
	for _, tc := range []struct {
		who, token string
		ok         bool
	}{
		{"a pod on node-a at 127.0.0.1", here, true},
		{"a pod on node-a at 10.9.9.9", elsewhere, false},
		{"a pod on node-b at 127.0.0.1", onB, false},
		{"a pod on node-c at 10.9.9.10, from node-c's address", onC, false},
	} {
		p.check(tc.who+", the private blob", tc.token, p.secret, tc.ok)
		p.check(tc.who+", the public blob", tc.token, p.open, true)
	}
}
