package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sigstore/cosign/v2/pkg/cosign"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/kernelcache"
	"github.com/modelcache/modelcache/kernelcache/fixtures"
)

// TestBuiltKernelCachesServed: the real Triton and Inductor caches of an
// H200 are built into MCV images by package kernelcache (modelctl
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
	reg := kernelcache.Registry{}
	tritonDir, inductorDir := fixtures.Triton(t), fixtures.Inductor(t)
	build := func(dir, repo string) (*kernelcache.Cache, string) {
		c, err := kernelcache.Scan(dir, kernelcache.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ref, _ := reg.ParseRef("oci://" + host + "/" + repo)
		b, err := kernelcache.Image(c, kernelcache.ImageOptions{Title: kernelcache.Title(ref)})
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
		return c, dref.DigestStr()
	}
	tc, tdg := build(tritonDir, "kernels/tk:h200")
	ic, idg := build(inductorDir, "kernels/ind:h200")

	cfg := testConfig(t)
	cfg.InsecureRegistries = []string{host}
	cfg.GPUInventory = inventoryFile(t, h100Inventory) // sm_90, as the H200
	h := start(t, cfg)
	policy := &api.SignaturePolicy{Keys: []string{string(keys.PublicBytes)}}
	fs := newFileServer(t, map[string][]byte{"m/config.json": []byte(`{"model_type":"llama"}`)})
	if _, err := h.pull(api.PullRequest{Name: "mlp", URI: fs.URL + "/m/config.json", KernelCaches: []api.KernelCacheRef{
		{Name: "mlp-triton", URI: "oci://" + host + "/kernels/tk:h200", Signature: policy},
		{Name: "mlp-inductor", URI: "oci://" + host + "/kernels/ind:h200", Signature: policy},
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
