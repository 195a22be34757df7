package daemon

import (
	"net/http"
	"strings"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/csi"
	"github.com/modelcache/modelcache/daemon/kernels"
)

// captures are the capture routes, over the CSI volumes and their kept
// layers.
type captures struct{ *csiVolumes }

// handleCaptureSource tells modelctl kernelcache capture where a volume's
// compiled kernels are. It is a mutating route (root, the daemon's user
// or the socket's group: the node's admin), and answers only for a
// volume with a writable kernel cache of a model whose desire opts in
// (captureKernelCaches, in its models.d file or ModelCache: the node's or
// the cluster's configuration): a published one, or, once its pod is
// gone, its kept layer (kept.go). The volume is named by its ID,
// namespace/pod of its pod, or its model. The daemon reads, builds and
// pushes nothing: modelctl does, in the admin's process, with the admin's
// registry credentials and key, never the node's (a tenant's pod cannot
// push through the daemon).
func (d captures) handleCaptureSource(w http.ResponseWriter, r *http.Request) error {
	q, err := d.captureQuery(r)
	if err != nil {
		return err
	}
	held, _ := d.Holds()
	var found []csi.Volume
	for _, v := range held {
		if v.ID == q || v.PodNamespace+"/"+v.PodName == q || (v.Model == q && v.Writable > 0) {
			found = append(found, v)
		}
	}
	if len(found) == 0 {
		return d.keptSource(w, q)
	}
	if len(found) > 1 {
		var ids []string
		for _, v := range found {
			ids = append(ids, v.ID)
		}
		return api.Errorf(api.CodeInvalid, "%s names %d volumes of %s (%s): name one by its ID", q, len(found), csi.DriverName, strings.Join(ids, ", "))
	}
	v := found[0]
	if v.Writable == 0 {
		return api.Errorf(api.CodeInvalid, "volume %s has no writable kernel cache (volumeAttributes.kernelCacheWritable): its pod compiled nothing into it", v.ID)
	}
	if err := d.mayCapture(v.Model); err != nil {
		return err
	}
	src := api.CaptureSource{Volume: v.ID, Model: v.Model, Target: v.Target, GPUs: kernels.GPUView(d.kernels.GPUs()), Caches: captureCaches(d.store, v)}
	if v.PodName != "" {
		src.Pod = v.PodNamespace + "/" + v.PodName
	}
	return writeJSON(w, src)
}

// keptSource answers a capture of a volume no longer published from its
// kept layer.
func (d captures) keptSource(w http.ResponseWriter, q string) error {
	found := d.kept.find(q)
	switch {
	case len(found) == 0:
		return api.Errorf(api.CodeNotFound, "no volume %s is published on this node, and none is kept (modelctl kernelcache kept lists the kept ones)", q)
	case len(found) > 1:
		var ids []string
		for _, l := range found {
			ids = append(ids, l.Volume)
		}
		return api.Errorf(api.CodeInvalid, "%s names %d kept layers (%s): name one by its volume ID", q, len(found), strings.Join(ids, ", "))
	}
	l := found[0]
	if err := d.mayCapture(l.Model); err != nil {
		return err
	}
	return writeJSON(w, api.CaptureSource{Volume: l.Volume, Model: l.Model, Pod: l.Pod, Target: d.kept.tree(l.Volume),
		Caches: l.Caches, GPUs: kernels.GPUView(d.kernels.GPUs()), Kept: true, KeptAt: l.KeptAt, Refused: l.Refused})
}

// handleCaptured: modelctl pushed a capture of the volume: its kept
// layer goes (or, published, its layer is kept later only for what the
// pod writes after).
func (d captures) handleCaptured(w http.ResponseWriter, r *http.Request) error {
	q, err := d.captureQuery(r)
	if err != nil {
		return err
	}
	_, published := d.held(q)
	if !d.kept.markCaptured(q, published) && !published {
		return api.Errorf(api.CodeNotFound, "no volume %s is published or kept on this node", q)
	}
	return writeJSON(w, struct{}{})
}

// handleKept lists the kept layers.
func (d captures) handleKept(w http.ResponseWriter, _ *http.Request) error {
	if d.csiVolumes == nil || d.kept == nil {
		return writeJSON(w, []api.KeptLayer{})
	}
	out := d.kept.Layers()
	if out == nil {
		out = []api.KeptLayer{}
	}
	return writeJSON(w, out)
}

// handleDropKept removes a kept layer without capturing it.
func (d captures) handleDropKept(w http.ResponseWriter, r *http.Request) error {
	q, err := d.captureQuery(r)
	if err != nil {
		return err
	}
	if !d.kept.drop(q) {
		return api.Errorf(api.CodeNotFound, "no layer of volume %s is kept on this node", q)
	}
	return writeJSON(w, struct{}{})
}

// captureQuery is the volume a capture route names.
func (d captures) captureQuery(r *http.Request) (string, error) {
	if d.csiVolumes == nil || d.cfg.CSI == nil || d.kept == nil {
		return "", api.Errorf(api.CodeInvalid, "this daemon serves no CSI volumes (--csi-socket): nothing to capture")
	}
	q := r.URL.Query().Get("volume")
	if q == "" {
		return "", api.Errorf(api.CodeInvalid, "name the volume: its ID, namespace/pod of the pod that mounts it, or its model")
	}
	return q, nil
}

// mayCapture: the model's desire allows capture.
func (d captures) mayCapture(model string) error {
	if ds, ok := d.host.desired()[model]; !ok || !ds.CaptureKernelCaches {
		return api.Errorf(api.CodeForbidden, "model %s does not allow capture: set captureKernelCaches: true in its models.d file or ModelCache spec", model)
	}
	return nil
}

// captureCaches are the kernel cache directories volume v was given,
// relative to the volume.
func captureCaches(st cachestore.Inspector, v csi.Volume) []api.CaptureCache {
	var out []api.CaptureCache
	for _, kc := range v.Kernels {
		a, err := st.Summary(kc.Name)
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
						out = append(out, api.CaptureCache{Name: kc.Name, Path: "kernels/" + kc.Name + "/" + dir.Dir, Kind: dir.Name})
					}
				}
			}
		}
	}
	return out
}
