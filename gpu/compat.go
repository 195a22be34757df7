package gpu

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// Kernel cache image layout, as GKM's MCV tool writes it: one layer with
// the cache directory and a manifest of its entries.
const (
	TritonCacheDir    = "io.triton.cache"
	TritonManifestDir = "io.triton.manifest"
	VLLMCacheDir      = "io.vllm.cache"
	VLLMManifestDir   = "io.vllm.manifest"
	ManifestFile      = "manifest.json"
	// TorchInductorCacheDir is a torch.compile (Inductor) cache packed the
	// same way; it has no manifest of its own.
	TorchInductorCacheDir = "io.torchinductor.cache"

	LabelTritonEntryCount = "cache.triton.image/entry-count"
	LabelTritonCacheSize  = "cache.triton.image/cache-size-bytes"
	LabelTritonSummary    = "cache.triton.image/summary"
	LabelVLLMEntryCount   = "cache.vllm.image/entry-count"
	LabelVLLMCacheSize    = "cache.vllm.image/cache-size-bytes"
	LabelVLLMSummary      = "cache.vllm.image/summary"
)

// Target is what one compiled kernel needs: backend (cuda, hip), arch
// ("90" for sm_90, "gfx90a"), warp size and, for cuda, the PTX ISA version
// (84 for 8.4; 0 when the entry does not say).
type Target struct {
	Backend    string `json:"backend"`
	Arch       string `json:"arch"`
	WarpSize   int    `json:"warpSize"`
	PTXVersion int    `json:"ptxVersion,omitempty"`
}

func (t Target) String() string {
	s := fmt.Sprintf("%s arch %s warp %d", t.Backend, t.Arch, t.WarpSize)
	if t.PTXVersion > 0 {
		s += fmt.Sprintf(" ptx %d.%d", t.PTXVersion/10, t.PTXVersion%10)
	}
	return s
}

// entry is one manifest entry or summary target as MCV writes it. Arch is
// a number for cuda (90) and a string for hip ("gfx90a").
type entry struct {
	Backend    string          `json:"backend"`
	Arch       json.RawMessage `json:"arch"`
	WarpSize   int             `json:"warp_size"`
	PTXVersion int             `json:"ptx_version"`
	// Triton's own cache metadata nests the target.
	Target *struct {
		Backend  string          `json:"backend"`
		Arch     json.RawMessage `json:"arch"`
		WarpSize int             `json:"warp_size"`
	} `json:"target"`
}

func (e entry) target() (Target, error) {
	backend, arch, warp := e.Backend, e.Arch, e.WarpSize
	if e.Target != nil && backend == "" {
		backend, arch, warp = e.Target.Backend, e.Target.Arch, e.Target.WarpSize
	}
	t := Target{Backend: strings.ToLower(backend), WarpSize: warp, PTXVersion: e.PTXVersion}
	if t.Backend == "rocm" {
		t.Backend = "hip"
	}
	var s string
	var n json.Number
	switch {
	case len(arch) == 0:
	case json.Unmarshal(arch, &s) == nil:
		t.Arch = strings.TrimPrefix(strings.TrimPrefix(s, "sm_"), "sm")
	case json.Unmarshal(arch, &n) == nil:
		t.Arch = n.String()
	default:
		return t, fmt.Errorf("arch %s is neither a number nor a string", arch)
	}
	if t.Backend == "" || t.Arch == "" || t.WarpSize <= 0 {
		return t, fmt.Errorf("entry lacks backend, arch or warp_size: %+v", t)
	}
	return t, nil
}

// ParseManifest reads the targets of a kernel cache manifest: MCV's
// {"triton": [...]} or {"vllm": [{"triton_cache_entries": [...]}]}, or a
// bare array of entries (older MCV).
func ParseManifest(b []byte) ([]Target, error) {
	var raw []entry
	if err := json.Unmarshal(b, &raw); err != nil {
		var doc struct {
			Triton []entry `json:"triton"`
			VLLM   []struct {
				TritonCacheEntries []entry `json:"triton_cache_entries"`
				TargetDevice       string  `json:"target_device"`
			} `json:"vllm"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			return nil, fmt.Errorf("kernel cache manifest: %w", err)
		}
		raw = doc.Triton
		for _, v := range doc.VLLM {
			raw = append(raw, v.TritonCacheEntries...)
		}
	}
	return targets(raw)
}

// ParseSummary reads a summary label: {"targets": [{backend, arch,
// warp_size}]}. It lets a node decide from the image config alone, before
// any layer is downloaded.
func ParseSummary(s string) ([]Target, error) {
	var doc struct {
		Targets []entry `json:"targets"`
	}
	if err := json.Unmarshal([]byte(s), &doc); err != nil {
		return nil, fmt.Errorf("summary label: %w", err)
	}
	return targets(doc.Targets)
}

func targets(raw []entry) ([]Target, error) {
	out := make([]Target, 0, len(raw))
	for i, e := range raw {
		t, err := e.target()
		if err != nil {
			return nil, fmt.Errorf("entry %d: %w", i, err)
		}
		out = append(out, t)
	}
	return out, nil
}

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
