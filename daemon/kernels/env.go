package kernels

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"sort"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/gpu"
	"github.com/modelcache/modelcache/gpu/mcv"
)

// Info reads what a version recorded of its checks.
func Info(v *cachestore.Version) *api.KernelCacheInfo {
	if v == nil || v.Kind != cachestore.KindKernelCache || len(v.Annotations) == 0 {
		return nil
	}
	var info api.KernelCacheInfo
	if json.Unmarshal(v.Annotations, &info) != nil {
		return nil
	}
	return &info
}

// Env is what a framework needs to use an artifact: for a kernel cache the
// cache directories; for a model its path, the HF cache view when it came
// from a hub, and the directories of its Ready, compatible kernel caches.
func (k *Set) Env(name string) (map[string]string, error) {
	a, err := k.store.Summary(name)
	if err != nil {
		return nil, err
	}
	cur := CurrentVersion(a)
	if cur == nil {
		return nil, fmt.Errorf("%s: %w: no Ready version yet (modelctl wait %s)", name, cachestore.ErrNotFound, name)
	}
	out := map[string]string{}
	if cur.Kind == cachestore.KindKernelCache {
		if info := Info(cur); info != nil {
			kernelEnv(k.store.TreePath(cachestore.KindKernelCache, name, ""), info, out, false)
			kernelEnv(k.store.TreePath(cachestore.KindKernelCache, name, ""), info, out, true)
		}
		return out, nil
	}
	out["MODEL_PATH"] = k.store.TreePath(cur.Kind, name, "current")
	if cur.HFRepo != "" {
		out["HF_HUB_CACHE"] = filepath.Join(k.store.Root(), "hf")
		out["HF_HUB_OFFLINE"] = "1"
	}
	kcs := k.ModelKernelCaches(name)
	for _, nested := range []bool{false, true} { // a Triton cache of its own before one inside an Inductor cache
		for _, kc := range kcs {
			kernelEnv(k.store.TreePath(cachestore.KindKernelCache, kc.Name, ""), kc.Info, out, nested)
		}
	}
	return out, nil
}

// Served is a Ready kernel cache version that serves a model.
type Served struct {
	Name, Revision string
	Info           *api.KernelCacheInfo
}

// ModelKernelCaches chooses the kernel caches a model is served with (by
// modelctl env and by a CSI volume with kernelCaches: auto): each kernel
// cache declared for the model whose current version is Ready (so it was
// signed as its policy asks and compatible with this node's GPUs when
// pulled) and was pulled for that model (one someone else pulled under
// the same name before the model was declared is not served), by name.
func (k *Set) ModelKernelCaches(model string) []Served {
	var names []string
	for n, ds := range k.desired() {
		if ds.Kind == api.KindKernelCache && ds.Serves == model {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var out []Served
	for _, n := range names {
		a, err := k.store.Summary(n)
		if err != nil {
			continue
		}
		cur := CurrentVersion(a)
		if info := Info(cur); info != nil && info.Serves == model {
			out = append(out, Served{Name: n, Revision: cur.Revision, Info: info})
		}
	}
	return out
}

// kernelEnv adds the directories of a kernel cache (whose current link is
// under dir) to out; the first cache to set a variable keeps it. nested
// adds only Triton's cache inside an Inductor cache (TRITON_CACHE_DIR,
// after every cache's own directories had their turn).
func kernelEnv(dir string, info *api.KernelCacheInfo, out map[string]string, nested bool) {
	base := filepath.Join(dir, "current")
	set := func(env, cd string) {
		if _, ok := out[env]; !ok && slices.Contains(info.Dirs, cd) {
			out[env] = filepath.Join(base, cd)
		}
	}
	if nested {
		set("TRITON_CACHE_DIR", mcv.InductorTritonPath)
		return
	}
	for _, k := range Dirs {
		set(k.Env, k.Dir)
	}
}

// CurrentVersion is a's current Ready version, or nil.
func CurrentVersion(a *cachestore.Artifact) *cachestore.Version {
	for i := range a.Versions {
		v := &a.Versions[i]
		if v.Revision == a.Current && v.State == cachestore.StateReady {
			return v
		}
	}
	return nil
}

// GPUView is the node's inventory as the socket API shows it. gpu mirrors
// api's types so that it links nothing else of the module; the device
// conversion compiles only while their fields agree, and a test holds the
// rest (the daemon's TestGPUViewsKeepEveryField).
func GPUView(inv gpu.Inventory) api.GPUInventory {
	devs := make([]api.GPUDevice, len(inv.Devices))
	for i, dv := range inv.Devices {
		devs[i] = api.GPUDevice(dv)
	}
	return api.GPUInventory{Source: inv.Source, Simulated: inv.Simulated, Reason: inv.Reason, DriverVersion: inv.DriverVersion,
		CUDADriverVersion: inv.CUDADriverVersion, Devices: devs, DetectedAt: inv.DetectedAt}
}

// CompatView is a compatibility report as the socket API shows it.
func CompatView(r gpu.Report) *api.Compatibility {
	devs := make([]api.GPUCompat, len(r.Devices))
	for i, dv := range r.Devices {
		devs[i] = api.GPUCompat(dv)
	}
	return &api.Compatibility{Compatible: r.Compatible, Simulated: r.Simulated, Targets: r.Targets, Devices: devs, Reason: r.Reason}
}
