// Package node is the real-node end-to-end test: test/node/up.sh brings up
// a one-node Kubernetes (control plane from test/k8s/build-control-plane.sh,
// containerd, runc and the CNI bridge from Debian, kubelet), the shipped
// DaemonSet bundle runs on it with the image of make image and a store
// quota (test/node/overlay), pods consume ModelCaches through hostPath, a
// local PV and the CSI driver, and test/node/down.sh leaves nothing behind.
package node

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcache/modelcache/internal/testenv"
)

const (
	image   = "ghcr.io/modelcache/modelcached:node-test"
	nodeDir = "/tmp/modelcache-node-test"
	store   = "/var/lib/modelcache"
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

// TestRealNode brings the node up once and runs the scenarios on it in
// order; each leaves the node as the next expects (the hostPath consumer
// "holder" of the model "tiny" runs from the first to the last).
func TestRealNode(t *testing.T) {
	bin := need(t)
	root, _ := filepath.Abs("../..")
	sh := func(name string, args ...string) string {
		t.Helper()
		c := exec.Command(name, args...)
		c.Dir, c.Env = root, append(os.Environ(), "NODE_DIR="+nodeDir)
		out, err := c.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	// The bundle's hostPaths are the host's: remove them afterwards if this
	// test made them.
	for _, p := range []string{store, "/run/modelcached"} {
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

	n := &node{t: t, kubectlBin: filepath.Join(bin, "kubectl")}
	// The bundle as an operator applies it with a quota: unchanged but for
	// the image tag and two args (test/node/overlay).
	n.must("", "apply", "--server-side", "-k", filepath.Join(root, "test/node/overlay"))
	n.must("", "-n", "modelcache-system", "rollout", "status", "ds/modelcached", "--timeout", "90s")
	// kubelet registered the daemon as the CSI driver.
	testenv.Eventually(t, "CSINode lists csi.modelcache.io", 30*time.Second, func() error {
		out, err := n.kubectl("", "get", "csinode", "modelcache-node", "-o", "jsonpath={.spec.drivers[*].name}")
		if err != nil || !strings.Contains(out, "csi.modelcache.io") {
			return fmt.Errorf("drivers %q %v", out, err)
		}
		return nil
	})

	hostIP, _ := os.ReadFile(nodeDir + "/hostip")
	n.origin = newOrigin(t, strings.TrimSpace(string(hostIP)))
	tiny := n.origin.add("/tiny/w.bin", 2<<20)

	t.Run("HostPath", func(t *testing.T) { n.t = t; n.hostPath(tiny) })
	t.Run("LocalPV", func(t *testing.T) { n.t = t; n.localPV(tiny) })
	t.Run("Quota", func(t *testing.T) { n.t = t; n.quota() })
	t.Run("CSI", func(t *testing.T) { n.t = t; n.csi(tiny) })
	t.Run("Tenancy", func(t *testing.T) { n.t = t; n.tenancy() })
	t.Run("Absent", func(t *testing.T) { n.t = t; n.absent() })
	n.t = t
	t.Logf("real-node stage: %v", time.Since(start).Round(time.Millisecond))
}

// node is the test's handle on the running node.
type node struct {
	t          *testing.T
	kubectlBin string
	origin     *origin
}

func (n *node) kubectl(stdin string, args ...string) (string, error) {
	c := exec.Command(n.kubectlBin, append([]string{"--kubeconfig", nodeDir + "/kubeconfig"}, args...)...)
	c.Stdin = strings.NewReader(stdin)
	out, err := c.CombinedOutput()
	return string(out), err
}

func (n *node) must(stdin string, args ...string) string {
	n.t.Helper()
	out, err := n.kubectl(stdin, args...)
	if err != nil {
		n.t.Fatalf("kubectl %v: %v\n%s", args, err, out)
	}
	return out
}

// modelctl runs modelctl in the daemon's pod, as an operator does.
func (n *node) modelctl(args ...string) (string, error) {
	return n.kubectl("", append([]string{"-n", "modelcache-system", "exec", "ds/modelcached", "--", "/usr/bin/modelctl", "--socket", "/run/modelcached/modelcached.sock"}, args...)...)
}

// waitReady waits for pods to be Ready; on a timeout it shows them.
func (n *node) waitReady(timeout string, pods ...string) {
	n.t.Helper()
	if out, err := n.kubectl("", append([]string{"wait", "--for=condition=Ready", "--timeout=" + timeout}, pods...)...); err != nil {
		d, _ := n.kubectl("", append([]string{"describe"}, pods...)...)
		n.t.Fatalf("%s\n%s", out, d)
	}
}

// artifacts is the node's ModelCacheNode status, by artifact name.
func (n *node) artifacts() (map[string]artifactStatus, error) {
	out, err := n.kubectl("", "get", "modelcachenode", "modelcache-node", "-o", "json")
	if err != nil {
		return nil, fmt.Errorf("%v: %s", err, out)
	}
	var mcn struct {
		Status struct{ Artifacts []artifactStatus } `json:"status"`
	}
	if err := json.Unmarshal([]byte(out), &mcn); err != nil {
		return nil, err
	}
	m := map[string]artifactStatus{}
	for _, a := range mcn.Status.Artifacts {
		m[a.Name] = a
	}
	return m, nil
}

type artifactStatus struct {
	Name, Phase, Revision, Message, Reason string
	InUseBy                                []string
}

// inUseBy waits until the node reports exactly these holders of model.
func (n *node) inUseBy(model string, want ...string) {
	n.t.Helper()
	slices.Sort(want)
	testenv.Eventually(n.t, model+" in use by "+strings.Join(want, ", "), 30*time.Second, func() error {
		arts, err := n.artifacts()
		if err != nil {
			return err
		}
		got := slices.Sorted(slices.Values(arts[model].InUseBy))
		if !slices.Equal(got, want) {
			return fmt.Errorf("inUseBy %q", got)
		}
		return nil
	})
}

// podFile reads a file in a running pod's container from the host, through
// /proc/<pid>/root (the images have no shell); the container's pid comes
// from containerd.
func (n *node) podFile(pod, path string) ([]byte, error) {
	root, err := n.podRoot(pod)
	if err != nil {
		return nil, err
	}
	return os.ReadFile(root + path)
}

// podRoot: pod is a name in default, or namespace/name.
func (n *node) podRoot(pod string) (string, error) {
	ns, name, ok := strings.Cut(pod, "/")
	if !ok {
		ns, name = "default", pod
	}
	id, err := n.kubectl("", "-n", ns, "get", "pod", name, "-o", "jsonpath={.status.containerStatuses[0].containerID}")
	if err != nil || !strings.HasPrefix(id, "containerd://") {
		return "", fmt.Errorf("pod %s: container %q %v", pod, id, err)
	}
	id = strings.TrimPrefix(id, "containerd://")
	out, err := exec.Command("ctr", "--address", nodeDir+"/containerd.sock", "-n", "k8s.io", "task", "ls").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("ctr task ls: %v: %s", err, out)
	}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == id {
			pid, err := strconv.Atoi(f[1])
			if err != nil {
				return "", err
			}
			return fmt.Sprintf("/proc/%d/root", pid), nil
		}
	}
	return "", fmt.Errorf("pod %s: no task %s in containerd", pod, id)
}

// samePodFile asserts a pod's file has exactly these bytes.
func (n *node) samePodFile(pod, path string, want []byte) {
	n.t.Helper()
	got, err := n.podFile(pod, path)
	if err != nil || !bytes.Equal(got, want) {
		n.t.Fatalf("pod %s reads %s: %d of %d bytes equal the source's (%v)", pod, path, commonPrefix(got, want), len(want), err)
	}
}

func commonPrefix(a, b []byte) int {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i
}

// readOnly asserts a pod cannot write into its model volume.
func (n *node) readOnly(pod, dir string) {
	n.t.Helper()
	root, err := n.podRoot(pod)
	if err != nil {
		n.t.Fatal(err)
	}
	err = os.WriteFile(root+dir+"/written-by-pod", []byte("x"), 0o644)
	if err == nil {
		os.Remove(root + dir + "/written-by-pod")
		n.t.Fatalf("pod %s wrote into its model volume %s", pod, dir)
	}
	if !strings.Contains(err.Error(), "read-only file system") {
		n.t.Fatalf("pod %s: a write into %s failed with %v, want a read-only file system", pod, dir, err)
	}
}

// getText asserts `kubectl get` prints a row for name that matches re.
func (n *node) getText(what, name, re string) {
	n.t.Helper()
	testenv.Eventually(n.t, fmt.Sprintf("kubectl get %s %s matches %q", what, name, re), 30*time.Second, func() error {
		out, err := n.kubectl("", "get", what, name, "-o", "wide")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		if !regexp.MustCompile(re).MatchString(out) {
			return fmt.Errorf("got\n%s", out)
		}
		return nil
	})
}

func modelCache(name, source string) string {
	return fmt.Sprintf(`apiVersion: modelcache.io/v1alpha1
kind: ModelCache
metadata: {name: %s}
spec:
  source: %s
  nodeSelector: {matchLabels: {nvidia.com/gpu.present: "true"}}
  state: Present
`, name, source)
}

// hostPath: a pod waits for the model with modelctl wait in an init
// container and reads it through a hostPath.
func (n *node) hostPath(tiny []byte) {
	t := n.t
	t0 := time.Now()
	n.must(modelCache("tiny", n.origin.url("/tiny/w.bin"))+"---\n"+fmt.Sprintf(`apiVersion: v1
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
`, image), "apply", "-f", "-")
	n.waitReady("120s", "pod/holder")
	t.Logf("ModelCache + hostPath consumer applied -> consumer running: %v", time.Since(t0).Round(time.Millisecond))
	n.samePodFile("holder", "/model/current/w.bin", tiny)
	// The init container said what it waited for.
	if out := n.must("", "logs", "holder", "-c", "wait"); !strings.Contains(out, "tiny: Ready at /var/lib/modelcache/models/tiny/current") {
		t.Errorf("modelctl wait's log: %q", out)
	}
	// The daemon's own pod mounts the whole store and is no holder; the
	// consumer is, as "pod default/holder".
	n.inUseBy("tiny", "pod default/holder")
	n.getText("modelcaches", "tiny", `tiny\s+http://\S+/tiny/w.bin\s+[0-9a-f]{64}\s+1/1\s+Complete\b.*\bPresent\b`)
	n.getText("modelcachenodes", "modelcache-node", `modelcache-node\s+1 Ready\s+\S+\s+2097152\s+\d+`)
}

// localPV: the daemon made a read-only local PV of the Ready model; a
// claim selects it by label and a pod reads the model through it. The pod
// asks for a writable volume: the PV's "ro" keeps the store read-only.
func (n *node) localPV(tiny []byte) {
	t := n.t
	testenv.Eventually(t, "the local PV of tiny", 30*time.Second, func() error {
		out, err := n.kubectl("", "get", "pv", "-l", "modelcache.io/model=tiny", "-o", "jsonpath={.items[*].spec.local.path} {.items[*].spec.mountOptions}")
		if err != nil || out != `/var/lib/modelcache/models/tiny/current ["ro"]` {
			return fmt.Errorf("%q %v", out, err)
		}
		return nil
	})
	t0 := time.Now()
	n.must(`apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: tiny, namespace: default}
spec:
  storageClassName: modelcache-local
  accessModes: [ReadOnlyMany]
  selector: {matchLabels: {modelcache.io/model: tiny}}
  resources: {requests: {storage: 1Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: pvc-reader, namespace: default}
spec:
  containers:
    - {name: reader, image: "registry.k8s.io/pause:node-test", volumeMounts: [{name: model, mountPath: /model}]}
  volumes:
    - {name: model, persistentVolumeClaim: {claimName: tiny}}
`, "apply", "-f", "-")
	n.waitReady("60s", "pod/pvc-reader")
	t.Logf("PVC + consumer applied, model cached -> consumer running: %v", time.Since(t0).Round(time.Millisecond))
	n.samePodFile("pvc-reader", "/model/w.bin", tiny)
	n.readOnly("pvc-reader", "/model")
	n.inUseBy("tiny", "pod default/holder", "pod default/pvc-reader")
	n.must("", "delete", "pod/pvc-reader", "pvc/tiny", "--wait")
	n.inUseBy("tiny", "pod default/holder")
}

// quota: with the store's quota (5 MiB, the overlay's patch) a new pull
// evicts an unheld ad-hoc entry; the declared model a pod runs with stays.
func (n *node) quota() {
	t := n.t
	n.origin.add("/adhoc/w.bin", 2<<20)
	n.origin.add("/fresh/w.bin", 2<<20)
	if out, err := n.modelctl("pull", "--name", "adhoc", n.origin.url("/adhoc/w.bin")); err != nil {
		t.Fatalf("pull adhoc: %v\n%s", err, out)
	}
	// tiny (2 MiB, declared, in use) + adhoc (2 MiB) + fresh (2 MiB) > 5 MiB.
	if out, err := n.modelctl("pull", "--name", "fresh", n.origin.url("/fresh/w.bin")); err != nil {
		t.Fatalf("pull fresh, which evicting adhoc admits: %v\n%s", err, out)
	}
	out, err := n.modelctl("list")
	if err != nil {
		t.Fatal(out)
	}
	for _, re := range []string{`(?m)^tiny\s+Ready\s+declared\b.*pod.default/holder`, `(?m)^fresh\s+Ready\s+ad-hoc\b`, `(?m)^adhoc\s+Evicted\b`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("modelctl list does not match %q:\n%s", re, out)
		}
	}
	n.getText("modelcachenodes", "modelcache-node", `modelcache-node\s+2 Ready, 1 Evicted\s`)
	if out, err := n.modelctl("inspect", "adhoc"); err != nil || !strings.Contains(out, "fresh") {
		t.Errorf("inspect adhoc should say it made room for fresh (%v):\n%s", err, out)
	}
	if _, err := os.Stat(store + "/models/tiny/current/w.bin"); err != nil {
		t.Errorf("the declared, held model went: %v", err)
	}
	if out, err := n.modelctl("evict", "fresh"); err != nil {
		t.Fatalf("evict fresh: %v\n%s", err, out)
	}
}

// csi: a Deployment of pods with one inline CSI volume; the daemon pod is
// replaced under them; a model still downloading keeps a pod in
// ContainerCreating with the progress in its events; a rollout moves
// current while running pods keep their revision; deleting the pods
// releases the holds and the mounts.
func (n *node) csi(tiny []byte) {
	t := n.t
	v1 := n.origin.add("/shared/v1/w.bin", 512<<10)
	v2 := n.origin.add("/shared/v2/w.bin", 512<<10)
	n.must(modelCache("shared", n.origin.url("/shared/v1/w.bin")), "apply", "-f", "-")
	n.getText("modelcaches", "shared", `shared\s+\S+\s+[0-9a-f]{64}\s+1/1\b`)
	rev1 := n.artifact("shared").Revision

	t0 := time.Now()
	n.must(csiDeployment("servers", "shared", 2), "apply", "-f", "-")
	if out, err := n.kubectl("", "rollout", "status", "deploy/servers", "--timeout", "90s"); err != nil {
		d, _ := n.kubectl("", "describe", "pods", "-l", "app=servers")
		t.Fatalf("%s\n%s", out, d)
	}
	t.Logf("CSI Deployment (2 pods) applied, model cached -> pods running: %v", time.Since(t0).Round(time.Millisecond))
	servers := n.pods("default", "app=servers")
	if len(servers) != 2 {
		t.Fatalf("servers: %v", servers)
	}
	for _, p := range servers {
		n.samePodFile(p, "/model/w.bin", v1)
		n.readOnly(p, "/model")
	}
	n.inUseBy("shared", "pod default/"+servers[0], "pod default/"+servers[1])
	if c := n.csiMounts(); c != 2 {
		t.Errorf("%d CSI mounts on the host, want 2", c)
	}

	t.Run("DaemonReplaced", func(t *testing.T) {
		n.t = t
		old := n.pods("modelcache-system", "app.kubernetes.io/name=modelcached")
		n.must("", "-n", "modelcache-system", "delete", "pod", old[0], "--wait=false")
		// The consumers keep reading while there is no daemon and after.
		testenv.Eventually(t, "a new daemon pod, Ready", 90*time.Second, func() error {
			n.samePodFile("holder", "/model/current/w.bin", tiny)
			n.samePodFile(servers[0], "/model/w.bin", v1)
			now := n.pods("modelcache-system", "app.kubernetes.io/name=modelcached")
			if len(now) != 1 || now[0] == old[0] {
				return fmt.Errorf("daemon pods %v", now)
			}
			out, err := n.kubectl("", "-n", "modelcache-system", "get", "pod", now[0], "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
			if err != nil || out != "True" {
				return fmt.Errorf("%s not Ready: %s %v", now[0], out, err)
			}
			return nil
		})
		// The same store and the same holds: the hostPath consumer through
		// the pod scan, the CSI pods through the holds in the index.
		out, err := n.modelctl("inspect", "shared")
		if err != nil || !regexp.MustCompile(`Phase:\s+Ready`).MatchString(out) || !strings.Contains(out, "pod default/"+servers[0]) {
			t.Errorf("the new daemon's inspect shared (%v):\n%s", err, out)
		}
		n.inUseBy("tiny", "pod default/holder")
		n.inUseBy("shared", "pod default/"+servers[0], "pod default/"+servers[1])
		n.samePodFile("holder", "/model/current/w.bin", tiny)
		testenv.Eventually(t, "CSINode lists csi.modelcache.io again", 30*time.Second, func() error {
			out, err := n.kubectl("", "get", "csinode", "modelcache-node", "-o", "jsonpath={.spec.drivers[*].name}")
			if err != nil || !strings.Contains(out, "csi.modelcache.io") {
				return fmt.Errorf("drivers %q %v", out, err)
			}
			return nil
		})
	})
	n.t = t

	t.Run("Downloading", func(t *testing.T) {
		n.t = t
		slow := n.origin.add("/slow/w.bin", 1<<20)
		release := n.origin.gate("/slow/w.bin")
		n.must(modelCache("slow", n.origin.url("/slow/w.bin")), "apply", "-f", "-")
		t0 := time.Now()
		n.must(csiPod("slow-reader", "slow"), "apply", "-f", "-")
		// The pod waits in ContainerCreating; its events carry the daemon's
		// progress message (NodePublishVolume's Unavailable).
		testenv.Eventually(t, "describe shows the download's progress", 60*time.Second, func() error {
			out, err := n.kubectl("", "describe", "pod", "slow-reader")
			if err != nil {
				return err
			}
			if !strings.Contains(out, "ContainerCreating") || !regexp.MustCompile(`model slow downloading \d+ percent, [\d.]+ \S+ of 1\.0 MiB`).MatchString(out) {
				return fmt.Errorf("describe:\n%s", out)
			}
			return nil
		})
		// (An http source's revision is its content's digest: none yet.)
		n.getText("modelcaches", "slow", `slow\s+http://\S+/slow/w.bin\s+0/1\s+Complete\b.*\bPresent\b`)
		n.getText("modelcachenodes", "modelcache-node", `modelcache-node\s+2 Ready, 1 Downloading\b`)
		if a := n.artifact("slow"); a.Phase != "Downloading" {
			t.Errorf("the node reports slow %+v, want Downloading", a)
		}
		release()
		n.waitReady("120s", "pod/slow-reader")
		t.Logf("CSI pod of a downloading model applied -> running: %v", time.Since(t0).Round(time.Millisecond))
		n.samePodFile("slow-reader", "/model/w.bin", slow)
		n.getText("modelcaches", "slow", `slow\s+\S+\s+[0-9a-f]{64}\s+1/1\b`)
		n.must("", "delete", "pod", "slow-reader", "--wait")
		n.inUseBy("slow")
		n.must("", "delete", "modelcache", "slow")
	})
	n.t = t

	t.Run("Rollout", func(t *testing.T) {
		n.t = t
		n.must("", "patch", "modelcache", "shared", "--type", "merge", "-p", fmt.Sprintf(`{"spec":{"source":%q}}`, n.origin.url("/shared/v2/w.bin")))
		var rev2 string
		testenv.Eventually(t, "current moves to v2", 60*time.Second, func() error {
			a := n.artifact("shared")
			if a.Phase != "Ready" || a.Revision == rev1 {
				return fmt.Errorf("shared %+v", a)
			}
			rev2 = a.Revision
			return nil
		})
		n.getText("modelcaches", "shared", `shared\s+http://\S+/shared/v2/w.bin\s+`+rev2+`\s+1/1\b`)
		// The running pods keep v1; its tree stays while they hold it.
		for _, p := range servers {
			n.samePodFile(p, "/model/w.bin", v1)
		}
		if _, err := os.Stat(filepath.Join(store, "models/shared", rev1)); err != nil {
			t.Errorf("revision 1, held by running pods, went: %v", err)
		}
		// A new pod mounts v2.
		n.must("", "scale", "deploy/servers", "--replicas", "3")
		if out, err := n.kubectl("", "rollout", "status", "deploy/servers", "--timeout", "90s"); err != nil {
			t.Fatal(out)
		}
		var added string
		for _, p := range n.pods("default", "app=servers") {
			if !slices.Contains(servers, p) {
				added = p
			}
		}
		n.samePodFile(added, "/model/w.bin", v2)
		n.inUseBy("shared", "pod default/"+servers[0], "pod default/"+servers[1], "pod default/"+added)

		// Deleting the pods releases the holds and unmounts; revision 1,
		// no longer held, goes.
		n.must("", "delete", "deploy/servers", "--wait")
		testenv.Eventually(t, "the servers' pods gone", 60*time.Second, func() error {
			if p := n.pods("default", "app=servers"); len(p) > 0 {
				return fmt.Errorf("pods %v", p)
			}
			return nil
		})
		n.inUseBy("shared")
		testenv.Eventually(t, "no CSI mount left", 30*time.Second, func() error {
			if c := n.csiMounts(); c != 0 {
				return fmt.Errorf("%d CSI mounts", c)
			}
			return nil
		})
		testenv.Eventually(t, "revision 1 evicted once unheld", 60*time.Second, func() error {
			if _, err := os.Stat(filepath.Join(store, "models/shared", rev1)); !os.IsNotExist(err) {
				return fmt.Errorf("still there: %v", err)
			}
			return nil
		})
		n.must("", "delete", "modelcache", "shared")
	})
	n.t = t
}

func (n *node) artifact(name string) artifactStatus {
	n.t.Helper()
	arts, err := n.artifacts()
	if err != nil {
		n.t.Fatal(err)
	}
	return arts[name]
}

// pods lists the names of the pods of namespace ns matching a label
// selector, skipping pods being deleted.
func (n *node) pods(ns, sel string) []string {
	n.t.Helper()
	out := n.must("", "get", "pods", "-n", ns, "-l", sel, "-o", "json")
	var l struct {
		Items []struct {
			Metadata struct {
				Name              string
				DeletionTimestamp *time.Time
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &l); err != nil {
		n.t.Fatal(err)
	}
	var names []string
	for _, p := range l.Items {
		if p.Metadata.DeletionTimestamp == nil {
			names = append(names, p.Metadata.Name)
		}
	}
	return names
}

// csiMounts counts the CSI volumes mounted in kubelet's pods directory on
// the host, and checks each is read-only there too.
func (n *node) csiMounts() int {
	n.t.Helper()
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	c := 0
	for _, l := range strings.Split(string(mi), "\n") {
		f := strings.Fields(l)
		if len(f) < 6 || !strings.HasPrefix(f[4], "/var/lib/kubelet/pods/") || !strings.Contains(f[4], "/volumes/kubernetes.io~csi/") {
			continue
		}
		c++
		if !slices.Contains(strings.Split(f[5], ","), "ro") {
			n.t.Errorf("the host's copy of a CSI volume is writable: %s", l)
		}
	}
	return c
}

func csiVolume(model string) string {
	return fmt.Sprintf(`containers:
        - {name: reader, image: "registry.k8s.io/pause:node-test", volumeMounts: [{name: model, mountPath: /model}]}
      volumes:
        - name: model
          csi: {driver: csi.modelcache.io, readOnly: true, volumeAttributes: {modelCache: %s}}
`, model)
}

func csiDeployment(name, model string, replicas int) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: %s, namespace: default}
spec:
  replicas: %d
  selector: {matchLabels: {app: %s}}
  template:
    metadata: {labels: {app: %s}}
    spec:
      terminationGracePeriodSeconds: 1
      %s`, name, replicas, name, name, csiVolume(model))
}

func csiPod(name, model string) string {
	return strings.ReplaceAll(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: default}
spec:
      terminationGracePeriodSeconds: 1
      %s`, name, csiVolume(model)), "\n      ", "\n  ")
}

// tenancy: team-a's model, fetched with team-a's Secret (granted by a
// ModelCacheCredentials of team-a), mounts in a pod of team-a and is
// refused to a pod of namespace other, whose FailedMount Event says why;
// a public model mounts in other; on the host a local user reads the
// public model's file and not the private one's.
func (n *node) tenancy() {
	t := n.t
	priv := n.origin.add("/private/w.bin", 256<<10)
	n.origin.require("/private/w.bin", "Bearer team-a-token")
	pub := n.origin.add("/public/w.bin", 128<<10)
	src := n.origin.url("/private/w.bin")
	n.must(`apiVersion: v1
kind: Namespace
metadata: {name: team-a}
---
apiVersion: v1
kind: Namespace
metadata: {name: other}
---
apiVersion: v1
kind: Secret
metadata: {name: creds, namespace: team-a}
stringData: {HTTP_AUTHORIZATION: Bearer team-a-token}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: modelcached-secrets, namespace: team-a}
rules: [{apiGroups: [""], resources: [secrets], resourceNames: [creds], verbs: [get, list, watch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: modelcached-secrets, namespace: team-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: modelcached-secrets}
subjects: [{kind: ServiceAccount, name: modelcached, namespace: modelcache-system}]
---
apiVersion: modelcache.io/v1alpha1
kind: ModelCacheCredentials
metadata: {name: private, namespace: team-a}
spec: {modelCache: private, secretName: creds, sources: ["`+src+`"]}
`, "apply", "-f", "-")
	n.must(modelCache("private", src)+"  secretRef: {namespace: team-a, name: creds}\n", "apply", "-f", "-")
	n.must(modelCache("public", n.origin.url("/public/w.bin")), "apply", "-f", "-")
	n.getText("modelcaches", "private", `private\s+\S+\s+[0-9a-f]{64}\s+1/1\b`)
	n.getText("modelcaches", "public", `public\s+\S+\s+[0-9a-f]{64}\s+1/1\b`)
	in := func(ns, yaml string) string { return strings.Replace(yaml, "namespace: default", "namespace: "+ns, 1) }

	n.must(in("other", csiPod("reader", "private")), "apply", "-f", "-")
	testenv.Eventually(t, "the pod of other refused team-a's model, its Event says why", 60*time.Second, func() error {
		out, err := n.kubectl("", "-n", "other", "get", "events", "--field-selector", "involvedObject.name=reader,reason=FailedMount", "-o", "jsonpath={.items[*].message}")
		if err != nil || !strings.Contains(out, "PermissionDenied") || !strings.Contains(out, "model private is private") || !strings.Contains(out, `"other"`) {
			return fmt.Errorf("%q %v", out, err)
		}
		return nil
	})
	if out, _ := n.kubectl("", "-n", "other", "get", "pod", "reader", "-o", "jsonpath={.status.phase}"); out == "Running" {
		t.Fatal("the pod of other runs with team-a's private model")
	}
	n.must(in("team-a", csiPod("reader", "private")), "apply", "-f", "-")
	n.must(in("other", csiPod("public-reader", "public")), "apply", "-f", "-")
	n.waitReady("90s", "-n", "team-a", "pod/reader")
	n.waitReady("90s", "-n", "other", "pod/public-reader")
	n.samePodFile("team-a/reader", "/model/w.bin", priv)
	n.samePodFile("other/public-reader", "/model/w.bin", pub)

	// A local user on the host: the public model, not the private one.
	cat := func(p string) error {
		return exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", p).Run()
	}
	if err := cat(store + "/models/public/current/w.bin"); err != nil {
		t.Errorf("a local user cannot read the public model: %v", err)
	}
	// team-a's model is under private/, where no node's local PV may
	// point, and not under models/.
	if _, err := os.Stat(store + "/private/models/private/current/w.bin"); err != nil {
		t.Errorf("team-a's private model is not under private/: %v", err)
	}
	if _, err := os.Lstat(store + "/models/private"); !os.IsNotExist(err) {
		t.Errorf("team-a's private model has a directory under models/: %v", err)
	}
	if err := cat(store + "/private/models/private/current/w.bin"); err == nil {
		t.Error("a local user read team-a's private model on the host")
	}

	n.must("", "delete", "pod", "-n", "team-a", "reader", "--wait")
	n.must("", "delete", "pod", "-n", "other", "reader", "public-reader", "--wait")
	n.must("", "delete", "modelcache", "private", "public")
	n.must("", "delete", "namespace", "team-a", "other", "--wait")
}

// absent: Absent keeps the model while the pod runs and evicts it once
// the pod is gone.
func (n *node) absent() {
	t := n.t
	n.must("", "patch", "modelcache", "tiny", "--type", "merge", "-p", `{"spec":{"state":"Absent"}}`)
	n.getText("modelcaches", "tiny", `tiny\s+.*\bAbsent\b`)
	// The node has acted on Absent (the PV of a model no longer desired
	// goes) and kept the tree the pod mounts.
	testenv.Eventually(t, "tiny's PV gone", 30*time.Second, func() error {
		out, err := n.kubectl("", "get", "pv", "-l", "modelcache.io/model=tiny", "-o", "name")
		if err != nil || out != "" {
			return fmt.Errorf("%q %v", out, err)
		}
		return nil
	})
	n.samePodFile("holder", "/model/current/w.bin", n.origin.data("/tiny/w.bin"))
	n.inUseBy("tiny", "pod default/holder")
	n.must("", "delete", "pod", "holder", "--wait")
	testenv.Eventually(t, "evicted once the pod is gone", 30*time.Second, func() error {
		if _, err := os.Stat(store + "/models/tiny"); !os.IsNotExist(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
	n.must("", "delete", "modelcache", "tiny")
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

// origin serves the test's sources on the host's address, which pods and
// the daemon reach. A gated file delivers its first half, then waits.
type origin struct {
	addr  string
	mu    chan struct{} // a one-slot lock
	files map[string][]byte
	gates map[string]chan struct{}
	auth  map[string]string // path → the Authorization it requires
}

func newOrigin(t *testing.T, hostIP string) *origin {
	ln, err := net.Listen("tcp", hostIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	o := &origin{addr: ln.Addr().String(), mu: make(chan struct{}, 1), files: map[string][]byte{}, gates: map[string]chan struct{}{}, auth: map[string]string{}}
	srv := &http.Server{Handler: o}
	go srv.Serve(ln)
	t.Cleanup(func() {
		o.mu <- struct{}{}
		for _, g := range o.gates {
			select {
			case <-g:
			default:
				close(g)
			}
		}
		<-o.mu
		srv.Close()
	})
	return o
}

func (o *origin) url(path string) string { return "http://" + o.addr + path }

// add serves size random bytes at path and returns them.
func (o *origin) add(path string, size int) []byte {
	b := make([]byte, size)
	rand.Read(b)
	o.mu <- struct{}{}
	o.files[path] = b
	<-o.mu
	return b
}

func (o *origin) data(path string) []byte {
	o.mu <- struct{}{}
	defer func() { <-o.mu }()
	return o.files[path]
}

// gate holds path's second half back until the returned func is called.
func (o *origin) gate(path string) func() {
	g := make(chan struct{})
	o.mu <- struct{}{}
	o.gates[path] = g
	<-o.mu
	return func() {
		o.mu <- struct{}{}
		close(g)
		<-o.mu
	}
}

// require makes path answer 401 to a request without this Authorization.
func (o *origin) require(path, authorization string) {
	o.mu <- struct{}{}
	o.auth[path] = authorization
	<-o.mu
}

func (o *origin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	o.mu <- struct{}{}
	data, ok := o.files[r.URL.Path]
	g := o.gates[r.URL.Path]
	auth, private := o.auth[r.URL.Path]
	<-o.mu
	if !ok {
		http.NotFound(w, r)
		return
	}
	if private && r.Header.Get("Authorization") != auth {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	body := &gatedReader{Reader: bytes.NewReader(data), at: int64(len(data) / 2), gate: g, done: r.Context().Done()}
	http.ServeContent(w, r, filepath.Base(r.URL.Path), time.Time{}, body)
}

// gatedReader blocks reads past at until gate closes (nil: never blocks).
type gatedReader struct {
	*bytes.Reader
	at   int64
	gate chan struct{}
	done <-chan struct{}
}

func (g *gatedReader) Read(p []byte) (int, error) {
	if g.gate != nil {
		pos := g.Size() - int64(g.Len())
		if pos >= g.at {
			select {
			case <-g.gate:
			case <-g.done:
				return 0, http.ErrHandlerTimeout
			}
		} else if pos+int64(len(p)) > g.at {
			p = p[:g.at-pos]
		}
	}
	return g.Reader.Read(p)
}
