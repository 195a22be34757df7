package daemon

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/sigstore/cosign/v2/pkg/cosign"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/gpu/mcv"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/kernelcache"
	"github.com/modelcache/modelcache/kernelcache/fixtures"
)

// TestBuiltKernelCachesServed: the real Triton and Inductor caches of an
// H200 (and a vLLM cache holding the Triton one) are built into MCV images by package kernelcache (modelctl
// kernelcache build), pushed to Debian's docker-registry and signed with
// cosign's library; the daemon pulls them as a model's kernel caches
// under a key policy, verifies the signature, parses every entry of the
// manifest, serves every file byte for byte, and env points each
// framework at its tree. A node whose GPUs are another architecture
// takes neither.
func TestBuiltKernelCachesServed(t *testing.T) {
	host := testenv.Registry(t)
	ctx := context.Background()
	keys, err := cosign.GenerateKeyPair(func(bool) ([]byte, error) { return []byte("pw"), nil })
	if err != nil {
		t.Fatal(err)
	}
	signer, err := kernelcache.KeySigner(keys.PrivateBytes, []byte("pw"))
	if err != nil {
		t.Fatal(err)
	}
	tritonDir, inductorDir := fixtures.Triton(t), fixtures.Inductor(t)
	build := func(dir, repo string) (*kernelcache.Cache, string) {
		c, err := kernelcache.Scan(dir, kernelcache.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return c, pushSigned(t, c, "oci://"+host+"/"+repo, "", signer)
	}
	tc, tdg := build(tritonDir, "kernels/tk:h200")
	ic, idg := build(inductorDir, "kernels/ind:h200")
	vllmDir := fixtures.VLLM(t)
	vc, vdg := build(vllmDir, "kernels/vllm:h200")

	cfg := testConfig(t)
	cfg.InsecureRegistries = []string{host}
	cfg.GPUInventory = inventoryFile(t, h100Inventory) // sm_90, as the H200
	h := start(t, cfg)
	policy := &api.SignaturePolicy{Keys: []string{string(keys.PublicBytes)}}
	fs := newFileServer(t, map[string][]byte{"m/config.json": []byte(`{"model_type":"llama"}`)})
	if _, err := h.pull(api.PullRequest{Name: "mlp", URI: fs.URL + "/m/config.json", KernelCaches: []api.KernelCacheRef{
		{Name: "mlp-triton", URI: "oci://" + host + "/kernels/tk:h200", Signature: policy},
		{Name: "mlp-inductor", URI: "oci://" + host + "/kernels/ind:h200", Signature: policy},
		{Name: "mlp-vllm", URI: "oci://" + host + "/kernels/vllm:h200", Signature: policy},
	}}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, digest, dir, cacheDir string
		cache                       *kernelcache.Cache
		env                         map[string]string
	}{
		{"mlp-triton", tdg, tritonDir, "io.triton.cache", tc, map[string]string{"TRITON_CACHE_DIR": "io.triton.cache"}},
		{"mlp-inductor", idg, inductorDir, "io.torchinductor.cache", ic, map[string]string{
			"TORCHINDUCTOR_CACHE_DIR": "io.torchinductor.cache", "TRITON_CACHE_DIR": "io.torchinductor.cache/triton"}},
		{"mlp-vllm", vdg, vllmDir, "io.vllm.cache", vc, map[string]string{"VLLM_CACHE_ROOT": "io.vllm.cache"}},
	} {
		a := h.waitPhase(c.name, api.PhaseReady)
		if "sha256:"+a.Revision != c.digest {
			t.Fatalf("%s pinned to %s, pushed %s", c.name, a.Revision, c.digest)
		}
		full, err := h.c.Get(ctx, c.name)
		if err != nil {
			t.Fatal(err)
		}
		kc := full.KernelCache
		if kc == nil || kc.Signature == nil || !kc.Signature.Verified || kc.Entries != len(c.cache.Entries) || kc.CacheBytes != c.cache.Bytes ||
			kc.Compatibility == nil || !kc.Compatibility.Compatible || kc.Compatibility.Devices[0].Entries != len(c.cache.Entries) {
			t.Fatalf("%s: signature, every entry parsed and compatible, every byte: %+v (want %d entries, %d bytes)", c.name, kc, len(c.cache.Entries), c.cache.Bytes)
		}
		tree := filepath.Join(cfg.Root, "kernels", c.name, "current")
		for _, f := range c.cache.Files {
			want, _ := os.ReadFile(filepath.Join(c.dir, f.Path))
			got, err := os.ReadFile(filepath.Join(tree, c.cacheDir, f.Path))
			if err != nil || string(got) != string(want) {
				t.Fatalf("%s: %s not served as built: %v", c.name, f.Path, err)
			}
		}
		env, err := h.c.Env(ctx, c.name)
		if err != nil || len(env) != len(c.env) {
			t.Fatalf("%s: env %v %v; want %v", c.name, env, err, c.env)
		}
		for k, v := range c.env {
			if env[k] != filepath.Join(tree, v) {
				t.Errorf("%s: %s=%s; want %s", c.name, k, env[k], filepath.Join(tree, v))
			}
		}
	}
	env, err := h.c.Env(ctx, "mlp")
	if err != nil || env["TRITON_CACHE_DIR"] != filepath.Join(cfg.Root, "kernels/mlp-triton/current/io.triton.cache") || env["TORCHINDUCTOR_CACHE_DIR"] == "" {
		t.Fatalf("the model's env: the first kernel cache's Triton directory wins: %v %v", env, err)
	}

	// An A100 node takes neither, from the summary label, before any layer.
	cfg2 := testConfig(t)
	cfg2.InsecureRegistries = []string{host}
	cfg2.GPUInventory = inventoryFile(t, `{"cudaDriverVersion":"12.4","devices":[{"name":"NVIDIA A100","uuid":"GPU-A","computeCapability":"8.0"}]}`)
	h2 := start(t, cfg2)
	_, err = h2.pull(api.PullRequest{Name: "tk", Kind: api.KindKernelCache, URI: "oci://" + host + "/kernels/tk:h200", Signature: policy})
	if a := h2.waitPhase("tk", api.PhaseIncompatible); err == nil || !strings.Contains(a.Message, "built for arch 90, GPU is 80") {
		t.Fatalf("an sm_80 node: %v %+v", err, a)
	}
}

// gatedRegistry is a reverse proxy to a registry that holds GETs of one
// blob until open is closed: a kernel cache whose layer is still on its way.
func gatedRegistry(t *testing.T, upstream, blob string) (host string, open func()) {
	t.Helper()
	u, _ := url.Parse("http://" + upstream)
	proxy := httputil.NewSingleHostReverseProxy(u)
	gate := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+blob) {
			select {
			case <-gate:
			case <-r.Context().Done():
				return
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	var once sync.Once
	return strings.TrimPrefix(srv.URL, "http://"), func() { once.Do(func() { close(gate) }) }
}

// TestWaitIncludesKernelCaches: modelctl wait MODEL goes on while the
// model is Ready and its kernel cache is still on its way, saying so,
// and ends once the cache is Ready, naming the GPU of this node that no
// kernel cache of the model runs on; --skip-kernel-caches ends with the
// model alone. A CSI volume with kernelCaches: auto published meanwhile
// is refused with Unavailable and the reason (the pod's event), and
// shows the kernel cache once it is Ready.
func TestWaitIncludesKernelCaches(t *testing.T) {
	upstream := testenv.Registry(t)
	ctx := context.Background()
	keys, _ := cosign.GenerateKeyPair(func(bool) ([]byte, error) { return []byte("pw"), nil })
	signer, err := kernelcache.KeySigner(keys.PrivateBytes, []byte("pw"))
	if err != nil {
		t.Fatal(err)
	}
	reg := kernelcache.Registry{}
	c, err := kernelcache.Scan(fixtures.Triton(t), kernelcache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ref, _ := reg.ParseRef("oci://" + upstream + "/kernels/tk:h200")
	b, err := kernelcache.Image(c, kernelcache.ImageOptions{Title: "tk"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	dref, err := reg.Push(ctx, ref, b)
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Sign(ctx, dref, signer); err != nil {
		t.Fatal(err)
	}
	ls, _ := b.Image.Layers()
	ld, _ := ls[0].Digest()
	host, open := gatedRegistry(t, upstream, ld.String())
	defer open()

	cfg := csiConfig(t)
	cfg.InsecureRegistries = []string{host}
	cfg.GPUInventory = inventoryFile(t, `{"driverVersion":"580.159.04","cudaDriverVersion":"13.0","devices":[
	  {"name":"NVIDIA H200","uuid":"GPU-H","computeCapability":"9.0"},{"name":"NVIDIA A100-SXM4-80GB","uuid":"GPU-A","computeCapability":"8.0"}]}`)
	r := startCSI(t, cfg)
	fs := newFileServer(t, map[string][]byte{"m/config.json": []byte(`{"model_type":"llama"}`)})
	policy := &api.SignaturePolicy{Keys: []string{string(keys.PublicBytes)}}
	if _, err := r.c.Pull(ctx, api.PullRequest{Name: "mlp", URI: fs.URL + "/m/config.json", KernelCaches: []api.KernelCacheRef{
		{Name: "mlp-tk", URI: "oci://" + host + "/kernels/tk:h200", Signature: policy}}}, false, nil); err != nil {
		t.Fatal(err)
	}
	r.waitPhase("mlp", api.PhaseReady)

	// --skip-kernel-caches: done with the model alone, the cache still gated.
	a, err := r.c.WaitWith(ctx, "mlp", api.WaitOptions{SkipKernelCaches: true}, nil)
	if err != nil || a.Phase != api.PhaseReady {
		t.Fatalf("wait --skip-kernel-caches: %+v %v", a, err)
	}
	if kc, _ := r.c.Get(ctx, "mlp-tk"); kc.Phase == api.PhaseReady {
		t.Fatal("the kernel cache's layer is gated; it cannot be Ready")
	}
	// A CSI volume with kernelCaches: auto waits, telling the pod why.
	target := r.target("uid-1", "model")
	err = r.publish("vol-1", target, map[string]string{"modelCache": "mlp", "kernelCaches": "auto"})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "mlp-tk (") || !strings.Contains(err.Error(), "kernelCaches: auto waits") {
		t.Fatalf("publish while the kernel cache is on its way: %v; want Unavailable naming it", err)
	}

	// The default wait: it says it waits for the kernel cache, and ends
	// once that is Ready, naming the GPU none runs on.
	waiting := make(chan struct{})
	var once sync.Once
	var last api.Event
	done := make(chan error, 1)
	go func() {
		_, err := r.c.WaitWith(ctx, "mlp", api.WaitOptions{}, func(e api.Event) {
			last = e
			if len(e.Notes) > 0 && strings.Contains(e.Notes[0], "waiting for its kernel caches: mlp-tk") && e.Artifact != nil && e.Artifact.Phase == api.PhaseReady {
				once.Do(func() { close(waiting) })
			}
		})
		done <- err
	}()
	select {
	case <-waiting:
	case err := <-done:
		t.Fatalf("the wait ended before the kernel cache was Ready: %v %+v", err, last)
	case <-time.After(2 * time.Minute):
		t.Fatal("no event said the wait waits for the kernel cache")
	}
	open()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if kc, _ := r.c.Get(ctx, "mlp-tk"); kc.Phase != api.PhaseReady {
		t.Fatalf("the wait ended with the kernel cache %s", kc.Phase)
	}
	if !last.Done || len(last.Notes) != 1 || !strings.Contains(last.Notes[0], "GPU 1 (NVIDIA A100-SXM4-80GB) has no kernel cache of mlp it can run (mlp-tk: built for arch 90, GPU is 80") {
		t.Fatalf("the last event: %+v; want Done and a note naming GPU 1", last)
	}
	if err := r.publish("vol-1", target, map[string]string{"modelCache": "mlp", "kernelCaches": "auto"}); err != nil {
		t.Fatalf("kubelet's retry once the kernel cache is Ready: %v", err)
	}
	if _, err := os.Stat(filepath.Join(target, "kernels", "mlp-tk", "io.triton.cache")); err != nil {
		t.Fatalf("the volume shows the kernel cache: %v", err)
	}
	if err := r.unpublish("vol-1", target); err != nil {
		t.Fatal(err)
	}
}

// TestCSIWritableKernelCache: a volume with kernelCacheWritable is an
// overlay of the held tree (the model and its kernel caches) and a layer
// of its own: a pod compiles new kernels into it and may even rewrite a
// served file, while the store's bytes stay as they were; the layer is
// bounded (ENOSPC past its size), private to the volume, and gone at
// unpublish.
func TestCSIWritableKernelCache(t *testing.T) {
	host := testenv.Registry(t)
	ctx := context.Background()
	keys, _ := cosign.GenerateKeyPair(func(bool) ([]byte, error) { return []byte("pw"), nil })
	signer, _ := kernelcache.KeySigner(keys.PrivateBytes, []byte("pw"))
	dir := fixtures.Triton(t)
	c, err := kernelcache.Scan(dir, kernelcache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pushSigned(t, c, "oci://"+host+"/kernels/tk:h200", "tk", signer)
	cfg := csiConfig(t)
	cfg.InsecureRegistries = []string{host}
	cfg.GPUInventory = inventoryFile(t, h100Inventory)
	// A layer left mounted by a daemon that went down with its volume: gone at start.
	layers := filepath.Join(filepath.Dir(cfg.CSI.Socket), "writable")
	stale := filepath.Join(layers, "stale")
	os.MkdirAll(stale, 0o700)
	if err := syscall.Mount("tmpfs", stale, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(stale, syscall.MNT_DETACH) })
	r := startCSI(t, cfg)
	if _, err := os.Stat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a stale writable layer after start: %v", err)
	}
	config := []byte(`{"model_type":"llama"}`)
	fs := newFileServer(t, map[string][]byte{"m/config.json": config})
	if _, err := r.pull(api.PullRequest{Name: "mlp", URI: fs.URL + "/m/config.json", KernelCaches: []api.KernelCacheRef{
		{Name: "mlp-tk", URI: "oci://" + host + "/kernels/tk:h200", Signature: &api.SignaturePolicy{Keys: []string{string(keys.PublicBytes)}}}}}); err != nil {
		t.Fatal(err)
	}
	r.waitPhase("mlp-tk", api.PhaseReady)

	publishRW := func(id, target string, attrs map[string]string) error {
		vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "csi.storage.k8s.io/pod.namespace": "ml", "csi.storage.k8s.io/pod.name": "pod-" + id}
		for k, v := range attrs {
			vc[k] = v
		}
		_, err := r.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeContext: vc,
			VolumeCapability: &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
				AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}})
		return err
	}
	attrs := map[string]string{"modelCache": "mlp", "kernelCaches": "auto", "kernelCacheWritable": "4Mi"}
	// Refused: a read-only volume, a size that is not one.
	if err := r.publish("vol-x", r.target("uid-x", "model"), attrs); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "readOnly") {
		t.Fatalf("writable with readOnly: true: %v", err)
	}
	if err := publishRW("vol-y", r.target("uid-y", "model"), map[string]string{"modelCache": "mlp", "kernelCacheWritable": "lots"}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "512Mi") {
		t.Fatalf("a bad size: %v", err)
	}

	target := r.target("uid-1", "model")
	if err := publishRW("vol-1", target, attrs); err != nil {
		t.Fatal(err)
	}
	if err := publishRW("vol-1", target, attrs); err != nil { // kubelet retries
		t.Fatalf("a repeated publish: %v", err)
	}
	ro := r.target("uid-2", "model")
	if err := r.publish("vol-2", ro, map[string]string{"modelCache": "mlp", "kernelCaches": "auto"}); err != nil {
		t.Fatal(err)
	}
	kdir := filepath.Join(target, "kernels", "mlp-tk", "io.triton.cache")
	// A new kernel compiled into the volume.
	if err := os.MkdirAll(filepath.Join(kdir, "NEWKERNEL"), 0o755); err != nil {
		t.Fatal(err)
	}
	cubin := data(64<<10, 5)
	if err := os.WriteFile(filepath.Join(kdir, "NEWKERNEL", "k.cubin"), cubin, 0o644); err != nil {
		t.Fatalf("compile into the volume: %v", err)
	}
	// Served files rewritten through the volume: the store keeps its bytes.
	f := c.Files[0].Path
	if err := os.WriteFile(filepath.Join(kdir, f), []byte("rewritten"), 0o644); err != nil {
		t.Fatalf("rewrite %s in the volume: %v", f, err)
	}
	if err := os.WriteFile(filepath.Join(target, "config.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(filepath.Join(dir, f))
	for _, p := range []string{filepath.Join(cfg.Root, "kernels", "mlp-tk", "current", "io.triton.cache", f), filepath.Join(ro, "kernels", "mlp-tk", "io.triton.cache", f)} {
		if got, err := os.ReadFile(p); err != nil || string(got) != string(want) {
			t.Fatalf("%s changed through the writable volume: %v", p, err)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(cfg.Root, "models", "mlp", "current", "config.json")); string(got) != string(config) {
		t.Fatal("the model's config.json changed in the store")
	}
	if _, err := os.Stat(filepath.Join(ro, "kernels", "mlp-tk", "io.triton.cache", "NEWKERNEL")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("another volume sees the first's layer: %v", err)
	}
	if vr, err := r.c.Verify(ctx); err != nil || len(vr.Corrupt)+len(vr.Missing) > 0 || vr.BlobsChecked < len(c.Files) {
		t.Fatalf("the store's blobs after the writes: %+v %v", vr, err)
	}
	// Bounded: past 4 MiB the pod gets ENOSPC.
	if err := os.WriteFile(filepath.Join(kdir, "NEWKERNEL", "big"), data(8<<20, 6), 0o644); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("8 MiB into a 4 MiB layer: %v, want ENOSPC", err)
	}
	if es, _ := os.ReadDir(layers); len(es) != 1 {
		t.Fatalf("layers %v; want the one of vol-1", es)
	}
	if err := r.unpublish("vol-1", target); err != nil {
		t.Fatal(err)
	}
	if es, _ := os.ReadDir(layers); len(es) != 0 {
		t.Fatalf("the layer outlived its volume: %v", es)
	}
	if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("target after unpublish: %v", err)
	}
	r.unpublish("vol-2", ro)
}

// TestCaptureCompiledKernels: what a pod compiled into its writable
// kernel cache volume is captured (modelctl kernelcache capture: the
// daemon says where, for a model whose models.d file opts in; the rest
// runs in the admin's process) into an image holding the served kernels
// and the new ones, which a fresh node then serves. A link planted in
// the volume, a kernel for a GPU the node lacks, a model that did not
// opt in and a read-only volume are refused.
func TestCaptureCompiledKernels(t *testing.T) {
	kr := newKeptRig(t, KeptLimits{})
	r, host, keys, tc := kr.csiRig, kr.host, kr.keys, kr.served
	ctx := context.Background()
	push := func(c *kernelcache.Cache, uri string) string { return pushSigned(t, c, uri, "", kr.signer) }
	publishRW := func(id, model string) string {
		target := kr.publishRW(id, model)
		t.Cleanup(func() { r.unpublish(id, target) }) // its layer goes too, pass or fail
		return target
	}
	target := publishRW("vol-1", "mlp")
	other := publishRW("vol-2", "other")
	ro := r.target("uid-3", "model")
	if err := r.publish("vol-3", ro, map[string]string{"modelCache": "mlp"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ volume, want string }{
		{"vol-2", "does not allow capture"}, {"vol-3", "no writable kernel cache"}, {"vol-9", "no volume vol-9"},
	} {
		if _, err := r.c.CaptureSource(ctx, c.volume); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("capture of %s: %v; want %q", c.volume, err, c.want)
		}
	}
	_ = other

	// The pod compiles two kernels (torch.compile's, from the H200) into
	// the Triton cache it was given.
	src, err := r.c.CaptureSource(ctx, "ml/pod-vol-1")
	if err != nil {
		t.Fatal(err)
	}
	if src.Volume != "vol-1" || src.Target != target || len(src.Caches) != 1 || src.Caches[0].Path != "kernels/mlp-tk/io.triton.cache" || len(src.GPUs.Devices) != 1 {
		t.Fatalf("capture source %+v", src)
	}
	kdir := filepath.Join(src.Target, src.Caches[0].Path)
	ind := fixtures.Inductor(t)
	newKernels := 0
	es, _ := os.ReadDir(filepath.Join(ind, "triton"))
	for _, e := range es {
		if _, err := os.Stat(filepath.Join(kdir, e.Name())); err == nil {
			continue // the launcher both compiled: the same hash
		}
		if err := os.CopyFS(filepath.Join(kdir, e.Name()), os.DirFS(filepath.Join(ind, "triton", e.Name()))); err != nil {
			t.Fatal(err)
		}
		fs, _ := os.ReadDir(filepath.Join(ind, "triton", e.Name()))
		newKernels += len(fs)
	}
	// A link out, planted by the pod: refused.
	os.Symlink("/etc/shadow", filepath.Join(kdir, "shadow.json"))
	if _, err := kernelcache.Scan(kdir, kernelcache.Options{Kind: src.Caches[0].Kind}); !errors.Is(err, kernelcache.ErrRefused) || !strings.Contains(err.Error(), "shadow.json") {
		t.Fatalf("a link in the captured volume: %v", err)
	}
	os.Remove(filepath.Join(kdir, "shadow.json"))
	gpus := []mcv.Target{{Backend: src.GPUs.Devices[0].Backend, Arch: src.GPUs.Devices[0].Arch, WarpSize: src.GPUs.Devices[0].WarpSize}}
	// A kernel for a GPU this node lacks: refused.
	os.MkdirAll(filepath.Join(kdir, "SM80"), 0o755)
	os.WriteFile(filepath.Join(kdir, "SM80", "k.json"), []byte(`{"hash":"80","target":{"backend":"cuda","arch":80,"warp_size":32}}`), 0o644)
	c, err := kernelcache.Scan(kdir, kernelcache.Options{Kind: src.Caches[0].Kind})
	if err != nil {
		t.Fatal(err)
	}
	if err := kernelcache.CheckCompiledOn(c, gpus); !errors.Is(err, kernelcache.ErrRefused) || !strings.Contains(err.Error(), "cuda arch 80") {
		t.Fatalf("a kernel for another GPU: %v", err)
	}
	os.RemoveAll(filepath.Join(kdir, "SM80"))
	c, err = kernelcache.Scan(kdir, kernelcache.Options{Kind: src.Caches[0].Kind})
	if err != nil {
		t.Fatal(err)
	}
	if err := kernelcache.CheckCompiledOn(c, gpus); err != nil {
		t.Fatal(err)
	}
	if len(c.Entries) != 5 || len(c.Files) != len(tc.Files)+newKernels {
		t.Fatalf("captured %d entries, %d files; want the 3 served and 2 compiled, %d files", len(c.Entries), len(c.Files), len(tc.Files)+newKernels)
	}
	dg := push(c, "oci://"+host+"/kernels/tk:captured")

	// A fresh node serves the captured cache.
	cfg2 := testConfig(t)
	cfg2.InsecureRegistries = []string{host}
	cfg2.GPUInventory = inventoryFile(t, h100Inventory)
	h2 := start(t, cfg2)
	if _, err := h2.pull(api.PullRequest{Name: "warm", Kind: api.KindKernelCache, URI: "oci://" + host + "/kernels/tk:captured",
		Signature: &api.SignaturePolicy{Keys: []string{string(keys.PublicBytes)}}}); err != nil {
		t.Fatal(err)
	}
	a := h2.waitPhase("warm", api.PhaseReady)
	full, _ := h2.c.Get(ctx, "warm")
	if "sha256:"+a.Revision != dg || full.KernelCache == nil || full.KernelCache.Entries != 5 {
		t.Fatalf("the captured cache on a fresh node: %+v", full.KernelCache)
	}
	for _, e := range es {
		if _, err := os.Stat(filepath.Join(cfg2.Root, "kernels", "warm", "current", "io.triton.cache", e.Name())); err != nil {
			t.Fatalf("the compiled kernel %s is not served: %v", e.Name(), err)
		}
	}
	if err := r.unpublish("vol-3", ro); err != nil {
		t.Fatal(err)
	}
}

// pushSigned builds c's image (title: "" for the one the reference
// implies), pushes it to uri and signs it with s, as modelctl kernelcache
// build does: the pushed digest.
func pushSigned(t *testing.T, c *kernelcache.Cache, uri, title string, s kernelcache.Signer) string {
	t.Helper()
	ctx := context.Background()
	reg := kernelcache.Registry{}
	ref, err := reg.ParseRef(uri)
	if err != nil {
		t.Fatal(err)
	}
	if title == "" {
		title = kernelcache.Title(ref)
	}
	b, err := kernelcache.Image(c, kernelcache.ImageOptions{Title: title})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	dref, err := reg.Push(ctx, ref, b)
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.Sign(ctx, dref, s); err != nil {
		t.Fatal(err)
	}
	return dref.DigestStr()
}
