package daemon

import (
	"net/http"
	"strings"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/daemon/kernels"
)

// handleCaptureSource tells modelctl kernelcache capture where a volume's
// compiled kernels are. It is a mutating route (root, the daemon's user
// or the socket's group: the node's admin), and answers only for a
// published volume with a writable kernel cache of a model whose desire
// opts in (captureKernelCaches, in its models.d file or ModelCache: the
// node's or the cluster's configuration). The daemon
// reads, builds and pushes nothing: modelctl does, in the admin's process,
// with the admin's registry credentials and key, never the node's (a
// tenant's pod cannot push through the daemon).
func (d *Daemon) handleCaptureSource(w http.ResponseWriter, r *http.Request) error {
	if d.csi == nil || d.cfg.CSI == nil {
		return api.Errorf(api.CodeInvalid, "this daemon serves no CSI volumes (--csi-socket): nothing to capture")
	}
	q := r.URL.Query().Get("volume")
	if q == "" {
		return api.Errorf(api.CodeInvalid, "name the volume: its ID, or namespace/pod of the pod that mounts it")
	}
	held, _ := d.csi.Holds()
	var found []int
	for i, v := range held {
		if v.ID == q || v.PodNamespace+"/"+v.PodName == q {
			found = append(found, i)
		}
	}
	switch {
	case len(found) == 0:
		return api.Errorf(api.CodeNotFound, "no volume %s is published on this node", q)
	case len(found) > 1:
		var ids []string
		for _, i := range found {
			ids = append(ids, held[i].ID)
		}
		return api.Errorf(api.CodeInvalid, "pod %s mounts %d volumes of %s (%s): name one by its ID", q, len(found), "csi.modelcache.io", strings.Join(ids, ", "))
	}
	v := held[found[0]]
	if v.Writable == 0 {
		return api.Errorf(api.CodeInvalid, "volume %s has no writable kernel cache (volumeAttributes.kernelCacheWritable): its pod compiled nothing into it", v.ID)
	}
	d.mu.Lock()
	want := d.desires.merged()
	d.mu.Unlock()
	if ds, ok := want[v.Model]; !ok || !ds.CaptureKernelCaches {
		return api.Errorf(api.CodeForbidden, "model %s does not allow capture: set captureKernelCaches: true in its models.d file or ModelCache spec", v.Model)
	}
	src := api.CaptureSource{Volume: v.ID, Model: v.Model, Target: v.Target, GPUs: kernels.GPUView(d.kernels.GPUs())}
	if v.PodName != "" {
		src.Pod = v.PodNamespace + "/" + v.PodName
	}
	for _, kc := range v.Kernels {
		a, err := d.store.Summary(kc.Name)
		if err != nil {
			continue
		}
		for _, ver := range a.Versions {
			info := kernels.Info(&ver)
			if ver.Revision != kc.Revision || info == nil {
				continue
			}
			for _, dir := range kernels.Dirs {
				for _, have := range info.Dirs {
					if have == dir.Dir {
						src.Caches = append(src.Caches, api.CaptureCache{Name: kc.Name, Path: "kernels/" + kc.Name + "/" + dir.Dir, Kind: dir.Name})
					}
				}
			}
		}
	}
	return writeJSON(w, src)
}
