package gpu

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func writeInventory(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "gpus.json")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

const (
	h100 = `{"driverVersion":"550.54.15","cudaDriverVersion":"12.4","devices":[
	  {"name":"NVIDIA H100 80GB HBM3","uuid":"GPU-h100-0","computeCapability":"9.0","memoryBytes":85520809984},
	  {"name":"NVIDIA H100 80GB HBM3","uuid":"GPU-h100-1","computeCapability":"9.0","memoryBytes":85520809984}]}`
	a100  = `{"driverVersion":"535.104.05","cudaDriverVersion":"12.2","devices":[{"name":"NVIDIA A100-SXM4-40GB","uuid":"GPU-a100-0","computeCapability":"8.0","memoryBytes":42949672960}]}`
	noGPU = `{"devices":[]}`
)

// MCV-style Triton manifest entries: arch is a number for cuda.
const (
	sm90Manifest = `{"triton":[{"hash":"a","backend":"cuda","arch":90,"warp_size":32,"ptx_version":84,"num_stages":3,"num_warps":4},
	  {"hash":"b","backend":"cuda","arch":90,"warp_size":32,"ptx_version":84}]}`
	sm80Manifest = `[{"hash":"c","backend":"cuda","arch":80,"warp_size":32,"ptx_version":82}]`
)

func TestLoadSimulatedFillsDerivedFields(t *testing.T) {
	inv, err := Load(writeInventory(t, h100))
	if err != nil {
		t.Fatal(err)
	}
	if !inv.Simulated || inv.Source != SourceSimulated {
		t.Fatalf("a file inventory must be marked simulated: %+v", inv)
	}
	d := inv.Devices[1]
	if d.Index != 1 || d.Arch != "90" || d.Architecture != "Hopper" || d.Backend != "cuda" || d.WarpSize != 32 {
		t.Fatalf("derived fields: %+v", d)
	}
	if _, err := Load(writeInventory(t, `{"devices":[{"name":"x","computeCapability":"nine"}]}`)); err == nil || !strings.Contains(err.Error(), "major.minor") {
		t.Fatalf("a bad compute capability must be named: %v", err)
	}
	if _, err := Load(writeInventory(t, `{"devices":[],"gpus":1}`)); err == nil || !strings.Contains(err.Error(), "gpus") {
		t.Fatalf("an unknown field must be named: %v", err)
	}
}

func TestDetectWithoutDriverIsEmptyWithReason(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("this machine has an NVIDIA driver")
	}
	inv := Detect()
	if len(inv.Devices) != 0 || inv.Source != SourceNone || inv.Reason == "" {
		t.Fatalf("no driver must give an empty inventory with a reason: %+v", inv)
	}
}

func TestCheckPerGPU(t *testing.T) {
	load := func(s string) Inventory {
		inv, err := Load(writeInventory(t, s))
		if err != nil {
			t.Fatal(err)
		}
		return inv
	}
	ts90, err := ParseManifest([]byte(sm90Manifest))
	if err != nil {
		t.Fatal(err)
	}
	ts80, err := ParseManifest([]byte(sm80Manifest))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		inv    string
		ts     []Target
		ok     bool
		reason string
	}{
		{"sm90 cache on H100", h100, ts90, true, ""},
		{"sm90 cache on A100", a100, ts90, false, "built for arch 90, GPU is 80 (sm_80 Ampere)"},
		{"sm80 cache on A100", a100, ts80, true, ""},
		{"sm80 cache on H100", h100, ts80, false, "built for arch 80, GPU is 90"},
		{"no GPU", noGPU, ts90, false, "no GPU"},
		// PTX 8.4 needs CUDA 12.4; the A100 node's driver is 12.2.
		{"ptx too new", a100, []Target{{Backend: "cuda", Arch: "80", WarpSize: 32, PTXVersion: 84}}, false, "PTX 8.4 is newer than the driver loads (CUDA 12.2: up to 8.2)"},
		{"hip cache on cuda", h100, []Target{{Backend: "hip", Arch: "gfx90a", WarpSize: 64}}, false, "backend hip, GPU is cuda"},
	}
	for _, c := range cases {
		r := Check(load(c.inv), c.ts)
		if r.Compatible != c.ok || !strings.Contains(r.Reason, c.reason) {
			t.Errorf("%s: compatible=%v reason=%q; want %v and %q", c.name, r.Compatible, r.Reason, c.ok, c.reason)
		}
		if !r.Simulated {
			t.Errorf("%s: report of a simulated inventory must say so", c.name)
		}
	}
	// Every GPU gets its own verdict.
	r := Check(load(h100), ts90)
	if len(r.Devices) != 2 || !r.Devices[0].Compatible || r.Devices[1].Entries != 2 || r.Devices[1].UUID != "GPU-h100-1" {
		t.Fatalf("per-GPU results: %+v", r.Devices)
	}
}

func TestParseFormats(t *testing.T) {
	vllm := `{"vllm":[{"cache_format":"triton","triton_cache_entries":[{"hash":"x","target":{"backend":"cuda","arch":90,"warp_size":32},"ptx_version":83}]}]}`
	ts, err := ParseManifest([]byte(vllm))
	if err != nil || len(ts) != 1 || ts[0] != (Target{Backend: "cuda", Arch: "90", WarpSize: 32, PTXVersion: 83}) {
		t.Fatalf("vllm manifest: %+v %v", ts, err)
	}
	ts, err = ParseSummary(`{"targets":[{"backend":"rocm","arch":"gfx90a","warp_size":64}]}`)
	if err != nil || ts[0] != (Target{Backend: "hip", Arch: "gfx90a", WarpSize: 64}) {
		t.Fatalf("summary: %+v %v", ts, err)
	}
	for _, bad := range []string{`{"triton":[{"backend":"cuda","warp_size":32}]}`, `{"triton":[{"backend":"cuda","arch":[9],"warp_size":32}]}`, `nonsense`} {
		if _, err := ParseManifest([]byte(bad)); err == nil {
			t.Errorf("manifest %s must be refused", bad)
		}
	}
}

func TestMaxPTX(t *testing.T) {
	for v, want := range map[string]int{"11.8": 78, "12.0": 80, "12.4": 84, "12.6": 85, "12.8": 87, "12.9": 88, "13.0": 90, "": 0} {
		if got := MaxPTX(v); got != want {
			t.Errorf("MaxPTX(%q) = %d, want %d", v, got, want)
		}
	}
}

// TestRealTritonMetadataFromH100 holds the parser against a kernel's
// metadata exactly as Triton 3.6.0 wrote it on an H100 (driver 580.159.04,
// CUDA 13.0): the target nests under "target", the top level also carries
// "arch": "sm90" and "backend_name", and "ptx_version" is null.
func TestRealTritonMetadataFromH100(t *testing.T) {
	b, err := os.ReadFile("testdata/triton-3.6.0-h100-add.json")
	if err != nil {
		t.Fatal(err)
	}
	ts, err := ParseManifest([]byte("[" + string(b) + "]"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 1 || ts[0] != (Target{Backend: "cuda", Arch: "90", WarpSize: 32}) {
		t.Fatalf("targets %+v, want one cuda arch 90 warp 32 without a PTX version", ts)
	}
	// The inventory as NVML reported that H100.
	h100, err := Load(writeInventory(t, `{"driverVersion":"580.159.04","cudaDriverVersion":"13.0","devices":[
	  {"name":"NVIDIA H100 80GB HBM3","uuid":"GPU-233dfdc7-4ffe-e0be-8248-336ab1069beb","computeCapability":"9.0","memoryBytes":85520809984}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if r := Check(h100, ts); !r.Compatible || r.Devices[0].Entries != 1 {
		t.Fatalf("the H100 that built it must run it: %+v", r)
	}
	a, err := Load(writeInventory(t, a100))
	if err != nil {
		t.Fatal(err)
	}
	if r := Check(a, ts); r.Compatible || !strings.Contains(r.Devices[0].Reason, "arch 90") {
		t.Fatalf("an A100 must be refused, naming the arch: %+v", r)
	}
}
