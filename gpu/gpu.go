// Package gpu is the node's GPU inventory and the compatibility check of a
// kernel cache against it.
//
// The inventory comes from NVIDIA NVML (github.com/NVIDIA/go-nvml), which
// loads libnvidia-ml.so.1 at run time: a node without the driver or the
// library gets an empty inventory and the reason, never an error that
// stops the daemon. A JSON file can describe a simulated node instead
// (tests, and nodes where NVML is unavailable); such an inventory is
// marked Simulated everywhere it shows.
//
// Where to find what:
//
//	gpu.go         Inventory and Device, Detect, Load (the JSON file), Family, MaxPTX
//	nvml.go        the inventory read through NVML (cgo, Linux)
//	nvml_other.go  its stand-in where cgo or Linux is missing: an empty
//	               inventory that says why
//	compat.go      a kernel cache's targets (ParseManifest, ParseSummary) and
//	               Check against an inventory
package gpu

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Inventory sources.
const (
	SourceNVML      = "nvml"
	SourceSimulated = "simulated"
	SourceNone      = "none"
)

// Inventory is what this node's GPUs are. It mirrors the socket API's
// api.GPUInventory field for field (the daemon converts; a conversion
// that no longer compiles says the two drifted), so that this package
// links nothing else of the module and modelctl shows GPUs without NVML.
type Inventory struct {
	// Source is nvml, simulated (from --gpu-inventory) or none.
	Source    string `json:"source"`
	Simulated bool   `json:"simulated,omitempty"`
	// Reason says why the inventory is empty or partial (no driver, NVML
	// error on one device).
	Reason            string    `json:"reason,omitempty"`
	DriverVersion     string    `json:"driverVersion,omitempty"`
	CUDADriverVersion string    `json:"cudaDriverVersion,omitempty"` // e.g. "12.4"
	Devices           []Device  `json:"devices"`
	DetectedAt        time.Time `json:"detectedAt"`
}

// Device is one GPU (api.GPUDevice).
type Device struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	UUID  string `json:"uuid"`
	// ComputeCapability is major.minor, e.g. "9.0" (sm_90).
	ComputeCapability string `json:"computeCapability"`
	// Architecture is the family: Volta, Turing, Ampere, Ada, Hopper,
	// Blackwell (or an AMD gfx name in a simulated inventory).
	Architecture string `json:"architecture"`
	MemoryBytes  uint64 `json:"memoryBytes"`
	// Backend is what kernels target: cuda (every NVML device) or hip.
	Backend string `json:"backend"`
	// Arch is the kernel target as Triton names it: "90" for sm_90,
	// "gfx90a" for an AMD device.
	Arch     string `json:"arch"`
	WarpSize int    `json:"warpSize"`
}

// Detect reads the inventory from NVML. Without the driver it returns an
// empty inventory whose Reason says so.
func Detect() Inventory {
	inv := detectNVML()
	inv.DetectedAt = time.Now().UTC()
	return inv
}

// Load reads a simulated inventory from a JSON file: {"driverVersion",
// "cudaDriverVersion", "devices": [{"name", "uuid", "computeCapability",
// "memoryBytes", "backend", "arch", "warpSize"}]}. Missing derived fields
// (architecture, arch, backend, warp size, index) are filled in.
func Load(path string) (Inventory, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Inventory{}, fmt.Errorf("--gpu-inventory: %w", err)
	}
	var inv Inventory
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&inv); err != nil {
		return Inventory{}, fmt.Errorf("--gpu-inventory %s: %w; see README (GPU inventory) for the format", path, err)
	}
	inv.Source, inv.Simulated = SourceSimulated, true
	if inv.Reason == "" {
		inv.Reason = "simulated from " + path
	}
	for i := range inv.Devices {
		dv := &inv.Devices[i]
		if dv.Index == 0 {
			dv.Index = i
		}
		if dv.Backend == "" {
			dv.Backend = "cuda"
		}
		if dv.Backend == "cuda" {
			major, minor, err := parseCC(dv.ComputeCapability)
			if err != nil {
				return Inventory{}, fmt.Errorf("--gpu-inventory %s: device %d: %w", path, i, err)
			}
			if dv.Arch == "" {
				dv.Arch = strconv.Itoa(major*10 + minor)
			}
			if dv.Architecture == "" {
				dv.Architecture = Family(major, minor)
			}
		} else if dv.Arch == "" {
			return Inventory{}, fmt.Errorf("--gpu-inventory %s: device %d: backend %s needs \"arch\" (e.g. gfx90a)", path, i, dv.Backend)
		}
		if dv.WarpSize == 0 {
			dv.WarpSize = 32
			if dv.Backend == "hip" {
				dv.WarpSize = 64
			}
		}
	}
	inv.DetectedAt = time.Now().UTC()
	return inv, nil
}

func parseCC(s string) (int, int, error) {
	a, b, ok := strings.Cut(s, ".")
	major, err1 := strconv.Atoi(a)
	minor, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || major < 1 || minor < 0 {
		return 0, 0, fmt.Errorf("computeCapability %q: write major.minor, e.g. 9.0", s)
	}
	return major, minor, nil
}

// Family names the architecture of a CUDA compute capability.
func Family(major, minor int) string {
	switch {
	case major == 7 && minor < 5:
		return "Volta"
	case major == 7:
		return "Turing"
	case major == 8 && minor == 9:
		return "Ada"
	case major == 8:
		return "Ampere"
	case major == 9:
		return "Hopper"
	case major == 10 || major == 12:
		return "Blackwell"
	case major == 6:
		return "Pascal"
	}
	return "unknown"
}

// MaxPTX is the newest PTX ISA version (as Triton writes it: 84 for 8.4)
// that a driver of this CUDA version can load; 0 when unknown.
func MaxPTX(cudaDriverVersion string) int {
	major, minor, err := parseCC(cudaDriverVersion)
	if err != nil {
		return 0
	}
	switch {
	case major == 11:
		return 70 + minor // 11.0 → 7.0 … 11.8 → 7.8
	case major == 12 && minor <= 5:
		return 80 + minor // 12.0 → 8.0 … 12.5 → 8.5
	case major == 12 && minor == 6:
		return 85
	case major == 12 && minor == 7:
		return 86
	case major == 12:
		return 87 + (minor - 8) // 12.8 → 8.7, 12.9 → 8.8
	case major >= 13:
		return 90 + (major-13)*10 + minor
	}
	return 0
}

// ErrNoGPU is the reason of an empty inventory.
var ErrNoGPU = errors.New("no GPU")
