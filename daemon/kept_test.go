package daemon

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sigstore/cosign/v2/pkg/cosign"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/gpu/mcv"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/kernelcache"
	"github.com/modelcache/modelcache/kernelcache/fixtures"
)

// keptRig is a CSI daemon on a (simulated) H100 node with "mlp", a model
// whose models.d file allows capture, with the H200's Triton cache as its
// kernel cache (signed, in a real registry), and "other", a model that
// does not allow capture.
type keptRig struct {
	*csiRig
	cfg    Config
	host   string
	keys   *cosign.KeysBytes
	signer kernelcache.Signer
	served *kernelcache.Cache
}

func newKeptRig(t *testing.T, limits KeptLimits) *keptRig {
	host := testenv.Registry(t)
	keys, _ := cosign.GenerateKeyPair(func(bool) ([]byte, error) { return []byte("pw"), nil })
	signer, _ := kernelcache.KeySigner(keys.PrivateBytes, []byte("pw"))
	tc, err := kernelcache.Scan(fixtures.Triton(t), kernelcache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pushSigned(t, tc, "oci://"+host+"/kernels/tk:h200", "", signer)
	cfg := csiConfig(t)
	cfg.InsecureRegistries = []string{host}
	cfg.GPUInventory = inventoryFile(t, h100Inventory)
	cfg.KeptLayers = limits
	pubFile := filepath.Join(t.TempDir(), "cosign.pub")
	os.WriteFile(pubFile, keys.PublicBytes, 0o644)
	srv := newFileServer(t, map[string][]byte{"m/config.json": []byte(`{"model_type":"llama"}`)})
	os.MkdirAll(cfg.ModelsDir, 0o755)
	yml := "name: mlp\nuri: " + srv.URL + "/m/config.json\ncaptureKernelCaches: true\nkernelCaches:\n  - name: mlp-tk\n    uri: oci://" + host + "/kernels/tk:h200\n    signature: {keys: [" + pubFile + "]}\n"
	if err := os.WriteFile(filepath.Join(cfg.ModelsDir, "mlp.yaml"), []byte(yml), 0o644); err != nil {
		t.Fatal(err)
	}
	r := startCSI(t, cfg)
	r.waitPhase("mlp-tk", api.PhaseReady)
	r.waitPhase("mlp", api.PhaseReady)
	if _, err := r.pull(api.PullRequest{Name: "other", URI: srv.URL + "/m/config.json"}); err != nil {
		t.Fatal(err)
	}
	return &keptRig{csiRig: r, cfg: cfg, host: host, keys: keys, signer: signer, served: tc}
}

// publishRW publishes a writable kernel cache volume of model for pod
// "ml/pod-<id>" and returns its target.
func (r *keptRig) publishRW(id, model string) string {
	r.t.Helper()
	target := r.target("uid-"+id, "model")
	vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "csi.storage.k8s.io/pod.namespace": "ml", "csi.storage.k8s.io/pod.name": "pod-" + id,
		"modelCache": model, "kernelCaches": "auto", "kernelCacheWritable": "64Mi"}
	if _, err := r.node.NodePublishVolume(context.Background(), &csipb.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeContext: vc,
		VolumeCapability: &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
			AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}); err != nil {
		r.t.Fatal(err)
	}
	return target
}

func (r *keptRig) layers() []string {
	ls, err := r.c.KeptLayers(context.Background())
	if err != nil {
		r.t.Fatal(err)
	}
	var out []string
	for _, l := range ls {
		out = append(out, l.Volume)
	}
	return out
}

// TestCaptureAfterUnpublish: a pod compiles into its writable kernel
// cache volume, plants links out, a pipe and a hard link, removes a
// served kernel, and goes; the volume's layer is kept (the model allows
// capture) in the store root's own area, with no link and nothing from
// outside the volume, its refused entries named. modelctl kernelcache
// capture then takes it by the pod's name: the image holds the served
// kernels the pod kept and those it compiled, is pushed and signed, and a
// pull of it under the key policy serves it; the kept layer goes. A
// volume of a model that does not allow capture leaves nothing at
// unpublish.
func TestCaptureAfterUnpublish(t *testing.T) {
	r := newKeptRig(t, KeptLimits{})
	defer r.stop()
	ctx := context.Background()
	layers := filepath.Join(filepath.Dir(r.cfg.CSI.Socket), "writable")
	target := r.publishRW("vol-1", "mlp")
	kdir := filepath.Join(target, "kernels", "mlp-tk", "io.triton.cache")
	ind := fixtures.Inductor(t)
	es, _ := os.ReadDir(filepath.Join(ind, "triton"))
	var compiled []string
	for _, e := range es {
		if _, err := os.Stat(filepath.Join(kdir, e.Name())); err == nil {
			continue // the launcher both compiled: the same hash
		}
		if err := os.CopyFS(filepath.Join(kdir, e.Name()), os.DirFS(filepath.Join(ind, "triton", e.Name()))); err != nil {
			t.Fatal(err)
		}
		compiled = append(compiled, e.Name())
	}
	if len(compiled) == 0 {
		t.Fatal("the Inductor fixture compiled nothing new")
	}
	// The pod removes one served kernel, add_kernel (a whiteout in its layer).
	var removed string
	for _, f := range r.served.Files {
		if d, ok := strings.CutSuffix(f.Path, "/add_kernel.json"); ok {
			removed = d
		}
	}
	if removed == "" {
		t.Fatal("the Triton fixture has no add_kernel")
	}
	if err := os.RemoveAll(filepath.Join(kdir, removed)); err != nil {
		t.Fatal(err)
	}
	// Hostile entries outside the cache directory: links out, a pipe, a
	// hard link of a compiled file.
	os.Symlink("/etc/shadow", filepath.Join(target, "shadow"))
	os.Symlink("/etc", filepath.Join(target, "etc"))
	if err := syscall.Mkfifo(filepath.Join(target, "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	var someFile string
	filepath.WalkDir(filepath.Join(kdir, compiled[0]), func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.Type().IsRegular() && someFile == "" {
			someFile = p
		}
		return nil
	})
	if err := os.Link(someFile, filepath.Join(target, "hardlink")); err != nil {
		t.Fatal(err)
	}

	other := r.publishRW("vol-2", "other")
	os.WriteFile(filepath.Join(other, "compiled.bin"), []byte("x"), 0o644)

	if err := r.unpublish("vol-1", target); err != nil {
		t.Fatal(err)
	}
	if err := r.unpublish("vol-2", other); err != nil {
		t.Fatal(err)
	}
	if es, _ := os.ReadDir(layers); len(es) != 0 {
		t.Fatalf("writable layers after unpublish: %v", es)
	}
	ls, err := r.c.KeptLayers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(ls) != 1 || ls[0].Volume != "vol-1" || ls[0].Pod != "ml/pod-vol-1" || ls[0].Model != "mlp" {
		t.Fatalf("kept layers %+v; want vol-1's alone (vol-2's model does not allow capture)", ls)
	}
	refused := strings.Join(ls[0].Refused, "; ")
	for _, want := range []string{"shadow (a symbolic link)", "etc (a symbolic link)", "pipe (a named pipe)"} {
		if !strings.Contains(refused, want) {
			t.Errorf("refused %q; want %q named", refused, want)
		}
	}
	if _, err := r.c.CaptureSource(ctx, "vol-2"); err == nil || !strings.Contains(err.Error(), "none is kept") {
		t.Fatalf("capture of vol-2 after its unpublish: %v", err)
	}

	src, err := r.c.CaptureSource(ctx, "ml/pod-vol-1")
	if err != nil {
		t.Fatal(err)
	}
	if !src.Kept || src.Volume != "vol-1" || !strings.HasPrefix(src.Target, filepath.Join(r.cfg.Root, "kept")+"/") || len(src.Caches) != 1 || src.Caches[0].Path != "kernels/mlp-tk/io.triton.cache" {
		t.Fatalf("capture source of the kept layer: %+v", src)
	}
	// Nothing in the kept tree is a link, and nothing came from /etc.
	filepath.WalkDir(src.Target, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			t.Fatal(err)
		}
		if !e.Type().IsRegular() && !e.IsDir() {
			t.Errorf("kept %s, of type %v", p, e.Type())
		}
		return nil
	})
	for _, p := range []string{"shadow", "etc", "pipe"} {
		if _, err := os.Lstat(filepath.Join(src.Target, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("kept tree has %s: %v", p, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(src.Target, "hardlink")); err != nil || len(b) == 0 {
		t.Errorf("the hard link's copy: %v", err)
	}
	// What modelctl kernelcache capture does with it.
	kept := filepath.Join(src.Target, src.Caches[0].Path)
	if _, err := os.Stat(filepath.Join(kept, removed)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the kernel the pod removed is in the kept layer: %v", err)
	}
	c, err := kernelcache.Scan(kept, kernelcache.Options{Kind: src.Caches[0].Kind})
	if err != nil {
		t.Fatal(err)
	}
	gpus := []mcv.Target{{Backend: src.GPUs.Devices[0].Backend, Arch: src.GPUs.Devices[0].Arch, WarpSize: src.GPUs.Devices[0].WarpSize}}
	if err := kernelcache.CheckCompiledOn(c, gpus); err != nil {
		t.Fatal(err)
	}
	if len(c.Entries) != 3-1+len(compiled) {
		t.Fatalf("captured %d entries; want the 3 served less the one removed, and %d compiled", len(c.Entries), len(compiled))
	}
	dg := pushSigned(t, c, "oci://"+r.host+"/kernels/tk:captured", "", r.signer)
	if err := r.c.Captured(ctx, src.Volume); err != nil {
		t.Fatal(err)
	}
	if got := r.layers(); len(got) != 0 {
		t.Fatalf("kept layers after the capture: %v", got)
	}
	if _, err := os.Stat(filepath.Dir(src.Target)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the captured layer's directory: %v", err)
	}
	// Signed and servable: pulled under the key policy.
	if _, err := r.pull(api.PullRequest{Name: "warm", Kind: api.KindKernelCache, URI: "oci://" + r.host + "/kernels/tk:captured",
		Signature: &api.SignaturePolicy{Keys: []string{string(r.keys.PublicBytes)}}}); err != nil {
		t.Fatal(err)
	}
	a := r.waitPhase("warm", api.PhaseReady)
	full, _ := r.c.Get(ctx, "warm")
	if "sha256:"+a.Revision != dg || full.KernelCache == nil || full.KernelCache.Entries != len(c.Entries) {
		t.Fatalf("the captured cache served: %+v", full.KernelCache)
	}
	for _, k := range compiled {
		if _, err := os.Stat(filepath.Join(r.cfg.Root, "kernels", "warm", "current", "io.triton.cache", k)); err != nil {
			t.Fatalf("the compiled kernel %s is not served: %v", k, err)
		}
	}
}

// TestKeptLayersBounded: past the count limit the oldest kept layer goes;
// a layer larger than the size limit by itself (a sparse file counts its
// apparent size) is not kept; a layer with nothing written, or nothing
// since its capture, is not kept; kept layers outlive a restart, a layer
// whose pod went while the daemon was down is kept at start, and they go
// past the age limit.
func TestKeptLayersBounded(t *testing.T) {
	r := newKeptRig(t, KeptLimits{MaxLayers: 2, MaxBytes: 32 << 20})
	ctx := context.Background()
	write := func(id string, size int64) {
		target := r.publishRW(id, "mlp")
		f, err := os.Create(filepath.Join(target, "k-"+id+".bin"))
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(size); err != nil { // sparse: the tmpfs holds none of it
			t.Fatal(err)
		}
		f.Close()
		if err := r.unpublish(id, target); err != nil {
			t.Fatal(err)
		}
	}
	write("vol-a", 1<<20)
	write("vol-b", 1<<20)
	write("vol-c", 1<<20)
	if got := r.layers(); strings.Join(got, ",") != "vol-b,vol-c" {
		t.Fatalf("kept layers %v; want vol-b and vol-c (vol-a, the oldest, past the count limit)", got)
	}
	write("vol-huge", 40<<30)
	if got := r.layers(); strings.Join(got, ",") != "vol-b,vol-c" {
		t.Fatalf("kept layers %v after a 40 GiB sparse file; want it not kept", got)
	}
	// Nothing written: nothing kept.
	empty := r.publishRW("vol-empty", "mlp")
	if err := r.unpublish("vol-empty", empty); err != nil {
		t.Fatal(err)
	}
	// Captured while the pod ran, nothing written since: not kept.
	live := r.publishRW("vol-live", "mlp")
	os.WriteFile(filepath.Join(live, "k.bin"), []byte("k"), 0o644)
	if src, err := r.c.CaptureSource(ctx, "vol-live"); err != nil || src.Kept {
		t.Fatalf("capture source of a published volume: %+v %v", src, err)
	}
	if err := r.c.Captured(ctx, "vol-live"); err != nil {
		t.Fatal(err)
	}
	if err := r.unpublish("vol-live", live); err != nil {
		t.Fatal(err)
	}
	if got := r.layers(); strings.Join(got, ",") != "vol-b,vol-c" {
		t.Fatalf("kept layers %v; want no layer for an empty or captured volume", got)
	}
	if err := r.c.DropKeptLayer(ctx, "vol-b"); err != nil {
		t.Fatal(err)
	}
	// A pod that goes while the daemon is down: its layer is kept at start.
	down := r.publishRW("vol-down", "mlp")
	os.WriteFile(filepath.Join(down, "k.bin"), []byte("k"), 0o644)
	r.stop()
	if err := syscall.Unmount(down, 0); err != nil {
		t.Fatal(err)
	}
	r.csiRig = startCSI(t, r.cfg)
	defer r.stop()
	if got := r.layers(); strings.Join(got, ",") != "vol-c,vol-down" {
		t.Fatalf("kept layers after a restart %v; want vol-c, and vol-down, whose pod went while the daemon was down", got)
	}
	k := r.d.csi.kept
	k.mu.Lock()
	k.now = func() time.Time { return time.Now().Add(DefaultKeptAge + time.Hour) }
	k.mu.Unlock()
	if got := r.layers(); len(got) != 0 {
		t.Fatalf("kept layers past the age limit %v; want none", got)
	}
	if es, _ := os.ReadDir(filepath.Join(r.cfg.Root, "kept")); len(es) != 0 {
		t.Fatalf("kept/ holds %v", es)
	}
}
