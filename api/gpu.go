package api

import "time"

// KernelCacheInfo is what the daemon checked of a kernel cache version.
type KernelCacheInfo struct {
	Serves        string          `json:"serves,omitempty"`
	Signature     *SignatureCheck `json:"signature,omitempty"`
	Compatibility *Compatibility  `json:"compatibility,omitempty"`
	// CacheBytes is what was extracted under the cache directories.
	CacheBytes     int64   `json:"cacheBytes,omitempty"`
	Entries        int     `json:"entries,omitempty"`
	ExtractSeconds float64 `json:"extractSeconds,omitempty"`
	// Dirs are the cache directories found (io.triton.cache, …).
	Dirs []string `json:"dirs,omitempty"`
}

// SignatureCheck is the result of a signature verification.
type SignatureCheck struct {
	Policy   string    `json:"policy"`
	Verified bool      `json:"verified"`
	Digest   string    `json:"digest,omitempty"`
	Format   string    `json:"format,omitempty"`
	Signer   string    `json:"signer,omitempty"`
	At       time.Time `json:"at"`
}

// GPUInventory is what this node's GPUs are.
type GPUInventory struct {
	// Source is nvml, simulated (from --gpu-inventory) or none.
	Source    string `json:"source"`
	Simulated bool   `json:"simulated,omitempty"`
	// Reason says why the inventory is empty or partial (no driver, NVML
	// error on one device).
	Reason            string      `json:"reason,omitempty"`
	DriverVersion     string      `json:"driverVersion,omitempty"`
	CUDADriverVersion string      `json:"cudaDriverVersion,omitempty"` // e.g. "12.4"
	Devices           []GPUDevice `json:"devices"`
	DetectedAt        time.Time   `json:"detectedAt"`
}

// GPUDevice is one GPU.
type GPUDevice struct {
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

// GPUCompat is the verdict of a kernel cache for one GPU.
type GPUCompat struct {
	Index      int    `json:"index"`
	UUID       string `json:"uuid,omitempty"`
	Name       string `json:"name,omitempty"`
	Compatible bool   `json:"compatible"`
	// Entries is how many of the cache's entries this GPU can run.
	Entries int    `json:"entries"`
	Reason  string `json:"reason,omitempty"`
}

// Compatibility is the verdict of a kernel cache against the inventory.
type Compatibility struct {
	// Compatible: at least one GPU runs at least one entry of the cache.
	Compatible bool        `json:"compatible"`
	Simulated  bool        `json:"simulated,omitempty"`
	Targets    int         `json:"targets"`
	Devices    []GPUCompat `json:"devices"`
	Reason     string      `json:"reason,omitempty"`
}

// CaptureSource is where modelctl kernelcache capture reads what a pod
// compiled: a published volume with a writable kernel cache, of a model
// whose desire allows capture.
type CaptureSource struct {
	Volume string `json:"volume"`
	Model  string `json:"model"`
	// Target is the volume's mount on the node: the overlay of the held
	// tree and the volume's writable layer, as the pod sees it.
	Target string `json:"target"`
	// Pod is namespace/name of the pod that mounts it.
	Pod string `json:"pod,omitempty"`
	// Caches are the kernel cache directories the volume was given,
	// relative to Target (kernels/<name>/io.triton.cache, …): where the
	// pod compiled, when it followed modelctl env.
	Caches []CaptureCache `json:"caches,omitempty"`
	// GPUs is this node's inventory: what was compiled must run on it.
	GPUs GPUInventory `json:"gpus"`
	// Kept: the volume is gone and Target is its kept layer (a copy, in
	// the daemon's own area of the store root, of what the pod wrote over
	// the kernel caches it was given); modelctl tells the daemon once it
	// has captured it (Client.Captured), and the layer goes.
	Kept   bool      `json:"kept,omitempty"`
	KeptAt time.Time `json:"keptAt,omitzero"`
	// Refused are the entries the pod wrote that were not kept, each
	// "path (what it was)": links, devices, pipes, relative to Target. A
	// capture of a directory that held one is refused, as it would have
	// been while the pod ran.
	Refused []string `json:"refused,omitempty"`
}

// KeptLayer is a writable kernel cache layer kept past its volume for
// capture (modelctl kernelcache kept).
type KeptLayer struct {
	Volume string         `json:"volume"`
	Model  string         `json:"model"`
	Pod    string         `json:"pod,omitempty"`
	KeptAt time.Time      `json:"keptAt"`
	Bytes  int64          `json:"bytes"` // on disk: what the pod wrote and the kernel caches it was given
	Files  int            `json:"files"` // what the pod wrote
	Caches []CaptureCache `json:"caches,omitempty"`
	// Refused: as CaptureSource.Refused.
	Refused []string `json:"refused,omitempty"`
}

// CaptureCache is one kernel cache directory of a volume.
type CaptureCache struct {
	Name string `json:"name"` // the kernel cache artifact
	Path string `json:"path"` // relative to the volume
	Kind string `json:"kind"` // triton, vllm, torchinductor
}
