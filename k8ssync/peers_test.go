package k8ssync_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
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

// fanCluster is a real kube-apiserver for the fan-out tests, with the
// daemons' service account and a peer token of it (audience
// modelcache-peer, checked by TokenReview), and a hub whose org/fan has
// four LFS shards and a small file.
type fanCluster struct {
	t          *testing.T
	cfg        *rest.Config
	kc         kubernetes.Interface
	dyn        dynamic.Interface
	tok        string
	hub        *hubtest.Hub
	lfs, small int64
	addrs      map[string]string
}

const fanNS, fanSA = "modelcache-system", "modelcached"

func newFanCluster(t *testing.T) *fanCluster {
	cl := kubetest.Start(t)
	ctx := context.Background()
	c := &fanCluster{t: t, cfg: cl.Config, kc: kubernetes.NewForConfigOrDie(cl.Config), dyn: dynamic.NewForConfigOrDie(cl.Config), addrs: map[string]string{}}
	if _, err := c.kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: fanNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.kc.CoreV1().ServiceAccounts(fanNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: fanSA}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := c.kc.CoreV1().ServiceAccounts(fanNS).CreateToken(ctx, fanSA, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"modelcache-peer"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	c.tok = filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(c.tok, []byte(tr.Status.Token), 0o600); err != nil {
		t.Fatal(err)
	}
	c.hub = hubtest.New()
	t.Cleanup(c.hub.Close)
	files := map[string][]byte{"config.json": []byte(`{"model_type":"llama"}`)}
	for i := range 4 {
		b := storetest.Data(200<<10+i, byte(10+i))
		files["model-0000"+strconv.Itoa(i+1)+".safetensors"] = b
		c.lfs += int64(len(b))
	}
	c.small = int64(len(files["config.json"]))
	c.hub.Commit("org/fan", files, "main")
	t.Setenv("HF_ENDPOINT", c.hub.URL())
	t.Setenv("HF_TOKEN", "")
	return c
}

// addNode creates the Node object name.
func (c *fanCluster) addNode(name string) {
	if _, err := c.kc.CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
}

// start runs name's daemon with a peer port, --origin-concurrency 1 and
// the default settle time.
func (c *fanCluster) start(name string) *node {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	c.addrs[name] = l.Addr().String()
	l.Close()
	return startNodeIn(c.t, c.cfg, name, `{"devices":[]}`, false, fanNS, func(cfg *daemon.Config) {
		p := daemon.DefaultPeerConfig()
		p.Addr, p.Advertise, p.TokenFile, p.ServiceAccount = c.addrs[name], "http://"+c.addrs[name], c.tok, fanNS+"/"+fanSA
		p.OriginConcurrency, p.Poll = 1, 50*time.Millisecond
		cfg.Peer = &p
		// No filesystem watermarks: how full the host's
		// disk is is not these tests' subject.
		cfg.Capacity.HighPercent, cfg.Capacity.LowPercent = 0, 0
	})
}

// startAll adds the Nodes and starts their daemons, and waits for each
// status to carry its peer address.
func (c *fanCluster) startAll(names ...string) []*node {
	var nodes []*node
	for _, name := range names {
		c.addNode(name)
		nodes = append(nodes, c.start(name))
	}
	for _, name := range names {
		testenv.Eventually(c.t, name+": status.peerAddress", 30*time.Second, func() error {
			st, err := nodeStatus(c.dyn, name)
			if err != nil {
				return err
			}
			if st.Status.PeerAddress != "http://"+c.addrs[name] {
				return fmt.Errorf("peerAddress %q, want http://%s", st.Status.PeerAddress, c.addrs[name])
			}
			return nil
		})
	}
	return nodes
}

// createFan creates the ModelCache fan (every node) and returns the
// origin nodes its resolution records.
func (c *fanCluster) createFan() []string {
	if _, err := c.dyn.Resource(k8ssync.ModelCacheGVR).Create(context.Background(), mc("fan", map[string]any{"source": "hf://org/fan"}), metav1.CreateOptions{}); err != nil {
		c.t.Fatal(err)
	}
	var origins []string
	testenv.Eventually(c.t, "status.resolved[].originNodes of fan", 30*time.Second, func() error {
		m := getMC(c.t, c.dyn, "fan")
		if m == nil || len(m.Status.Resolved) == 0 || len(m.Status.Resolved[0].OriginNodes) == 0 {
			return fmt.Errorf("no origin nodes yet: %+v", m)
		}
		origins = m.Status.Resolved[0].OriginNodes
		return nil
	})
	return origins
}

func (c *fanCluster) waitReady(nodes []*node) {
	for _, n := range nodes {
		testenv.Eventually(c.t, n.name+": fan Ready", 90*time.Second, func() error {
			if p := phaseOf(n, "fan"); p != api.PhaseReady {
				a, err := n.c.Get(context.Background(), "fan")
				return fmt.Errorf("phase %q: %+v %v", p, a, err)
			}
			return nil
		})
	}
}

// sentOnce fails unless the origin sent the shards once and the small
// file once per node.
func (c *fanCluster) sentOnce(nodes int) {
	c.t.Helper()
	if got, want := c.hub.Sent.Load(), c.lfs+int64(nodes)*c.small; got != want {
		c.t.Fatalf("origin sent %d bytes, want %d: the shards once (--origin-concurrency 1), the small file on each of %d nodes", got, want, nodes)
	}
}

// waitsFor waits until n's pull of fan waits for a peer, naming origin
// as the node that fetches it from the origin first.
func (c *fanCluster) waitsFor(n *node, origin string) {
	testenv.Eventually(c.t, n.name+" waits for "+origin, 30*time.Second, func() error {
		a, err := n.c.Get(context.Background(), "fan")
		if err != nil {
			return err
		}
		if !strings.Contains(a.Message, "waiting for a peer") || !strings.Contains(a.Message, ": "+origin+" fetch it from the origin first") {
			return fmt.Errorf("phase %s, message %q", a.Phase, a.Message)
		}
		return nil
	})
}

// rankedFirst is a node name that Rendezvous ranks first for fan among
// itself and others.
func rankedFirst(t *testing.T, others ...string) string {
	for i := range 100 {
		n := "node-x" + strconv.Itoa(i)
		if k8ssync.Rendezvous("fan", append([]string{n}, others...))[0] == n {
			return n
		}
	}
	t.Fatal("no name ranks first")
	return ""
}

// TestPeerFanOutStatus: three daemons against a real kube-apiserver, each
// with a peer port. One ModelCache selects all three at once with
// --origin-concurrency 1: the elected daemon records one origin node with
// the resolution, each node's status carries its peer address, every
// node ends Ready, and the origin sends the model's shards once, to the
// recorded node, not three times.
func TestPeerFanOutStatus(t *testing.T) {
	c := newFanCluster(t)
	ctx := context.Background()
	names := []string{"node-a", "node-b", "node-c"}
	nodes := c.startAll(names...)
	origins := c.createFan()
	if len(origins) != 1 || !slices.Contains(names, origins[0]) {
		t.Fatalf("origin nodes %v: want one of %v (--origin-concurrency 1)", origins, names)
	}
	c.waitReady(nodes)
	// The statuses say where each node's bytes came from, and the
	// ModelCache's version status counts one node that fetched from the
	// origin (--origin-concurrency 1): the recorded one.
	var statuses []k8ssync.ModelCacheNode
	testenv.Eventually(t, "each node's status says where its bytes came from", 30*time.Second, func() error {
		statuses = statuses[:0]
		for _, name := range names {
			st, err := nodeStatus(c.dyn, name)
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
	for _, st := range statuses {
		if a := artifactOn(&st, "fan"); (a.OriginBytes >= c.lfs) != (st.Name == origins[0]) {
			t.Fatalf("%s took %d bytes from the origin; the recorded origin node is %s", st.Name, a.OriginBytes, origins[0])
		}
	}
	fan := &k8ssync.ModelCache{ObjectMeta: metav1.ObjectMeta{Name: "fan"}, Spec: k8ssync.ModelCacheSpec{Source: "hf://org/fan"}}
	if v := k8ssync.Aggregate(fan, statuses, time.Now()).Versions[0]; v.FromOrigin != 1 || v.PeerBytes < 2*c.lfs {
		t.Fatalf("version status %+v: want fromOrigin 1 and the shards from peers on the other two nodes", v)
	}
	c.sentOnce(3)
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
	if fromPeers != 2*c.lfs {
		t.Fatalf("%d bytes came from peers, want %d: two nodes' shards", fromPeers, 2*c.lfs)
	}
}

// TestPeerFanOutLateNode: a selected node whose daemon starts after the
// resolution, while the origin node is still fetching, is not an origin
// node, although it ranks first among the nodes that want the model: it
// waits for its peers, and the origin sends the shards once. (Ranking
// the nodes whose statuses it has seen, it would go to the origin too.)
func TestPeerFanOutLateNode(t *testing.T) {
	c := newFanCluster(t)
	names := []string{"node-a", "node-b", "node-c"}
	late := rankedFirst(t, names...)
	nodes := c.startAll(names...)
	c.addNode(late)
	release := make(chan struct{})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // before the hub closes, should the test fail first
	var asked atomic.Int64
	c.hub.Hook = func(w http.ResponseWriter, r *http.Request) bool {
		if !strings.HasPrefix(r.URL.Path, "/lfs/") {
			return false
		}
		asked.Add(1)
		<-release // the origin node's shards are held until the late node waits
		return r.Context().Err() != nil
	}
	origins := c.createFan()
	if len(origins) != 1 || !slices.Contains(names, origins[0]) {
		t.Fatalf("origin nodes %v: want one of %v, not %s (no daemon yet)", origins, names, late)
	}
	testenv.Eventually(t, "the origin node asks the origin for a shard", 30*time.Second, func() error {
		if asked.Load() == 0 {
			return errors.New("no shard asked for yet")
		}
		return nil
	})
	ln := c.start(late)
	c.waitsFor(ln, origins[0])
	free()
	c.waitReady(append(nodes, ln))
	c.sentOnce(4)
}

// TestPeerFanOutDeadOriginNode: the recorded origin node never pulls the
// model (a ModelCacheNode live at the resolution, its peer port answering
// 404): the other nodes wait for it. Then its daemon goes, while its
// status still looks fresh (statuses are written hourly at least): its
// peer port takes no connection, the waiting nodes pass it over, and one
// of them fetches the shards from the origin, once, long before
// --peer-wait.
func TestPeerFanOutDeadOriginNode(t *testing.T) {
	c := newFanCluster(t)
	ctx := context.Background()
	names := []string{"node-a", "node-b", "node-c"}
	dead := rankedFirst(t, names...)
	nodes := c.startAll(names...)
	c.addNode(dead)
	port := httptest.NewServer(http.NotFoundHandler()) // a peer port that never holds a blob
	defer port.Close()
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": k8ssync.Group + "/" + k8ssync.Version, "kind": "ModelCacheNode",
		"metadata": map[string]any{"name": dead}}}
	if _, err := c.dyn.Resource(k8ssync.ModelCacheNodeGVR).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	heartbeat := func(at time.Time) {
		patch := fmt.Sprintf(`{"status":{"heartbeat":%q,"peerAddress":%q,"capacityBytes":0,"usedBytes":0,"reservedBytes":0,"freeBytes":0}}`,
			at.UTC().Format(time.RFC3339), port.URL)
		if _, err := c.dyn.Resource(k8ssync.ModelCacheNodeGVR).Patch(ctx, dead, types.MergePatchType, []byte(patch), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
	}
	heartbeat(time.Now())
	testenv.Eventually(t, "the aggregator sees "+dead+" live", 30*time.Second, func() error {
		st, err := nodeStatus(c.dyn, dead)
		if err != nil || st.Status.PeerAddress == "" {
			return fmt.Errorf("%+v %v", st, err)
		}
		return nil
	})
	origins := c.createFan()
	if !slices.Equal(origins, []string{dead}) {
		t.Fatalf("origin nodes %v, want [%s]: live at the resolution, it ranks first", origins, dead)
	}
	for _, n := range nodes {
		c.waitsFor(n, dead)
	}
	port.Close() // its daemon is gone; its status is as fresh as before
	c.waitReady(nodes)
	c.sentOnce(3)
}
