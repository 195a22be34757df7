// Package node is the real-node end-to-end test: test/node/up.sh brings up
// a one-node Kubernetes (control plane from test/k8s/build-control-plane.sh,
// containerd, runc and the CNI bridge from Debian, kubelet), the shipped
// DaemonSet bundle runs on it with the image of make image, pods consume a
// ModelCache, and test/node/down.sh leaves nothing behind.
package node

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const (
	image   = "ghcr.io/modelcache/modelcached:node-test"
	nodeDir = "/tmp/modelcache-node-test"
)

// need skips (or, under CI=true, fails) when the node cannot come up here.
func need(t *testing.T) string {
	t.Helper()
	miss := func(why string) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("real-node test: %s (.ci/run installs it)", why)
		}
		t.Skipf("real-node test: %s", why)
	}
	if testing.Short() {
		t.Skip("real-node test: -short")
	}
	if os.Geteuid() != 0 {
		miss("needs root")
	}
	out, _ := exec.Command("go", "env", "GOPATH").Output()
	bin := filepath.Join(strings.TrimSpace(string(out)), "k8s-control-plane")
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			miss(b + " not built (test/k8s/build-control-plane.sh)")
		}
	}
	for _, b := range []string{"containerd", "runc", "ctr", "iptables", "/usr/lib/cni/bridge"} {
		if _, err := exec.LookPath(b); err != nil {
			miss(b + " missing (apt-get install containerd runc containernetworking-plugins iptables)")
		}
	}
	return bin
}

func TestRealNode(t *testing.T) {
	bin := need(t)
	root, _ := filepath.Abs("../..")
	env := append(os.Environ(), "NODE_DIR="+nodeDir)
	sh := func(name string, args ...string) string {
		t.Helper()
		c := exec.Command(name, args...)
		c.Dir, c.Env = root, env
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	kubectl := func(stdin string, args ...string) (string, error) {
		c := exec.Command(filepath.Join(bin, "kubectl"), append([]string{"--kubeconfig", nodeDir + "/kubeconfig"}, args...)...)
		c.Stdin = strings.NewReader(stdin)
		out, err := c.CombinedOutput()
		return string(out), err
	}
	// The bundle's hostPaths are the host's: remove them afterwards if this
	// test made them.
	for _, p := range []string{"/var/lib/modelcache", "/run/modelcached"} {
		if _, err := os.Stat(p); os.IsNotExist(err) {
			t.Cleanup(func() { os.RemoveAll(p) })
		}
	}
	start := time.Now()
	tar := filepath.Join(t.TempDir(), "image.tar")
	sh("make", "image", "IMAGE="+image, "IMAGE_TAR="+tar)
	t.Cleanup(func() {
		d := time.Now()
		sh("test/node/down.sh")
		t.Logf("down: %v", time.Since(d).Round(time.Millisecond))
		assertClean(t)
	})
	sh("test/node/up.sh", tar, image)
	t.Logf("image + node up: %v", time.Since(start).Round(time.Millisecond))

	// The bundle, unchanged but for the image.
	y, err := kubectl("", "kustomize", filepath.Join(root, "deploy/daemonset"))
	if err != nil {
		t.Fatal(y)
	}
	y = strings.ReplaceAll(y, "image: ghcr.io/modelcache/modelcached:latest", "image: "+image)
	if out, err := kubectl(y, "apply", "--server-side", "-f", "-"); err != nil {
		t.Fatal(out)
	}
	if out, err := kubectl("", "-n", "modelcache-system", "rollout", "status", "ds/modelcached", "--timeout", "90s"); err != nil {
		t.Fatal(out)
	}

	// A source on the host's address, which pods and the daemon reach.
	hostIP, _ := os.ReadFile(nodeDir + "/hostip")
	ln, err := net.Listen("tcp", strings.TrimSpace(string(hostIP))+":0")
	if err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 3<<20)
	rand.Read(data)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "w.bin", time.Time{}, bytes.NewReader(data))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	manifest := fmt.Sprintf(`apiVersion: modelcache.io/v1alpha1
kind: ModelCache
metadata: {name: tiny}
spec:
  source: http://%s/w.bin
  nodeSelector: {matchLabels: {nvidia.com/gpu.present: "true"}}
  state: Present
---
apiVersion: v1
kind: Pod
metadata: {name: holder, namespace: default}
spec:
  initContainers:
    - name: wait
      image: %s
      command: [/usr/bin/modelctl, --socket, /run/modelcached/modelcached.sock, wait, tiny, --timeout, 2m]
      volumeMounts: [{name: socket, mountPath: /run/modelcached, readOnly: true}]
  containers:
    - {name: reader, image: "registry.k8s.io/pause:node-test", volumeMounts: [{name: model, mountPath: /model, readOnly: true}]}
  volumes:
    - {name: model, hostPath: {path: /var/lib/modelcache/models/tiny, type: Directory}}
    - {name: socket, hostPath: {path: /run/modelcached, type: Directory}}
`, ln.Addr(), image)
	t0 := time.Now()
	if out, err := kubectl(manifest, "apply", "-f", "-"); err != nil {
		t.Fatal(out)
	}
	if out, err := kubectl("", "wait", "--for=condition=Ready", "pod/holder", "--timeout=120s"); err != nil {
		d, _ := kubectl("", "describe", "pod/holder")
		t.Fatalf("%s\n%s", out, d)
	}
	t.Logf("ModelCache + consumer applied -> consumer running: %v", time.Since(t0).Round(time.Millisecond))
	got, err := os.ReadFile("/var/lib/modelcache/models/tiny/current/w.bin")
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the model's bytes differ from the source's (%d of %d bytes, %v)", len(got), len(data), err)
	}
	// The daemon's own pod mounts the whole store and is no holder; the
	// consumer is, as "pod default/holder".
	eventually(t, "holder shown", 20*time.Second, func() error {
		out, err := kubectl("", "get", "modelcachenode", "-o", "jsonpath={.items[0].status.artifacts[0].inUseBy}")
		if err != nil || out != `["pod default/holder"]` {
			return fmt.Errorf("inUseBy %s %v", out, err)
		}
		return nil
	})
	// Absent keeps the model while the pod runs and evicts it once it is gone.
	if out, err := kubectl("", "patch", "modelcache", "tiny", "--type", "merge", "-p", `{"spec":{"state":"Absent"}}`); err != nil {
		t.Fatal(out)
	}
	time.Sleep(3 * time.Second)
	if _, err := os.Stat("/var/lib/modelcache/models/tiny/current/w.bin"); err != nil {
		t.Fatalf("Absent evicted a model a running pod mounts: %v", err)
	}
	if out, err := kubectl("", "delete", "pod", "holder", "--wait"); err != nil {
		t.Fatal(out)
	}
	eventually(t, "evicted once the pod is gone", 30*time.Second, func() error {
		if _, err := os.Stat("/var/lib/modelcache/models/tiny"); !os.IsNotExist(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
	kubectl("", "delete", "modelcache", "tiny")
}

func eventually(t *testing.T, what string, d time.Duration, f func() error) {
	t.Helper()
	var err error
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		if err = f(); err == nil {
			return
		}
	}
	t.Fatalf("%s: %v", what, err)
}

// assertClean checks what down.sh promises: no mounts, processes, netns,
// iptables rules or bridge of the node left.
func assertClean(t *testing.T) {
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), nodeDir) {
		t.Errorf("mounts left under %s", nodeDir)
	}
	if strings.Contains(string(mi), " /var/lib/kubelet/") {
		t.Errorf("mounts left under /var/lib/kubelet (pod volumes, CSI publishes)")
	}
	if out, _ := exec.Command("pgrep", "-af", nodeDir).Output(); len(out) > 0 {
		t.Errorf("processes left:\n%s", out)
	}
	if out, _ := exec.Command("iptables", "-t", "nat", "-S").Output(); strings.Contains(string(out), "modelcache-node") {
		t.Errorf("iptables rules left")
	}
	if err := exec.Command("ip", "link", "show", "mcnode0").Run(); err == nil {
		t.Errorf("bridge mcnode0 left")
	}
	if _, err := os.Stat(nodeDir); !os.IsNotExist(err) {
		t.Errorf("%s left", nodeDir)
	}
}
