package gpu

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/modelcache/modelcache/gpu/mcv"
)

// Kernel cache image layout, as GKM's MCV tool writes it: defined once in
// package mcv (which links nothing, so that modelctl can build images by
// it), named here for the daemon's readers.
const (
	TritonCacheDir        = mcv.TritonCacheDir
	TritonManifestDir     = mcv.TritonManifestDir
	VLLMCacheDir          = mcv.VLLMCacheDir
	VLLMManifestDir       = mcv.VLLMManifestDir
	ManifestFile          = mcv.ManifestFile
	TorchInductorCacheDir = mcv.TorchInductorCacheDir

	LabelTritonEntryCount = mcv.LabelTritonEntryCount
	LabelTritonCacheSize  = mcv.LabelTritonCacheSize
	LabelTritonSummary    = mcv.LabelTritonSummary
	LabelVLLMEntryCount   = mcv.LabelVLLMEntryCount
	LabelVLLMCacheSize    = mcv.LabelVLLMCacheSize
	LabelVLLMSummary      = mcv.LabelVLLMSummary
)

// Target is what one compiled kernel needs (mcv.Target).
type Target = mcv.Target

// ParseManifest reads the targets of a kernel cache manifest
// (mcv.ParseManifest).
func ParseManifest(b []byte) ([]Target, error) { return mcv.ParseManifest(b) }

// ParseSummary reads a summary label (mcv.ParseSummary).
func ParseSummary(s string) ([]Target, error) { return mcv.ParseSummary(s) }

// DeviceResult is the verdict of a kernel cache for one GPU
// (api.GPUCompat).
type DeviceResult struct {
	Index      int    `json:"index"`
	UUID       string `json:"uuid,omitempty"`
	Name       string `json:"name,omitempty"`
	Compatible bool   `json:"compatible"`
	// Entries is how many of the cache's entries this GPU can run.
	Entries int    `json:"entries"`
	Reason  string `json:"reason,omitempty"`
}

// Report is the verdict of a kernel cache against the inventory
// (api.Compatibility).
type Report struct {
	// Compatible: at least one GPU runs at least one entry of the cache.
	Compatible bool           `json:"compatible"`
	Simulated  bool           `json:"simulated,omitempty"`
	Targets    int            `json:"targets"`
	Devices    []DeviceResult `json:"devices"`
	Reason     string         `json:"reason,omitempty"`
}

// Check decides, per GPU, whether the cache's entries can run on it. A
// GPU matches an entry when backend, arch and warp size are equal and the
// driver loads the entry's PTX version. The cache is compatible when some
// GPU matches some entry; every mismatch carries its reason.
func Check(inv Inventory, ts []Target) Report {
	r := Report{Simulated: inv.Simulated, Targets: len(ts), Devices: []DeviceResult{}}
	if len(ts) == 0 {
		r.Reason = "the cache lists no entries"
		return r
	}
	if len(inv.Devices) == 0 {
		r.Reason = "this node has no GPU"
		if inv.Reason != "" {
			r.Reason += " (" + inv.Reason + ")"
		}
		return r
	}
	maxPTX := MaxPTX(inv.CUDADriverVersion)
	for _, dv := range inv.Devices {
		res := DeviceResult{Index: dv.Index, UUID: dv.UUID, Name: dv.Name}
		why := map[string]bool{}
		for _, t := range ts {
			switch {
			case t.Backend != dv.Backend:
				why[fmt.Sprintf("backend %s, GPU is %s", t.Backend, dv.Backend)] = true
			case t.Arch != dv.Arch:
				why[fmt.Sprintf("built for arch %s, GPU is %s (%s)", t.Arch, dv.Arch, archName(dv))] = true
			case t.WarpSize != dv.WarpSize:
				why[fmt.Sprintf("warp size %d, GPU has %d", t.WarpSize, dv.WarpSize)] = true
			case t.Backend == "cuda" && t.PTXVersion > 0 && maxPTX > 0 && t.PTXVersion > maxPTX:
				why[fmt.Sprintf("PTX %d.%d is newer than the driver loads (CUDA %s: up to %d.%d); upgrade the driver",
					t.PTXVersion/10, t.PTXVersion%10, inv.CUDADriverVersion, maxPTX/10, maxPTX%10)] = true
			default:
				res.Entries++
			}
		}
		res.Compatible = res.Entries > 0
		if !res.Compatible {
			res.Reason = joinSorted(why)
		} else if res.Entries < len(ts) {
			res.Reason = fmt.Sprintf("%d of %d entries run here; the rest: %s", res.Entries, len(ts), joinSorted(why))
		}
		r.Compatible = r.Compatible || res.Compatible
		r.Devices = append(r.Devices, res)
	}
	if !r.Compatible {
		var parts []string
		for _, d := range r.Devices {
			parts = append(parts, fmt.Sprintf("GPU %d (%s): %s", d.Index, d.Name, d.Reason))
		}
		r.Reason = strings.Join(parts, "; ")
	}
	return r
}

func archName(dv Device) string {
	if dv.Backend == "cuda" {
		return "sm_" + dv.Arch + " " + dv.Architecture
	}
	return dv.Arch
}

func joinSorted(m map[string]bool) string {
	s := make([]string, 0, len(m))
	for k := range m {
		s = append(s, k)
	}
	sort.Strings(s)
	return strings.Join(s, "; ")
}

// ParseSize reads a cache-size-bytes label; -1 when absent or bad.
func ParseSize(s string) int64 {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 {
		return -1
	}
	return n
}
