// Package mcv is the one definition of a kernel cache image's layout, as
// GKM's Model Cache Vault (MCV) writes it: the cache and manifest
// directories of the image's layer, the manifest's entries and the image
// labels. The daemon reads images by it (package gpu, daemon/kernels) and
// modelctl kernelcache writes them by it (package kernelcache), so that
// what one builds the other serves, and an image MCV builds is served the
// same way. It links nothing (modelctl links it without NVML).
//
// References: redhat-et/GKM at commit f0e65de4, directory mcv/ (formerly
// redhat-et/MCU), by package and file:
//
//	pkg/constants, file constants   the directory names (MCVTritonCacheDir …)
//	pkg/cache, file types           TritonCacheMetadata, Summary, SummaryTargetInfo,
//	                                VLLMManifest, BinaryCacheMetadata
//	pkg/cache, file triton          the cache.triton.image/* labels, BuildTritonSummary
//	pkg/cache, file vllm            the cache.vllm.image/* labels, VLLMCacheMetadata
//	pkg/imgbuild, file schema2image one tar+gzip layer holding <cache dir>/… and
//	                                <manifest dir>/manifest.json, Docker schema 2,
//	                                the org.opencontainers.image.title label
//	pkg/cache, file cache           extraction reads the image's last layer
//
// Torch.compile's Inductor cache on its own has no MCV layout (MCV packs it
// only inside a vLLM cache); this project packs it the same way under
// io.torchinductor.cache/ and io.torchinductor.manifest/ with
// cache.torchinductor.image/* labels of the same meaning.
package mcv

import (
	"encoding/json"
	"fmt"
	"strings"
)

// The image's directories and labels (MCV's constants, triton and vllm files).
const (
	TritonCacheDir    = "io.triton.cache"
	TritonManifestDir = "io.triton.manifest"
	VLLMCacheDir      = "io.vllm.cache"
	VLLMManifestDir   = "io.vllm.manifest"
	ManifestFile      = "manifest.json"
	// TorchInductorCacheDir is a torch.compile (Inductor) cache; this
	// project's extension of the layout.
	TorchInductorCacheDir    = "io.torchinductor.cache"
	TorchInductorManifestDir = "io.torchinductor.manifest"
	// InductorTritonDir is where Inductor keeps Triton's cache inside its
	// own (TRITON_CACHE_DIR when torch.compile ran with it there).
	InductorTritonDir  = "triton"
	InductorTritonPath = TorchInductorCacheDir + "/" + InductorTritonDir

	LabelTritonEntryCount = "cache.triton.image/entry-count"
	LabelTritonCacheSize  = "cache.triton.image/cache-size-bytes"
	LabelTritonSummary    = "cache.triton.image/summary"
	LabelVLLMEntryCount   = "cache.vllm.image/entry-count"
	LabelVLLMCacheSize    = "cache.vllm.image/cache-size-bytes"
	LabelVLLMSummary      = "cache.vllm.image/summary"
	LabelVLLMFormat       = "cache.vllm.image/format"
	LabelInductorCount    = "cache.torchinductor.image/entry-count"
	LabelInductorSize     = "cache.torchinductor.image/cache-size-bytes"
	LabelInductorSummary  = "cache.torchinductor.image/summary"
	// LabelTitle is the image's name without registry or tag
	// (schema2image's imageTitleFromName).
	LabelTitle = "org.opencontainers.image.title"
)

// Dir is a cache directory of an image: the manifest key of its entries
// ("triton", "vllm"), the variable a framework reads it from, where its
// manifest lies, and the labels that give its size, its entry count and
// its GPU summary.
type Dir struct{ Name, Dir, Env, Manifest, SizeLabel, CountLabel, Summary string }

// Dirs are the cache directories of an image, in the order a variable set
// by two of them is decided (the first wins).
var Dirs = []Dir{
	{"triton", TritonCacheDir, "TRITON_CACHE_DIR", TritonManifestDir, LabelTritonCacheSize, LabelTritonEntryCount, LabelTritonSummary},
	{"vllm", VLLMCacheDir, "VLLM_CACHE_ROOT", VLLMManifestDir, LabelVLLMCacheSize, LabelVLLMEntryCount, LabelVLLMSummary},
	{"torchinductor", TorchInductorCacheDir, "TORCHINDUCTOR_CACHE_DIR", TorchInductorManifestDir, LabelInductorSize, LabelInductorCount, LabelInductorSummary},
}

// DirNamed is the Dirs entry of a kind ("triton", "vllm", "torchinductor").
func DirNamed(name string) (Dir, bool) {
	for _, d := range Dirs {
		if d.Name == name {
			return d, true
		}
	}
	return Dir{}, false
}

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

// Entry is one kernel of a manifest, field for field MCV's
// TritonCacheMetadata (file types): Target embedded, arch written as a
// string. DummyKey is MCV's hash of Triton's installation key, which only
// a Python Triton can compute; it is left out (omitempty in MCV too, and
// checked only by MCV's --baremetal preflight).
type Entry struct {
	Hash       string `json:"hash"`
	DummyKey   string `json:"dummy_key,omitempty"`
	PtxVersion int    `json:"ptx_version,omitempty"`
	NumStages  int    `json:"num_stages,omitempty"`
	NumWarps   int    `json:"num_warps,omitempty"`
	Debug      bool   `json:"debug,omitempty"`
	Backend    string `json:"backend"`
	Arch       string `json:"arch"`
	WarpSize   int    `json:"warp_size"`
}

// SummaryTarget is one target of a summary label (MCV's SummaryTargetInfo).
type SummaryTarget struct {
	Backend     string `json:"backend"`
	Arch        string `json:"arch"`
	WarpSize    int    `json:"warp_size"`
	PTXVersion  int    `json:"ptx_version,omitempty"`
	CUDAVersion string `json:"cuda_version,omitempty"`
}

// Summary is a summary label's value: {"targets": [...]}.
type Summary struct {
	Targets []SummaryTarget `json:"targets"`
}

// VLLMEntry is one torch_compile_cache/<hash> of a vLLM cache (MCV's
// VLLMCacheMetadata): its Triton kernels in the "triton" format, its
// artifacts in the "binary" one.
type VLLMEntry struct {
	VllmHash    string        `json:"vllmHash"`
	CacheFormat string        `json:"cacheFormat"`
	Triton      []Entry       `json:"triton,omitempty"`
	Binary      []BinaryEntry `json:"binary,omitempty"`
}

// BinaryEntry is one rank_X_Y/<prefix> of a vLLM binary cache (MCV's
// BinaryCacheMetadata).
type BinaryEntry struct {
	Rank            string         `json:"rank"`
	Prefix          string         `json:"prefix"`
	ArtifactCount   int            `json:"artifact_count"`
	ArtifactNames   []string       `json:"artifact_names,omitempty"`
	CodeHash        string         `json:"code_hash,omitempty"`
	ConfigHash      string         `json:"config_hash,omitempty"`
	CompilerHash    string         `json:"compiler_hash,omitempty"`
	CacheSaveFormat string         `json:"cache_save_format,omitempty"`
	TargetDevice    string         `json:"target_device,omitempty"`
	Env             map[string]any `json:"env,omitempty"`
}

// Manifest is manifest.json: entries by kind (MCV's cache.Manifest,
// BuildManifest): {"triton": [...]} or {"vllm": [...]}; this project's
// Inductor images write {"triton": [...]} with the kernels of the Triton
// cache inside.
type Manifest struct {
	Triton []Entry     `json:"triton,omitempty"`
	VLLM   []VLLMEntry `json:"vllm,omitempty"`
}

// entry is one manifest entry, summary target or Triton metadata file as
// read: arch is a number for cuda (90) and a string for hip ("gfx90a");
// Triton's own metadata nests the target.
type entry struct {
	Backend    string          `json:"backend"`
	Arch       json.RawMessage `json:"arch"`
	WarpSize   int             `json:"warp_size"`
	PTXVersion *int            `json:"ptx_version"`
	Target     *struct {
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
	t := Target{Backend: strings.ToLower(backend), WarpSize: warp}
	if e.PTXVersion != nil {
		t.PTXVersion = *e.PTXVersion
	}
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

// ParseManifest reads the targets of a manifest: {"triton": [...]},
// {"vllm": [{"triton": [...]}]} (MCV; "triton_cache_entries", as older
// readers here wrote it, is read too), or a bare array of entries (older
// MCV).
func ParseManifest(b []byte) ([]Target, error) {
	var raw []entry
	if err := json.Unmarshal(b, &raw); err != nil {
		var doc struct {
			Triton []entry `json:"triton"`
			VLLM   []struct {
				Triton             []entry `json:"triton"`
				TritonCacheEntries []entry `json:"triton_cache_entries"`
			} `json:"vllm"`
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			return nil, fmt.Errorf("kernel cache manifest: %w", err)
		}
		raw = doc.Triton
		for _, v := range doc.VLLM {
			raw = append(raw, v.Triton...)
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

// TritonMetadata is what one Triton metadata file (<kernel>.json beside
// its binary) says: ok is false for a JSON file that is not one (no
// "hash", as __grp__ files and Inductor's own files), as MCV's
// findAllTritonCacheJSON skips them; err when it is one and its target
// cannot be read.
func TritonMetadata(b []byte) (e Entry, t Target, ok bool, err error) {
	var doc struct {
		entry
		Hash      string `json:"hash"`
		NumStages int    `json:"num_stages"`
		NumWarps  int    `json:"num_warps"`
		Debug     bool   `json:"debug"`
	}
	if json.Unmarshal(b, &doc) != nil || doc.Hash == "" {
		return e, t, false, nil
	}
	if doc.entry.Target == nil {
		return e, t, true, fmt.Errorf("Triton metadata of kernel %s has no \"target\"", doc.Hash)
	}
	inner := doc.entry
	inner.Backend, inner.Arch, inner.WarpSize = "", nil, 0 // the nested target decides
	if t, err = inner.target(); err != nil {
		return e, t, true, fmt.Errorf("Triton metadata of kernel %s: %w", doc.Hash, err)
	}
	arch := t.Arch
	if len(doc.entry.Target.Arch) > 0 && doc.entry.Target.Arch[0] == '"' {
		json.Unmarshal(doc.entry.Target.Arch, &arch) // a hip arch as written ("gfx90a")
	}
	return Entry{Hash: doc.Hash, PtxVersion: t.PTXVersion, NumStages: doc.NumStages, NumWarps: doc.NumWarps, Debug: doc.Debug,
		Backend: doc.entry.Target.Backend, Arch: arch, WarpSize: t.WarpSize}, t, true, nil
}

// Summarize is the summary of entries' targets, one per backend, arch and
// warp size, in the order first seen (MCV's BuildTritonSummary, which
// leaves the order to a map).
func Summarize(es []Entry) Summary {
	s := Summary{Targets: []SummaryTarget{}}
	seen := map[string]bool{}
	for _, e := range es {
		k := fmt.Sprintf("%s-%s-%d", e.Backend, e.Arch, e.WarpSize)
		if !seen[k] {
			seen[k] = true
			s.Targets = append(s.Targets, SummaryTarget{Backend: e.Backend, Arch: e.Arch, WarpSize: e.WarpSize})
		}
	}
	return s
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
