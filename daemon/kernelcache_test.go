package daemon

import (
	"archive/tar"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/daemon/kernels"
	"github.com/modelcache/modelcache/fetchers/oci/ocitest"
	"github.com/modelcache/modelcache/gpu"
	"github.com/modelcache/modelcache/internal/testenv"
)

const h100Inventory = `{"driverVersion":"550.54.15","cudaDriverVersion":"12.4","devices":[
  {"name":"NVIDIA H100 80GB HBM3","uuid":"GPU-0000","computeCapability":"9.0","memoryBytes":85520809984}]}`

func inventoryFile(t testing.TB, body string) string {
	p := filepath.Join(t.TempDir(), "gpus.json")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestKernelCachesSignedAndCompatible runs the whole kernel cache path
// against Debian's docker-registry with images signed by the real cosign
// CLIs, on a simulated H100 node.
func TestKernelCachesSignedAndCompatible(t *testing.T) {
	host := testenv.Registry(t)
	cs := ocitest.NewCosign(t)
	key, pub := cs.KeyPair(t, "kc")
	pubPEM, _ := os.ReadFile(pub)
	policy := &api.SignaturePolicy{Keys: []string{string(pubPEM)}}

	cubin90, cubin80 := data(300<<10, 90), data(200<<10, 80)
	dg90 := ocitest.Push(t, host, "kernels/llama:sm90", ocitest.SM90(map[string][]byte{"h90/kernel.cubin": cubin90, "h90/kernel.json": []byte(`{"name":"k"}`)}).Image(t))
	dg80 := ocitest.Push(t, host, "kernels/llama:sm80", ocitest.SM80(map[string][]byte{"h80/kernel.cubin": cubin80}).Image(t))
	cs.SignV2(t, key, host+"/kernels/llama@"+dg90)
	cs.SignV3(t, key, host+"/kernels/llama@"+dg80) // the bundle format goes through the same path

	cfg := testConfig(t)
	cfg.InsecureRegistries = []string{host}
	cfg.GPUInventory = inventoryFile(t, h100Inventory)
	h := start(t, cfg)
	ctx := context.Background()

	g, err := h.c.GPU(ctx)
	if err != nil || !g.Simulated || len(g.Devices) != 1 || g.Devices[0].Arch != "90" {
		t.Fatalf("gpu inventory over the socket: %+v %v", g, err)
	}

	// A model that lists a kernel cache per architecture: the node takes
	// the sm_90 one and records the sm_80 one Incompatible.
	fs := newFileServer(t, map[string][]byte{"m/config.json": []byte(`{"model_type":"llama"}`)})
	if _, err := h.pull(api.PullRequest{Name: "llama", URI: fs.URL + "/m/config.json", KernelCaches: []api.KernelCacheRef{
		{URI: "oci://" + host + "/kernels/llama:sm90", Signature: policy},
		{URI: "oci://" + host + "/kernels/llama:sm80", Signature: policy},
	}}); err != nil {
		t.Fatal(err)
	}
	kc0 := h.waitPhase("llama.kc0", api.PhaseReady)
	kc1 := h.waitPhase("llama.kc1", api.PhaseIncompatible)
	if kc0.Kind != api.KindKernelCache || kc0.Revision != strings.TrimPrefix(dg90, "sha256:") {
		t.Fatalf("kernel cache pinned to the signed digest: %+v", kc0)
	}
	tree := filepath.Join(cfg.Root, "kernels", "llama.kc0", "current")
	if b, err := os.ReadFile(filepath.Join(tree, "io.triton.cache/h90/kernel.cubin")); err != nil || string(b) != string(cubin90) {
		t.Fatalf("extracted cubin: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(tree, "io.triton.cache/h90/kernel.cubin")); err != nil || fi.Mode().Perm()&0o222 != 0 {
		t.Fatalf("kernel cache files must be read-only: %v %v", fi.Mode(), err)
	}
	if h.d.store.HasBlob("sha256:" + sha(cubin80)) {
		t.Fatal("the incompatible kernel cache's layer was downloaded")
	}
	if kc1.Reason != api.ReasonIncompatible || !strings.Contains(kc1.Message, "built for arch 80, GPU is 90") {
		t.Fatalf("incompatible reason: %+v", kc1)
	}
	full, err := h.c.Get(ctx, "llama.kc0")
	if err != nil {
		t.Fatal(err)
	}
	info := full.KernelCache
	if info == nil || info.Signature == nil || !info.Signature.Verified || info.Signature.Digest != dg90 ||
		info.Compatibility == nil || !info.Compatibility.Compatible || len(info.Compatibility.Devices) != 1 || !info.Compatibility.Simulated ||
		info.Serves != "llama" || info.CacheBytes != int64(len(cubin90)+len(`{"name":"k"}`)) {
		t.Fatalf("inspect must show signature, per-GPU compatibility and extraction: %+v", info)
	}
	in1, _ := h.c.Get(ctx, "llama.kc1")
	if in1.KernelCache == nil || in1.KernelCache.Signature == nil || !in1.KernelCache.Signature.Verified || in1.KernelCache.Signature.Format != "sigstore-bundle" {
		t.Fatalf("the v3 bundle of the sm80 image verifies before the compatibility check: %+v", in1.KernelCache)
	}
	env, err := h.c.Env(ctx, "llama")
	if err != nil || env["TRITON_CACHE_DIR"] != filepath.Join(tree, "io.triton.cache") || env["MODEL_PATH"] == "" {
		t.Fatalf("env of the model: %v %v", env, err)
	}

	// The same from a models.d file, the key named by its path on the node.
	os.MkdirAll(cfg.ModelsDir, 0o755)
	yml := "name: filemodel\nuri: " + fs.URL + "/m/config.json\nkernelCaches:\n  - name: filemodel-sm90\n    uri: oci://" + host + "/kernels/llama:sm90\n    signature: {keys: [" + pub + "]}\n"
	if err := os.WriteFile(filepath.Join(cfg.ModelsDir, "filemodel.yaml"), []byte(yml), 0o644); err != nil {
		t.Fatal(err)
	}
	if a := h.waitPhase("filemodel-sm90", api.PhaseReady); a.KernelCache == nil || a.Revision != strings.TrimPrefix(dg90, "sha256:") {
		t.Fatalf("kernel cache from models.d: %+v", a)
	}

	// Unsigned: refused before any layer is fetched.
	unsigned := data(100<<10, 7)
	ocitest.Push(t, host, "kernels/unsigned:v1", ocitest.SM90(map[string][]byte{"x/k.cubin": unsigned}).Image(t))
	_, err = h.pull(api.PullRequest{Name: "unsigned", Kind: api.KindKernelCache, URI: "oci://" + host + "/kernels/unsigned:v1", Signature: policy})
	if err == nil || !strings.Contains(err.Error(), "no signature") {
		t.Fatalf("an unsigned kernel cache must fail: %v", err)
	}
	if a, _ := h.c.Get(ctx, "unsigned"); a.Reason != api.ReasonSignatureFailed || h.d.store.HasBlob("sha256:"+sha(unsigned)) {
		t.Fatalf("reason %q; layer fetched: %v", a.Reason, h.d.store.HasBlob("sha256:"+sha(unsigned)))
	}

	// The tag moves to an unsigned image: the next pull fails and the
	// signed digest stays what is served.
	first := data(64<<10, 1)
	dgA := ocitest.Push(t, host, "kernels/solo:v1", ocitest.SM90(map[string][]byte{"a/k.cubin": first}).Image(t))
	cs.SignV2(t, key, host+"/kernels/solo@"+dgA)
	solo := api.PullRequest{Name: "solo", Kind: api.KindKernelCache, URI: "oci://" + host + "/kernels/solo:v1", Signature: policy}
	if _, err := h.pull(solo); err != nil {
		t.Fatal(err)
	}
	ocitest.Push(t, host, "kernels/solo:v1", ocitest.SM90(map[string][]byte{"a/k.cubin": data(64<<10, 2)}).Image(t))
	if _, err := h.pull(solo); err == nil || !strings.Contains(err.Error(), "no signature") || !strings.Contains(err.Error(), "is still served") {
		t.Fatalf("a moved tag pointing at an unsigned image must fail, and say what is served: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(cfg.Root, "kernels/solo/current/io.triton.cache/a/k.cubin")); string(b) != string(first) {
		t.Fatal("the signed version must stay served")
	}

	// Labels that disagree with the extracted bytes; a hostile tar entry.
	bad := ocitest.SM90(map[string][]byte{"b/k.cubin": data(1000, 3)})
	bad.SizeLabel = 999
	dgBad := ocitest.Push(t, host, "kernels/badsize:v1", bad.Image(t))
	cs.SignV2(t, key, host+"/kernels/badsize@"+dgBad)
	if _, err := h.pull(api.PullRequest{Name: "badsize", Kind: api.KindKernelCache, URI: "oci://" + host + "/kernels/badsize:v1", Signature: policy}); err == nil || !strings.Contains(err.Error(), "cache-size-bytes says 999") {
		t.Fatalf("size label mismatch: %v", err)
	}
	evil := ocitest.SM90(map[string][]byte{"c/k.cubin": data(10, 4)})
	evil.Extra = []*tar.Header{{Name: "../../escape", Typeflag: tar.TypeReg, Mode: 0o644, Size: 3}}
	dgEvil := ocitest.Push(t, host, "kernels/evil:v1", evil.Image(t))
	cs.SignV2(t, key, host+"/kernels/evil@"+dgEvil)
	if _, err := h.pull(api.PullRequest{Name: "evil", Kind: api.KindKernelCache, URI: "oci://" + host + "/kernels/evil:v1", Signature: policy}); err == nil {
		t.Fatal("a signed image with a path-traversal entry must still be refused")
	}
	if _, err := os.Stat(filepath.Join(cfg.Root, "..", "escape")); err == nil {
		t.Fatal("a tar entry escaped the root")
	}

	// Metrics: signature and compatibility results, the GPU, kernel bytes.
	resp, err := http.Get("http://" + h.d.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// (failed pulls are retried, so the unsigned count grows while the test runs)
	if n := metricValue(string(body), `modelcache_signature_verifications_total{result="unsigned"}`); n < 2 {
		t.Errorf("unsigned verifications: %v, want at least the 2 pulls of unsigned images", n)
	}
	if n := metricValue(string(body), `modelcache_signature_verifications_total{result="verified"}`); n < 5 {
		t.Errorf("verified signatures: %v, want at least 5", n)
	}
	for _, want := range []string{`modelcache_kernelcache_compat_checks_total{result="incompatible"} 1`,
		`modelcache_gpu_info{architecture="Hopper",compute_capability="9.0",cuda_driver_version="12.4",driver_version="550.54.15",index="0",name="NVIDIA H100 80GB HBM3",source="simulated",uuid="GPU-0000"} 1`,
		`modelcache_artifacts{phase="Incompatible"} 1`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if !strings.Contains(string(body), "modelcache_kernelcache_bytes ") || strings.Contains(string(body), "modelcache_kernelcache_bytes 0\n") {
		t.Error("kernel cache bytes must count the Ready caches")
	}

	u, err := h.c.Usage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range u.Artifacts {
		if (a.Name == "llama" && a.KernelCacheBytes != kc0.Bytes) || (a.Name == "llama.kc0" && a.Serves != "llama") {
			t.Errorf("du must count the kernel cache with its model: %+v (kernel cache %d bytes)", a, kc0.Bytes)
		}
	}

	// Bad kernel cache desires are refused with the reason.
	for _, c := range []struct {
		req  api.PullRequest
		want string
	}{
		{api.PullRequest{Name: "k1", Kind: api.KindKernelCache, URI: "https://example.com/k.tar"}, "is an OCI image"},
		{api.PullRequest{Name: "k2", Kind: api.KindKernelCache, URI: "oci://" + host + "/x:y", Signature: &api.SignaturePolicy{Keys: []string{"/etc/shadow"}}}, "must be PEM text"},
		{api.PullRequest{Name: "k3", Kind: api.KindKernelCache, URI: "oci://" + host + "/x:y", Signature: &api.SignaturePolicy{Policy: "maybe"}}, "use required or off"},
		{api.PullRequest{Name: "k4", Kind: api.KindKernelCache, URI: "oci://" + host + "/x:y", Signature: &api.SignaturePolicy{Identity: "a@b"}}, "needs trustedRoot"},
		{api.PullRequest{Name: "k5", URI: fs.URL + "/m/config.json", KernelCaches: []api.KernelCacheRef{{URI: "s3://b/k"}}}, "not an oci:// image"},
		{api.PullRequest{Name: "k6", Kind: "weights", URI: fs.URL + "/m/config.json"}, `kind "weights"`},
	} {
		if _, err := h.pull(c.req); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want an error with %q", c.req.Name, err, c.want)
		}
	}

	// Evicting the model takes its kernel caches with it.
	res, err := h.c.Evict(ctx, "llama", "", false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(tree); !os.IsNotExist(err) || !strings.Contains(strings.Join(res.Revisions, " "), "llama.kc0@") {
		t.Fatalf("the model's kernel cache must go with it: %+v %v", res, err)
	}
}

// TestKernelCacheOnNodeWithoutGPU: no driver, no simulated GPUs: every
// kernel cache is Incompatible, with the reason, and nothing is fetched.
func TestKernelCacheOnNodeWithoutGPU(t *testing.T) {
	host := testenv.Registry(t)
	cubin := data(50<<10, 9)
	ocitest.Push(t, host, "kernels/x:v1", ocitest.SM90(map[string][]byte{"h/k.cubin": cubin}).Image(t))
	cfg := testConfig(t)
	cfg.InsecureRegistries = []string{host}
	cfg.GPUInventory = inventoryFile(t, `{"devices":[]}`)
	cfg.KernelCacheSignaturePolicy = api.PolicyOff // a node that lets pulls skip signatures
	h := start(t, cfg)
	_, err := h.pull(api.PullRequest{Name: "x", Kind: api.KindKernelCache, URI: "oci://" + host + "/kernels/x:v1", Signature: &api.SignaturePolicy{Policy: api.PolicyOff}})
	if err == nil || !strings.Contains(err.Error(), "not for this node") || !strings.Contains(err.Error(), "no GPU") {
		t.Fatalf("a kernel cache on a node without GPUs: %v", err)
	}
	if h.d.store.HasBlob("sha256:" + sha(cubin)) {
		t.Fatal("downloaded a kernel cache no GPU here can run")
	}
	if env, err := h.c.Env(context.Background(), "x"); err == nil {
		t.Fatalf("env of an artifact that is not Ready must fail: %v", env)
	}
}

// metricValue reads one sample of a text exposition; -1 when absent.
func metricValue(body, series string) float64 {
	for _, l := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// TestGPUViewsKeepEveryField: gpu mirrors api's GPU types; the views
// between them keep every field (a field added on one side only fails
// here, or fails to compile in the device conversions).
func TestGPUViewsKeepEveryField(t *testing.T) {
	inv := gpu.Inventory{Source: "simulated", Simulated: true, Reason: "r", DriverVersion: "550.1", CUDADriverVersion: "12.4",
		DetectedAt: time.Unix(1700000000, 0).UTC(), Devices: []gpu.Device{{Index: 1, Name: "H100", UUID: "GPU-1", ComputeCapability: "9.0",
			Architecture: "Hopper", MemoryBytes: 80 << 30, Backend: "cuda", Arch: "90", WarpSize: 32}}}
	rep := gpu.Report{Compatible: true, Simulated: true, Targets: 2, Reason: "r",
		Devices: []gpu.DeviceResult{{Index: 1, UUID: "GPU-1", Name: "H100", Compatible: true, Entries: 3, Reason: "ok"}}}
	for _, pair := range [][2]any{{inv, kernels.GPUView(inv)}, {rep, kernels.CompatView(rep)}} {
		a, _ := json.Marshal(pair[0])
		b, _ := json.Marshal(pair[1])
		if string(a) != string(b) {
			t.Errorf("the view drops or renames a field:\n gpu %s\n api %s", a, b)
		}
		for _, v := range []any{pair[0]} {
			var m map[string]any
			json.Unmarshal(a, &m)
			if n := reflect.TypeOf(v).NumField(); len(m) != n {
				t.Errorf("%T: %d fields, %d set in the sample: set them all", v, n, len(m))
			}
		}
	}
}
