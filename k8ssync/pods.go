package k8ssync

import (
	"context"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelcache/modelcache/api"
)

// podHolders maps the artifacts that pods on this node mount (a hostPath
// under the store root, or a PV the loop made) to the pods. The daemon's
// own pod (Config.Self) mounts the whole store and is never a holder.
// names maps the UID of every pod on this node to its namespace/name.
func (s *Syncer) podHolders() (out map[string][]api.Holder, podNames map[string]string) {
	out, podNames = map[string][]api.Holder{}, map[string]string{}
	root := strings.TrimRight(s.node.Root(), "/")
	var names []string // every artifact, listed once and only for a pod that mounts a whole directory
	listed := false
	all := func() []string {
		if !listed {
			names, listed = s.allNames(), true
		}
		return names
	}
	for _, o := range s.podInf.GetStore().List() {
		p, ok := o.(*corev1.Pod)
		if !ok || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		id := p.Namespace + "/" + p.Name
		podNames[string(p.UID)] = id
		if s.cfg.Self != "" && id == s.cfg.Self {
			continue
		}
		add := func(name string) {
			for _, h := range out[name] {
				if h.ID == id {
					return
				}
			}
			out[name] = append(out[name], api.Holder{Kind: "pod", ID: id})
		}
		for _, v := range p.Spec.Volumes {
			switch {
			case v.HostPath != nil:
				for _, n := range artifactsUnder(root, v.HostPath.Path, all) {
					add(n)
				}
			case v.PersistentVolumeClaim != nil:
				// A claim bound to one of our PVs: the PV's model label.
				if name := s.pvModel(p.Namespace, v.PersistentVolumeClaim.ClaimName); name != "" {
					add(name)
				}
			}
		}
	}
	return out, podNames
}

func (s *Syncer) allNames() []string {
	arts, err := s.node.Artifacts()
	if err != nil {
		return nil
	}
	out := make([]string, len(arts))
	for i, a := range arts {
		out[i] = a.Name
	}
	return out
}

// artifactsUnder maps a hostPath to the artifacts it exposes: a path in
// models/<name> or kernels/<name> (or the same under private/, where the
// store keeps private artifacts) holds that one; the root, private/,
// models/ or kernels/ hold all of theirs.
func artifactsUnder(root, p string, names func() []string) []string {
	p = strings.TrimRight(p, "/")
	rel, ok := strings.CutPrefix(p, root)
	if !ok || (rel != "" && !strings.HasPrefix(rel, "/")) {
		return nil
	}
	parts := strings.Split(strings.TrimPrefix(rel, "/"), "/")
	if parts[0] == "private" {
		if len(parts) == 1 {
			return names()
		}
		parts = parts[1:]
	}
	switch {
	case rel == "" || ((parts[0] == "models" || parts[0] == "kernels") && len(parts) == 1):
		return names()
	case (parts[0] == "models" || parts[0] == "kernels") && len(parts) >= 2:
		return []string{parts[1]}
	}
	return nil
}

func (s *Syncer) pvModel(ns, claim string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pvc, err := s.core.PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
	if err != nil || pvc.Spec.VolumeName == "" {
		return ""
	}
	pv, err := s.core.PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil || pv.Labels[LabelNode] != s.cfg.NodeName {
		return ""
	}
	return pv.Labels[LabelModel]
}
