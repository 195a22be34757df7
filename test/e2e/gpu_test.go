package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers/oci/ocitest"
	"github.com/modelcache/modelcache/internal/testenv"
)

// TestModelctlGPUAndKernelCache drives the real binaries: modelctl gpu on
// a node without a driver and on a simulated one, and a signed kernel
// cache pulled with modelctl pull --kind kernelcache --key, then env.
func TestModelctlGPUAndKernelCache(t *testing.T) {
	// This machine has no NVIDIA driver: an empty inventory and why.
	e := newEnv(t)
	e.start()
	out := e.mustCtl("gpu")
	if !strings.Contains(out, "no GPU") || !strings.Contains(out, "libnvidia-ml.so.1") || strings.Contains(out, "SIMULATED") {
		t.Fatalf("modelctl gpu without a driver: %q", out)
	}
	e.stop()

	host := testenv.Registry(t)
	cs := ocitest.NewCosign(t)
	key, pub := cs.KeyPair(t, "e2e")
	cubin := data(128<<10, 5)
	dg := ocitest.Push(t, host, "kernels/e2e:sm90", ocitest.SM90(map[string][]byte{"h/k.cubin": cubin}).Image(t))
	cs.SignV2(t, key, host+"/kernels/e2e@"+dg)

	inv := filepath.Join(e.dir, "gpus.json")
	os.WriteFile(inv, []byte(`{"driverVersion":"550.54.15","cudaDriverVersion":"12.4","devices":[{"name":"NVIDIA H100 80GB HBM3","uuid":"GPU-e2e","computeCapability":"9.0","memoryBytes":85520809984}]}`), 0o644)
	e.flags = []string{"--gpu-inventory", inv, "--insecure-registry", host}
	e.start()
	out = e.mustCtl("gpu")
	if !strings.Contains(out, "SIMULATED") || !strings.Contains(out, "NVIDIA H100 80GB HBM3") || !strings.Contains(out, "9.0 (sm_90)") || !strings.Contains(out, "Hopper") {
		t.Fatalf("modelctl gpu on a simulated H100: %q", out)
	}
	var g api.GPUInventory
	if err := json.Unmarshal([]byte(e.mustCtl("gpu", "-o", "json")), &g); err != nil || !g.Simulated || g.Devices[0].UUID != "GPU-e2e" {
		t.Fatalf("modelctl gpu -o json: %+v %v", g, err)
	}

	// Without a key or identity, the CLI refuses before asking the daemon.
	if r := e.ctl(nil, "pull", "--kind", "kernelcache", "--name", "kc", "oci://"+host+"/kernels/e2e:sm90"); r.code != 2 || !strings.Contains(r.stderr, "--key") {
		t.Fatalf("unsigned-policy pull: exit %d %q", r.code, r.stderr)
	}
	out = e.mustCtl("pull", "--kind", "kernelcache", "--name", "kc", "--key", pub, "oci://"+host+"/kernels/e2e:sm90")
	if !strings.Contains(out, "kc: Ready at "+filepath.Join(e.root, "kernels/kc/current")) {
		t.Fatalf("pull output %q", out)
	}
	if b, err := os.ReadFile(filepath.Join(e.root, "kernels/kc/current/io.triton.cache/h/k.cubin")); err != nil || string(b) != string(cubin) {
		t.Fatalf("extracted kernel: %v", err)
	}
	if out := e.mustCtl("env", "kc"); out != "export TRITON_CACHE_DIR='"+filepath.Join(e.root, "kernels/kc/current/io.triton.cache")+"'\n" {
		t.Fatalf("modelctl env: %q", out)
	}
	if out := e.mustCtl("inspect", "kc"); !strings.Contains(out, "This node:") || !strings.Contains(out, "compatible (simulated GPUs)") {
		t.Errorf("inspect for people lacks the verdict:\n%s", out)
	}
	out = e.mustCtl("inspect", "kc", "-o", "yaml")
	for _, want := range []string{"verified: true", "format: cosign-sig-tag", "compatible: true", "extractSeconds:", "simulated: true"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect lacks %q:\n%s", want, out)
		}
	}
}
