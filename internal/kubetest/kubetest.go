// Package kubetest starts a real kube-apiserver and etcd for the tests,
// through controller-runtime's envtest, from binaries built by
// test/k8s/build-control-plane.sh (KUBEBUILDER_ASSETS, or
// $(go env GOPATH)/k8s-control-plane). It never downloads anything.
package kubetest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/modelcache/modelcache/internal/testenv"
)

// Cluster is a running API server with the CRDs of deploy/crds.
type Cluster struct {
	Env    *envtest.Environment
	Config *rest.Config
}

// Assets is the directory with kube-apiserver and etcd, or "".
func Assets() string {
	dirs := []string{os.Getenv("KUBEBUILDER_ASSETS")}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		dirs = append(dirs, filepath.Join(strings.TrimSpace(string(out)), "k8s-control-plane"))
	}
	dirs = append(dirs, "/usr/local/kubebuilder/bin")
	for _, d := range dirs {
		if d == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "kube-apiserver")); err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, "etcd")); err == nil {
			return d
		}
	}
	return ""
}

// Start starts the control plane with the CRDs installed and stops it at
// cleanup. Without the binaries it fails under CI=true and skips elsewhere.
func Start(t testing.TB) *Cluster {
	t.Helper()
	dir := Assets()
	if dir == "" {
		testenv.Missing(t, "kube-apiserver and etcd", "run test/k8s/build-control-plane.sh, as .ci/run does")
	}
	_, file, _, _ := runtime.Caller(0)
	crds := filepath.Join(filepath.Dir(file), "..", "..", "deploy", "crds")
	env := &envtest.Environment{
		BinaryAssetsDirectory: dir,
		CRDDirectoryPaths:     []string{crds},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("envtest: %v", err)
	}
	t.Cleanup(func() { env.Stop() })
	return &Cluster{Env: env, Config: cfg}
}

// Proxy is a TCP forwarder in front of the API server: the clients of a
// test talk through it, and Down cuts them off (open connections dropped,
// new ones refused) as a dead or unreachable API server would; Up brings
// it back on the same address.
type Proxy struct {
	target string
	addr   string
	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]bool
}

// Proxy starts a forwarder on loopback and returns a rest.Config that
// uses it.
func (c *Cluster) Proxy(t testing.TB) (*Proxy, *rest.Config) {
	t.Helper()
	return c.ProxyOn(t, "127.0.0.1")
}

// ProxyOn is Proxy listening on ip: an address of a bridge lets clients
// in other network namespaces reach the API server, which listens on
// loopback only. The rest.Config still checks the server's certificate
// for its own host name.
func (c *Cluster) ProxyOn(t testing.TB, ip string) (*Proxy, *rest.Config) {
	t.Helper()
	u, err := url.Parse(c.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{target: u.Host, addr: net.JoinHostPort(ip, "0"), conns: map[net.Conn]bool{}}
	if err := p.Up(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Down)
	cfg := rest.CopyConfig(c.Config)
	cfg.Host = "https://" + p.addr
	cfg.TLSClientConfig.ServerName = u.Hostname()
	return p, cfg
}

// Up listens (again) on the proxy's address.
func (p *Proxy) Up() error {
	addr := p.addr
	var ln net.Listener
	err := testenv.Poll(5*time.Second, func() (err error) { // the old socket may linger a moment
		ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.ln, p.addr = ln, ln.Addr().String()
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.forward(c)
		}
	}()
	return nil
}

func (p *Proxy) forward(c net.Conn) {
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[up] = true, true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { io.Copy(up, c); done <- struct{}{} }()
	go func() { io.Copy(c, up); done <- struct{}{} }()
	<-done
	c.Close()
	up.Close()
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, up)
	p.mu.Unlock()
}

// Down stops listening and drops every open connection.
func (p *Proxy) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
}

// APIMetrics reads the API server's counters of what the fleet cost it:
// writes (every verb but reads) and watch events sent, for ModelCacheNodes
// and ModelCaches, and the bytes of those events.
func APIMetrics(ctx context.Context, kc kubernetes.Interface) (map[string]float64, error) {
	raw, err := kc.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		name := line[:i]
		for _, res := range []string{"modelcachenodes", "modelcaches"} {
			if !strings.Contains(name, `resource="`+res+`"`) {
				continue
			}
			switch {
			case strings.HasPrefix(name, "apiserver_request_total{"):
				verb := name[strings.Index(name, `verb="`)+6:]
				verb = verb[:strings.IndexByte(verb, '"')]
				if !slices.Contains([]string{"GET", "LIST", "WATCH"}, verb) {
					out[res+" writes"] += v
				}
			case strings.HasPrefix(name, "apiserver_watch_events_total{"):
				out[res+" events"] += v
			case strings.HasPrefix(name, "apiserver_watch_events_sizes_sum{"):
				out[res+" event bytes"] += v
			}
		}
	}
	return out, sc.Err()
}

// FleetSizes is the fleet sizes of the fleet benchmarks: FLEET_BENCH_NODES
// (comma-separated), or 10, 100 and 1,000.
func FleetSizes(tb testing.TB) []int {
	s := os.Getenv("FLEET_BENCH_NODES")
	if s == "" {
		return []int{10, 100, 1000}
	}
	var sizes []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 65000 {
			tb.Fatalf("FLEET_BENCH_NODES=%q: want sizes like 10,100,1000", s)
		}
		sizes = append(sizes, n)
	}
	return sizes
}

// FleetUp waits until nodes ModelCacheNodes exist (every agent wrote its
// status once) and one agent holds the aggregator's Lease in namespace
// modelcache-system, then 15 s more for the writes of the start to
// settle.
func FleetUp(ctx context.Context, tb testing.TB, cfg *rest.Config, nodes int) {
	tb.Helper()
	kc, dyn := kubernetes.NewForConfigOrDie(cfg), dynamic.NewForConfigOrDie(cfg)
	mcn := schema.GroupVersionResource{Group: "modelcache.io", Version: "v1alpha1", Resource: "modelcachenodes"}
	testenv.Eventually(tb, "every node's ModelCacheNode and the aggregator's Lease", 20*time.Minute, func() error {
		l, err := dyn.Resource(mcn).List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return err
		}
		if len(l.Items) < nodes {
			return fmt.Errorf("%d of %d ModelCacheNodes", len(l.Items), nodes)
		}
		_, err = kc.CoordinationV1().Leases("modelcache-system").Get(ctx, "modelcache-aggregator", metav1.GetOptions{})
		return err
	})
	time.Sleep(15 * time.Second)
}
