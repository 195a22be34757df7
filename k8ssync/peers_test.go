package k8ssync_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
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
)

// TestPeerFanOutStatus: three daemons against a real kube-apiserver, each
// with a peer port, its token a projected-style token of the daemons'
// service account (audience modelcache-peer, checked by TokenReview). One
// ModelCache selects all three at once with --origin-concurrency 1: each
// node's status carries its peer address, every node ends Ready, and the
// origin sends the model's shards once, not three times.
func TestPeerFanOutStatus(t *testing.T) {
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
	tr, err := kc.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"modelcache-peer"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tok := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tok, []byte(tr.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}

	hub := hubtest.New()
	defer hub.Close()
	files := map[string][]byte{"config.json": []byte(`{"model_type":"llama"}`)}
	var lfs int64
	for i := range 4 {
		b := storetest.Data(200<<10+i, byte(10+i))
		files["model-0000"+strconv.Itoa(i+1)+".safetensors"] = b
		lfs += int64(len(b))
	}
	small := int64(len(files["config.json"]))
	hub.Commit("org/fan", files, "main")
	t.Setenv("HF_ENDPOINT", hub.URL())
	t.Setenv("HF_TOKEN", "")

	names := []string{"node-a", "node-b", "node-c"}
	addrs := map[string]string{}
	var nodes []*node
	for _, name := range names {
		if _, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs[name] = l.Addr().String()
		l.Close()
		nodes = append(nodes, startNodeIn(t, cl.Config, name, `{"devices":[]}`, false, ns, func(c *daemon.Config) {
			p := daemon.DefaultPeerConfig()
			p.Addr, p.Advertise, p.TokenFile, p.ServiceAccount = addrs[name], "http://"+addrs[name], tok, ns+"/"+sa
			// Settle is long enough for the other nodes' statuses to land
			// on a loaded machine (each writes its own within a second or
			// two): a node that has not seen them ranks itself first.
			p.OriginConcurrency, p.Poll, p.Settle = 1, 50*time.Millisecond, 5*time.Second
			c.Peer = &p
		}))
	}
	if _, err := dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc("fan", map[string]any{"source": "hf://org/fan"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		testenv.Eventually(t, n.name+": fan Ready", 90*time.Second, func() error {
			if p := phaseOf(n, "fan"); p != api.PhaseReady {
				a, err := n.c.Get(ctx, "fan")
				return fmt.Errorf("phase %q: %+v %v", p, a, err)
			}
			return nil
		})
	}
	for _, name := range names {
		testenv.Eventually(t, name+": status.peerAddress", 20*time.Second, func() error {
			st, err := nodeStatus(dyn, name)
			if err != nil {
				return err
			}
			if st.Status.PeerAddress != "http://"+addrs[name] {
				return fmt.Errorf("peerAddress %q, want http://%s", st.Status.PeerAddress, addrs[name])
			}
			return nil
		})
	}
	// The statuses say where each node's bytes came from, and the
	// ModelCache's version status counts one node that fetched from the
	// origin (--origin-concurrency 1).
	var statuses []k8ssync.ModelCacheNode
	testenv.Eventually(t, "each node's status says where its bytes came from", 30*time.Second, func() error {
		statuses = statuses[:0]
		for _, name := range names {
			st, err := nodeStatus(dyn, name)
			if err != nil {
				return err
			}
			a := artifactOn(st, "fan")
			if a == nil || a.OriginBytes+a.PeerBytes == 0 {
				return fmt.Errorf("%s: %+v", name, a)
			}
			statuses = append(statuses, *st)
		}
		return nil
	})
	fan := &k8ssync.ModelCache{ObjectMeta: metav1.ObjectMeta{Name: "fan"}, Spec: k8ssync.ModelCacheSpec{Source: "hf://org/fan"}}
	if v := k8ssync.Aggregate(fan, statuses, time.Now()).Versions[0]; v.FromOrigin != 1 || v.PeerBytes < 2*lfs {
		t.Fatalf("version status %+v: want fromOrigin 1 and the shards from peers on the other two nodes", v)
	}
	if got := hub.Sent.Load(); got != lfs+3*small {
		t.Fatalf("origin sent %d bytes, want %d: the shards once (--origin-concurrency 1), the small file on each node", got, lfs+3*small)
	}
	var fromPeers int64
	for _, n := range nodes {
		a, err := n.c.Get(ctx, "fan")
		if err != nil {
			t.Fatal(err)
		}
		if a.LastPull != nil {
			fromPeers += a.LastPull.BytesFromPeers
		}
	}
	if fromPeers != 2*lfs {
		t.Fatalf("%d bytes came from peers, want %d: two nodes' shards", fromPeers, 2*lfs)
	}
}
