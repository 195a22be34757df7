package fanout

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore/storetest"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
	"github.com/modelcache/modelcache/internal/kubetest"
	"github.com/modelcache/modelcache/k8ssync"
)

// The daemons' namespace and service account (the peer tokens' subject),
// the port each serves peers on (its namespace's address), and the
// label that puts a run's nodes under its ModelCache.
const (
	Namespace      = "modelcache-system"
	ServiceAccount = "modelcached"
	PeerPort       = 7435
	runLabel       = "fanout.modelcache.io/run"
	repo           = "org/fan"
)

// Options shape a Harness. Zero values take the defaults named.
type Options struct {
	// ModelBytes is the model's size, in 4 shards (and a config.json
	// every node fetches from the origin: a small file has no digest to
	// ask peers for). Default 16 MiB.
	ModelBytes int64
	// OriginRate is the origin's bytes per second over all its responses
	// together (hubtest's Limit); 0: unpaced.
	OriginRate int64
	// StatusInterval is the daemons' --status-interval; 0: their default.
	StatusInterval time.Duration
	// Binary is modelcached's path; "": built from this module.
	Binary string
	// Flags are more flags for every daemon.
	Flags []string
	// LogDir keeps the daemons' logs, <node>.log; "": a temp dir removed
	// at cleanup (a failure shows a log's tail either way).
	LogDir string
}

// Harness is one cluster's world: a real kube-apiserver reached through
// a forwarder on the bridge, a throttled hub origin on the bridge, and a
// modelcached binary to run in namespaces off the bridge.
type Harness struct {
	opt     Options
	net     *Net
	bin     string
	dir     string
	kubecfg string // the daemons' kubeconfig: the forwarder on the bridge
	token   string // the daemons' peer token file
	kc      kubernetes.Interface
	dyn     dynamic.Interface
	hub     *hubtest.Hub
	rev     string
	size    int64 // the model's bytes, config.json included

	mu   sync.Mutex
	t0   time.Time   // the current run's ModelCache creation
	gets []OriginGet // the current run's
}

// OriginGet is one GET of a shard (an LFS file) the origin answered.
type OriginGet struct {
	At    time.Duration // from the ModelCache's creation
	From  string        // the client: its node's name, or its address
	Path  string
	Range string // the Range header, if any
}

// Start builds (or takes) modelcached, starts the API server, the bridge,
// the forwarder and the origin, and stops them all at cleanup.
func Start(t testing.TB, opt Options) *Harness {
	t.Helper()
	if opt.ModelBytes <= 0 {
		opt.ModelBytes = 16 << 20
	}
	h := &Harness{opt: opt, dir: t.TempDir()}
	if h.opt.LogDir == "" {
		h.opt.LogDir = h.dir
	} else if err := os.MkdirAll(h.opt.LogDir, 0o755); err != nil {
		t.Fatal(err)
	}
	h.net = NewNet(t)
	built := make(chan error, 1)
	h.bin = opt.Binary
	if h.bin == "" {
		h.bin = filepath.Join(h.dir, "modelcached")
		go func() {
			out, err := exec.Command("go", "build", "-o", h.bin, "github.com/modelcache/modelcache/cmd/modelcached").CombinedOutput()
			if err != nil {
				err = fmt.Errorf("go build modelcached: %v\n%s", err, out)
			}
			built <- err
		}()
	} else if fi, err := os.Stat(h.bin); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		t.Fatalf("modelcached %q (FANOUT_MODELCACHED): not an executable file (make build writes bin/modelcached; unset it to build one here)", h.bin)
	} else {
		built <- nil
	}
	cl := kubetest.Start(t)
	_, cfg := cl.ProxyOn(t, h.net.Host.String())
	h.kc, h.dyn = kubernetes.NewForConfigOrDie(cl.Config), dynamic.NewForConfigOrDie(cl.Config)
	h.kubecfg = filepath.Join(h.dir, "kubeconfig")
	if err := writeKubeconfig(cfg, h.kubecfg); err != nil {
		t.Fatal(err)
	}
	h.token = filepath.Join(h.dir, "peer-token")
	if err := h.serviceAccount(h.token); err != nil {
		t.Fatal(err)
	}

	hub, err := hubtest.NewOn(h.net.Host.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hub.Close)
	if opt.OriginRate > 0 {
		hub.Limit = rate.NewLimiter(rate.Limit(opt.OriginRate), 256<<10)
	}
	files := map[string][]byte{"config.json": []byte(`{"model_type":"llama"}`)}
	h.size = int64(len(files["config.json"]))
	for i := range 4 {
		f := storetest.Data(int(opt.ModelBytes/4)+i, byte(20+i))
		files[fmt.Sprintf("model-%05d-of-00004.safetensors", i+1)] = f
		h.size += int64(len(f))
	}
	h.rev = hub.Commit(repo, files, "main")
	hub.Hook = func(_ http.ResponseWriter, r *http.Request) bool { // records, answers nothing
		if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/lfs/") {
			h.mu.Lock()
			h.gets = append(h.gets, OriginGet{At: time.Since(h.t0), From: r.RemoteAddr, Path: r.URL.Path, Range: r.Header.Get("Range")})
			h.mu.Unlock()
		}
		return false
	}
	h.hub = hub
	if err := <-built; err != nil {
		t.Fatal(err)
	}
	return h
}

// ModelBytes is the model's size, config.json included.
func (h *Harness) ModelBytes() int64 { return h.size }

// serviceAccount makes the daemons' namespace and service account and
// writes a token of it for the audience modelcache-peer to path.
func (h *Harness) serviceAccount(path string) error {
	ctx := context.Background()
	if _, err := h.kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, err := h.kc.CoreV1().ServiceAccounts(Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: ServiceAccount}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	tr, err := h.kc.CoreV1().ServiceAccounts(Namespace).CreateToken(ctx, ServiceAccount,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"modelcache-peer"}}}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	return os.WriteFile(path, []byte(tr.Status.Token), 0o600)
}

// writeKubeconfig writes cfg (a forwarder's: its own host, the server's
// name for TLS) as a kubeconfig file.
func writeKubeconfig(cfg *rest.Config, path string) error {
	kc := clientcmdapi.NewConfig()
	kc.Clusters["fanout"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData, TLSServerName: cfg.ServerName}
	kc.AuthInfos["fanout"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["fanout"] = &clientcmdapi.Context{Cluster: "fanout", AuthInfo: "fanout"}
	kc.CurrentContext = "fanout"
	return clientcmd.WriteToFile(*kc, path)
}

// Node is one daemon of a run, as it ended.
type Node struct {
	Name        string
	Addr        netip.Addr    // its namespace's address
	Started     time.Duration // from the ModelCache's creation until its pull began (as the daemon reports it)
	Flowing     time.Duration // … until it held 1 MiB of the model (sampled as Ready is)
	Ready       time.Duration // … until it was Ready
	PeerAddress string        // its ModelCacheNode status's, "" without a peer port
	FromPeers   int64         // bytes its pull took from peers
}

// Result is one run: N daemons, one ModelCache selecting them all.
type Result struct {
	AllReady    time.Duration // from the ModelCache's creation until every node is Ready
	OriginDone  time.Duration // from the creation until the origin's last byte (sampled every 50ms)
	OriginBytes int64         // file bytes the origin sent
	OriginGets  []OriginGet
	ModelBytes  int64
	Nodes       []Node
}

// Alone is the baseline: one daemon without a peer port fetches the
// model from the origin, given it by a ModelCache as the fleet is.
func (h *Harness) Alone(t testing.TB) Result {
	t.Helper()
	return h.run(t, "alone", 1, false)
}

// FanOut runs n daemons with peer ports (in the daemons' default
// settings but Options.Flags) given one ModelCache at once.
func (h *Harness) FanOut(t testing.TB, n int) Result {
	t.Helper()
	return h.run(t, "fan"+strconv.Itoa(n), n, true)
}

// run starts n daemons in namespaces of their own as nodes tag-<i>, waits
// until each has written its status, creates the ModelCache tag
// selecting them and times it until every node holds the model Ready.
// It stops the daemons and deletes the run's objects and roots before it
// returns, so that runs of one Harness share nothing but the origin.
func (h *Harness) run(t testing.TB, tag string, n int, peers bool) Result {
	t.Helper()
	ctx := context.Background()
	var ds []*daemonProc
	stop := sync.OnceFunc(func() {
		var wg sync.WaitGroup
		for _, d := range ds {
			wg.Add(1)
			go func() { defer wg.Done(); d.stop() }()
		}
		wg.Wait()
		h.dyn.Resource(k8ssync.ModelCacheGVR).Delete(ctx, tag, metav1.DeleteOptions{})
		for _, d := range ds {
			h.kc.CoreV1().Nodes().Delete(ctx, d.name, metav1.DeleteOptions{})
			h.dyn.Resource(k8ssync.ModelCacheNodeGVR).Delete(ctx, d.name, metav1.DeleteOptions{})
			os.RemoveAll(d.dir)
		}
	})
	t.Cleanup(stop)
	defer stop()
	h.startNodes(t, tag, n, peers, &ds)

	h.hub.Sent.Store(0)
	h.mu.Lock()
	h.gets, h.t0 = nil, time.Now()
	t0 := h.t0
	h.mu.Unlock()
	mc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "modelcache.io/v1alpha1", "kind": "ModelCache",
		"metadata": map[string]any{"name": tag},
		"spec": map[string]any{"source": "hf://" + repo + "@" + h.rev,
			"nodeSelector": map[string]any{"matchLabels": map[string]any{runLabel: tag}}},
	}}
	if _, err := h.dyn.Resource(k8ssync.ModelCacheGVR).Create(ctx, mc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	originDone := h.watchOrigin(t0)
	res := Result{ModelBytes: h.size, Nodes: make([]Node, n)}
	errs := h.awaitReady(ctx, ds, tag, t0, res.Nodes)
	res.AllReady = time.Since(t0)
	res.OriginDone = originDone()
	res.OriginBytes = h.hub.Sent.Load()
	h.mu.Lock()
	res.OriginGets = append([]OriginGet(nil), h.gets...)
	h.mu.Unlock()
	for i, g := range res.OriginGets {
		for _, d := range ds {
			if host, _, _ := net.SplitHostPort(g.From); host == d.addr.String() {
				res.OriginGets[i].From = d.name
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for i, d := range ds {
		st, err := h.nodeStatus(d.name)
		if err != nil {
			t.Fatal(err)
		}
		res.Nodes[i].PeerAddress = st.Status.PeerAddress
	}
	return res
}

func (h *Harness) nodeStatus(name string) (*k8ssync.ModelCacheNode, error) {
	u, err := h.dyn.Resource(k8ssync.ModelCacheNodeGVR).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var m k8ssync.ModelCacheNode
	return &m, runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &m)
}

// startNodes creates n Nodes tag-<i>, starts a daemon for each in a
// namespace of its own (appended to *ds as it starts, for the caller's
// clean-up) and waits until each has written its status (with its peer
// address when peers).
func (h *Harness) startNodes(t testing.TB, tag string, n int, peers bool, ds *[]*daemonProc) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		name := fmt.Sprintf("%s-%d", tag, i)
		if _, err := h.kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{runLabel: tag}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		ns, addr := h.net.Add(t)
		d, err := h.start(name, ns, addr, peers)
		if err != nil {
			t.Fatal(err)
		}
		*ds = append(*ds, d)
	}
	for _, d := range *ds {
		if err := d.await(ctx, d.name+"'s status", time.Minute, func() error {
			st, err := h.nodeStatus(d.name)
			if err != nil {
				return err
			}
			if peers && st.Status.PeerAddress == "" {
				return errors.New("no peerAddress yet")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}

}

// watchOrigin samples the bytes the origin sent from t0 on; the function
// it returns stops the sampling and says when the origin sent its last
// byte (since t0).
func (h *Harness) watchOrigin(t0 time.Time) func() time.Duration {
	var originDone atomic.Int64
	sampled := make(chan struct{})
	quit := make(chan struct{})
	go func() { // the time of the origin's last byte
		defer close(sampled)
		last := int64(0)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
				if s := h.hub.Sent.Load(); s != last {
					last = s
					originDone.Store(int64(time.Since(t0)))
				}
			}
		}
	}()
	return func() time.Duration {
		close(quit)
		<-sampled
		return time.Duration(originDone.Load())
	}
}

// awaitReady waits until every daemon of ds holds tag Ready, recording
// each one's timeline in nodes (since t0); one daemon's failure ends the
// others' waits. It returns each daemon's error.
func (h *Harness) awaitReady(ctx context.Context, ds []*daemonProc, tag string, t0 time.Time, nodes []Node) []error {
	n := len(ds)
	waitCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i, d := range ds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = d.await(waitCtx, d.name+": "+tag+" Ready", 30*time.Minute, func() error {
				a, err := d.client.Get(ctx, tag)
				if err != nil {
					return err
				}
				nd := &nodes[i]
				if p := a.Progress; p != nil {
					if nd.Started == 0 && !p.Started.IsZero() {
						nd.Started = p.Started.Sub(t0)
					}
					if nd.Flowing == 0 && p.BytesDone >= 1<<20 {
						nd.Flowing = time.Since(t0)
					}
				}
				switch a.Phase {
				case api.PhaseReady:
				case api.PhaseFailed: // its retry would be timed too: the run is void
					return failed{fmt.Errorf("phase %s: %s", a.Phase, a.Message)}
				default:
					return fmt.Errorf("phase %s %s", a.Phase, a.Message)
				}
				nd.Name, nd.Addr, nd.Ready = d.name, d.addr, time.Since(t0)
				if nd.Flowing == 0 {
					nd.Flowing = nd.Ready
				}
				if a.LastPull != nil {
					nd.FromPeers = a.LastPull.BytesFromPeers
				}
				return nil
			})
			if errs[i] != nil {
				cancel() // one daemon failed: the run has
			}
		}()
	}
	wg.Wait()
	return errs
}
