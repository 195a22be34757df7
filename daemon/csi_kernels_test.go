package daemon

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers/oci/ocitest"
	"github.com/modelcache/modelcache/internal/testenv"
)

// TestCSIKernelCachesAuto: on a (simulated) H100 node with signed kernel
// caches in a real registry, a volume with kernelCaches: auto shows the
// model and, under kernels/<name>/, its Ready kernel caches compatible with
// the node, read-only; the kernel cache versions are held with the model
// (through a restart too) and released at unpublish, which removes the
// composed tree. A model whose only kernel cache is incompatible mounts
// alone, saying so in the log. A composed tree whose mount went while the
// daemon was down is removed at start.
func TestCSIKernelCachesAuto(t *testing.T) {
	host := testenv.Registry(t)
	cs := ocitest.NewCosign(t)
	key, pub := cs.KeyPair(t, "kc")
	pubPEM, _ := os.ReadFile(pub)
	policy := &api.SignaturePolicy{Keys: []string{string(pubPEM)}}
	cubin90, cubin80 := data(30<<10, 90), data(20<<10, 80)
	dg90 := ocitest.Push(t, host, "kernels/llama:sm90", ocitest.SM90(map[string][]byte{"h90/kernel.cubin": cubin90}).Image(t))
	dg80 := ocitest.Push(t, host, "kernels/llama:sm80", ocitest.SM80(map[string][]byte{"h80/kernel.cubin": cubin80}).Image(t))
	cs.SignV2(t, key, host+"/kernels/llama@"+dg90)
	cs.SignV2(t, key, host+"/kernels/llama@"+dg80)

	cfg := csiConfig(t)
	cfg.InsecureRegistries = []string{host}
	cfg.GPUInventory = inventoryFile(t, h100Inventory)
	cfg.Capacity.MinAge = 0
	logs := &syncBuffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	r := startCSI(t, cfg)
	config := []byte(`{"model_type":"llama"}`)
	fs := newFileServer(t, map[string][]byte{"m/config.json": config})
	if _, err := r.pull(api.PullRequest{Name: "llama", URI: fs.URL + "/m/config.json", KernelCaches: []api.KernelCacheRef{
		{URI: "oci://" + host + "/kernels/llama:sm90", Signature: policy},
		{URI: "oci://" + host + "/kernels/llama:sm80", Signature: policy},
	}}); err != nil {
		t.Fatal(err)
	}
	kc0 := r.waitPhase("llama.kc0", api.PhaseReady)
	r.waitPhase("llama.kc1", api.PhaseIncompatible)
	if _, err := r.pull(api.PullRequest{Name: "old", URI: fs.URL + "/m/config.json", KernelCaches: []api.KernelCacheRef{
		{URI: "oci://" + host + "/kernels/llama:sm80", Signature: policy},
	}}); err != nil {
		t.Fatal(err)
	}
	r.waitPhase("old.kc0", api.PhaseIncompatible)
	llama, _ := r.c.Get(context.Background(), "llama")

	target := r.target("uid-1", "model")
	if err := r.publish("vol-1", target, map[string]string{"modelCache": "llama", "kernelCaches": "auto"}); err != nil {
		t.Fatal(err)
	}
	if err := r.publish("vol-1", target, map[string]string{"modelCache": "llama", "kernelCaches": "auto"}); err != nil { // kubelet retries
		t.Fatalf("a repeated publish: %v", err)
	}
	want := map[string]string{"config.json": string(config)}
	for p, b := range files(t, r.d.store.TreePath("kernelcache", "llama.kc0", kc0.Revision)) {
		want["kernels/llama.kc0/"+p] = b
	}
	if got := files(t, target); !reflect.DeepEqual(got, want) || got["kernels/llama.kc0/io.triton.cache/h90/kernel.cubin"] != string(cubin90) {
		t.Fatalf("the volume shows %v, want exactly %v", keys(got), keys(want))
	}
	if err := os.WriteFile(filepath.Join(target, "kernels", "x"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("create under kernels/: %v, want EROFS", err)
	}
	composed := r.d.store.HoldTreePath(csiHoldKey("vol-1"))
	if !strings.HasPrefix(composed, cfg.Root+"/") {
		t.Fatalf("composed tree at %s, outside the store root %s", composed, cfg.Root)
	}
	if got := holders(t, r.harness, "llama.kc0"); len(got) != 1 || got[0] != "pod ml/pod-vol-1@"+kc0.Revision {
		t.Fatalf("the kernel cache's holders: %v, want the pod", got)
	}
	// The model without a compatible kernel cache mounts alone.
	target2 := r.target("uid-2", "model")
	if err := r.publish("vol-2", target2, map[string]string{"modelCache": "old", "kernelCaches": "auto"}); err != nil {
		t.Fatal(err)
	}
	if got := files(t, target2); len(got) != 1 || got["config.json"] != string(config) {
		t.Fatalf("a model with no compatible kernel cache shows %v, want config.json alone", keys(got))
	}
	if !strings.Contains(logs.String(), "no Ready kernel cache compatible") {
		t.Error("the log does not say the volume has no kernel caches")
	}

	// A model with a file where kernels/ would go is refused, holding nothing.
	clash := newFileServer(t, map[string][]byte{"c/kernels": config})
	if _, err := r.pull(api.PullRequest{Name: "clash", URI: clash.URL + "/c/kernels", KernelCaches: []api.KernelCacheRef{
		{URI: "oci://" + host + "/kernels/llama:sm90", Signature: policy},
	}}); err != nil {
		t.Fatal(err)
	}
	r.waitPhase("clash.kc0", api.PhaseReady)
	err := r.publish("vol-c", r.target("uid-c", "model"), map[string]string{"modelCache": "clash", "kernelCaches": "auto"})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "kernelCaches: none") {
		t.Fatalf("a model with its own kernels file: %v, want FailedPrecondition saying to use kernelCaches: none", err)
	}
	if got := holders(t, r.harness, "clash.kc0"); len(got) != 0 {
		t.Fatalf("a refused publish holds %v", got)
	}

	// Held through a restart; the composed tree of a volume whose mount
	// went while the daemon was down goes at start with its hold.
	target3 := r.target("uid-3", "model")
	if err := r.publish("vol-3", target3, map[string]string{"modelCache": "llama", "kernelCaches": "auto"}); err != nil {
		t.Fatal(err)
	}
	composed3 := r.d.store.HoldTreePath(csiHoldKey("vol-3"))
	r.stop()
	if err := syscall.Unmount(target3, 0); err != nil {
		t.Fatal(err)
	}
	r = startCSI(t, cfg)
	defer r.stop()
	if _, err := os.Stat(composed3); !os.IsNotExist(err) {
		t.Fatalf("the composed tree of a volume no longer mounted survived the restart: %v", err)
	}
	if got := holders(t, r.harness, "llama.kc0"); len(got) != 1 || got[0] != "pod ml/pod-vol-1@"+kc0.Revision {
		t.Fatalf("after a restart the kernel cache's holders are %v, want the pod of vol-1", got)
	}
	if _, err := r.d.space.evictPass(context.Background(), 1<<40); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{r.d.store.TreePath("kernelcache", "llama.kc0", kc0.Revision), r.d.store.TreePath("model", "llama", llama.Revision)} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("a held version was evicted: %v", err)
		}
	}

	r.unpublishGone("vol-1", target)
	r.unpublishGone("vol-2", target2)
	if _, err := os.Stat(composed); !os.IsNotExist(err) {
		t.Fatalf("the composed tree outlived the volume: %v", err)
	}
	r.released("llama", "llama.kc0", "old")
}

// TestCSIKernelCachesAutoWithoutGPU: a node without GPUs (empty inventory)
// pulls no kernel cache; kernelCaches: auto mounts the revision's own tree
// with no kernels/ and no composed tree.
func TestCSIKernelCachesAutoWithoutGPU(t *testing.T) {
	host := testenv.Registry(t)
	ocitest.Push(t, host, "kernels/x:v1", ocitest.SM90(map[string][]byte{"h/k.cubin": data(1000, 9)}).Image(t))
	cfg := csiConfig(t)
	cfg.InsecureRegistries = []string{host}
	cfg.GPUInventory = inventoryFile(t, `{"devices":[]}`)
	cfg.KernelCacheSignaturePolicy = api.PolicyOff
	r := startCSI(t, cfg)
	defer r.stop()
	w := data(2000, 10)
	fs := newFileServer(t, map[string][]byte{"w.bin": w})
	if _, err := r.pull(api.PullRequest{Name: "m", URI: fs.URL + "/w.bin#sha256=" + sha(w), KernelCaches: []api.KernelCacheRef{
		{URI: "oci://" + host + "/kernels/x:v1", Signature: &api.SignaturePolicy{Policy: api.PolicyOff}},
	}}); err != nil {
		t.Fatal(err)
	}
	r.waitPhase("m.kc0", api.PhaseIncompatible)
	target := r.target("uid-1", "model")
	if err := r.publish("vol-1", target, map[string]string{"modelCache": "m", "kernelCaches": "auto"}); err != nil {
		t.Fatal(err)
	}
	if got := files(t, target); len(got) != 1 || got["w.bin"] != string(w) {
		t.Fatalf("the volume shows %v, want w.bin alone", keys(got))
	}
	if ents, _ := os.ReadDir(filepath.Join(cfg.Root, "holds")); len(ents) != 1 {
		t.Fatalf("holds/ has %d entries, want the volume's record", len(ents))
	}
	if _, err := os.Stat(r.d.store.HoldTreePath(csiHoldKey("vol-1"))); !os.IsNotExist(err) {
		t.Fatalf("a composed tree for a volume without kernel caches: %v", err)
	}
	r.unpublishGone("vol-1", target)
	r.released("m")
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// composeRig is a CSI daemon on a (simulated) H100 node with "llama", a
// model with a compatible kernel cache of files (so kernelCaches: auto
// composes a tree of them), and "plain", a model without. hook is the
// store's hook (Config.Hook).
func composeRig(t testing.TB, files map[string][]byte, hook func(point string)) *csiRig {
	host := testenv.Registry(t)
	ocitest.Push(t, host, "kernels/llama:sm90", ocitest.SM90(files).Image(t))
	cfg := csiConfig(t)
	cfg.InsecureRegistries = []string{host}
	cfg.GPUInventory = inventoryFile(t, h100Inventory)
	cfg.KernelCacheSignaturePolicy = api.PolicyOff
	cfg.Hook = hook
	r := startCSI(t, cfg)
	w, p := data(4000, 40), data(3000, 41)
	srv := newFileServer(t, map[string][]byte{"w.bin": w, "p.bin": p})
	if _, err := r.pull(api.PullRequest{Name: "llama", URI: srv.URL + "/w.bin#sha256=" + sha(w), KernelCaches: []api.KernelCacheRef{
		{URI: "oci://" + host + "/kernels/llama:sm90", Signature: &api.SignaturePolicy{Policy: api.PolicyOff}},
	}}); err != nil {
		t.Fatal(err)
	}
	r.waitPhaseWithin("llama.kc0", api.PhaseReady, 5*time.Minute) // the benchmark's has 20,000 files
	if _, err := r.pull(api.PullRequest{Name: "plain", URI: srv.URL + "/p.bin#sha256=" + sha(p)}); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestCSIComposeHoldsUpNoOtherPublish: while a kernelCaches: auto volume's
// tree is being composed (held at the store's hook), another pod's
// volume of a plain model publishes, lists and unpublishes, a pull
// commits another model, and kubelet's
// retry of the auto volume waits for the one compose rather than
// mounting a tree not built yet; once the compose goes on, both auto
// publishes succeed with the same tree.
func TestCSIComposeHoldsUpNoOtherPublish(t *testing.T) {
	composing, gate := make(chan struct{}, 1), make(chan struct{})
	r := composeRig(t, map[string][]byte{"h90/a.cubin": data(1000, 42), "h90/b.cubin": data(1000, 43)}, func(point string) {
		if point == "holdtree.link" {
			composing <- struct{}{}
			<-gate
		}
	})
	defer r.stop()
	release := sync.OnceFunc(func() { close(gate) })
	defer release() // before the stop, should the test fail with the compose held
	auto := r.target("uid-auto", "model")
	autoDone := make(chan error, 2)
	for range 2 { // the publish and kubelet's retry of it
		go func() {
			autoDone <- r.publish("vol-auto", auto, map[string]string{"modelCache": "llama", "kernelCaches": "auto"})
		}()
	}
	<-composing
	plain := r.target("uid-plain", "model")
	plainDone := make(chan error, 1)
	go func() { plainDone <- r.publish("vol-plain", plain, map[string]string{"modelCache": "plain"}) }()
	select {
	case err := <-plainDone:
		if err != nil {
			t.Fatal(err)
		}
	case err := <-autoDone:
		t.Fatalf("the auto publish returned (%v) while its compose was held", err)
	case <-time.After(20 * time.Second): // a failure's guard, not a measurement
		t.Fatal("a plain publish waited for another volume's compose")
	}
	if got := holders(t, r.harness, "plain"); len(got) != 1 || !strings.HasPrefix(got[0], "pod ml/pod-vol-plain@") {
		t.Fatalf("plain's holders while the compose is held: %v", got)
	}
	r.unpublishGone("vol-plain", plain)
	// Nor does it hold the store: a pull commits meanwhile.
	o := data(2000, 44)
	srv := newFileServer(t, map[string][]byte{"o.bin": o})
	if _, err := r.pull(api.PullRequest{Name: "other", URI: srv.URL + "/o.bin#sha256=" + sha(o)}); err != nil {
		t.Fatal(err)
	}
	release()
	for range 2 {
		if err := <-autoDone; err != nil {
			t.Fatal(err)
		}
	}
	if got := files(t, auto); got["w.bin"] == "" || got["kernels/llama.kc0/io.triton.cache/h90/a.cubin"] == "" || got["kernels/llama.kc0/io.triton.cache/h90/b.cubin"] == "" {
		t.Fatalf("the auto volume shows %v", keys(got))
	}
	if got := holders(t, r.harness, "llama.kc0"); len(got) != 1 {
		t.Fatalf("the kernel cache's holders: %v, want the one pod", got)
	}
	r.unpublishGone("vol-auto", auto)
	r.released("llama", "llama.kc0", "plain")
}
