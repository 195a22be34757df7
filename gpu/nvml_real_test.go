//go:build cgo && linux

package gpu

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestRealNVMLMatchesNvidiaSmi runs only where an NVIDIA driver is
// installed (never in CI): it reads the inventory through NVML and holds
// every field against what nvidia-smi prints for the same GPUs.
func TestRealNVMLMatchesNvidiaSmi(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err != nil {
		t.Skip("no NVIDIA driver on this machine (this test runs on a GPU node)")
	}
	out, err := exec.Command("nvidia-smi", "--query-gpu=index,name,uuid,compute_cap,memory.total,driver_version",
		"--format=csv,noheader,nounits").Output()
	if err != nil {
		t.Fatalf("nvidia-smi: %v", err)
	}
	inv := Detect()
	t.Logf("inventory: source %s, driver %s, CUDA %s, reason %q", inv.Source, inv.DriverVersion, inv.CUDADriverVersion, inv.Reason)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if inv.Source != SourceNVML || len(inv.Devices) != len(lines) {
		t.Fatalf("NVML sees %d devices (source %s, reason %q); nvidia-smi %d:\n%s", len(inv.Devices), inv.Source, inv.Reason, len(lines), out)
	}
	for i, line := range lines {
		f := strings.Split(line, ", ")
		if len(f) != 6 {
			t.Fatalf("nvidia-smi line %q", line)
		}
		d := inv.Devices[i]
		t.Logf("GPU %d: %s %s cc %s (%s, %s arch %s warp %d) %d MiB", d.Index, d.Name, d.UUID, d.ComputeCapability, d.Architecture, d.Backend, d.Arch, d.WarpSize, d.MemoryBytes>>20)
		mib, _ := strconv.ParseUint(f[4], 10, 64)
		want := []string{f[0], f[1], f[2], f[3], fmt.Sprint(mib), f[5]}
		got := []string{fmt.Sprint(d.Index), d.Name, d.UUID, d.ComputeCapability, fmt.Sprint(d.MemoryBytes >> 20), inv.DriverVersion}
		for j := range want {
			if got[j] != want[j] {
				t.Errorf("GPU %d field %d: NVML %q, nvidia-smi %q", i, j, got[j], want[j])
			}
		}
		if d.Architecture == "" || d.Architecture == "unknown" || d.Backend != "cuda" || d.WarpSize != 32 {
			t.Errorf("GPU %d derived fields: %+v", i, d)
		}
	}
}
