package k8ssync

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"regexp"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/modelcache/modelcache/api"
)

// Scheduling labels on this node's Node, so that pods can ask for nodes
// where a model is ready (docs/consumers.md):
//
//	model.modelcache.io/<modelcache>: ready         the ModelCache's main artifact is
//	                                                Ready here, at the cluster's active revision
//	kernelcache.modelcache.io/<kernel cache>: compatible
//	                                                the kernel cache is Ready here
//	                                                (its GPUs run it)
//
// A label goes when the artifact is no longer Ready (evicted, Absent,
// deselected, another revision). The daemon touches only labels with these
// prefixes, only on its own Node, and only when they change.
const (
	LabelModelPrefix       = "model.modelcache.io/"
	LabelKernelCachePrefix = "kernelcache.modelcache.io/"
	LabelReady             = "ready"
	LabelCompatible        = "compatible"
)

// labelNameRe is a label key's name part (after the prefix).
var labelNameRe = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)

// LabelKey is prefix+name when name is a valid label name (at most 63
// characters); otherwise its first characters (up to 52, invalid ones as
// '-') and '-' and the first 10 hex digits of the name's sha256, so that
// the key stays unique and at most 63 characters.
func LabelKey(prefix, name string) string {
	if len(name) <= 63 && labelNameRe.MatchString(name) {
		return prefix + name
	}
	sum := sha256.Sum256([]byte(name))
	head := []byte(name[:min(len(name), 52)])
	for i, c := range head {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			head[i] = '-'
		}
	}
	h := strings.Trim(string(head), "-_.")
	if h == "" {
		return prefix + hex.EncodeToString(sum[:])[:10]
	}
	return prefix + h + "-" + hex.EncodeToString(sum[:])[:10]
}

// nodeLabels is what this node's scheduling labels should be.
func nodeLabels(arts []api.Artifact, mcs []*ModelCache, want map[string]api.Desire) map[string]string {
	byName := map[string]api.Artifact{}
	for _, a := range arts {
		byName[a.Name] = a
	}
	out := map[string]string{}
	for _, mc := range mcs {
		ds, ok := want[mc.Name]
		if !ok || ds.State == api.StateAbsent {
			continue // not selected here, waiting, or Absent
		}
		a, ok := byName[mc.Name]
		if !ok || a.Phase != api.PhaseReady {
			continue
		}
		e, ok, _ := activeFor(mc, mc.Name, mc.Spec.Source) // during a rollout: the revision that serves
		if !ok {
			e, ok, _ = resolution(mc, mc.Name, mc.Spec.Source)
		}
		if ok && e.Revision != "" && a.Revision != e.Revision {
			continue // another revision than the cluster's active one
		}
		out[LabelKey(LabelModelPrefix, mc.Name)] = LabelReady
		for i := range ds.KernelCaches {
			n := ds.KernelCacheName(i)
			if k, ok := byName[n]; ok && k.Phase == api.PhaseReady {
				out[LabelKey(LabelKernelCachePrefix, n)] = LabelCompatible
			}
		}
	}
	return out
}

// syncLabels patches this node's Node when its scheduling labels differ
// from what they should be (a JSON merge patch of those labels only).
func (s *Syncer) syncLabels(ctx context.Context, node *corev1.Node, arts []api.Artifact, mcs []*ModelCache, want map[string]api.Desire) {
	if node == nil {
		return
	}
	should := nodeLabels(arts, mcs, want)
	patch := map[string]any{}
	for k, v := range node.Labels {
		if (strings.HasPrefix(k, LabelModelPrefix) || strings.HasPrefix(k, LabelKernelCachePrefix)) && should[k] != v {
			if _, keep := should[k]; !keep {
				patch[k] = nil
			}
		}
	}
	for k, v := range should {
		if node.Labels[k] != v {
			patch[k] = v
		}
	}
	if len(patch) == 0 {
		return
	}
	body, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": patch}})
	s.mu.Lock()
	again := string(body) == s.labelPatch && time.Since(s.labelPatchAt) < 10*time.Second
	if !again {
		s.labelPatch, s.labelPatchAt = string(body), time.Now()
	}
	s.mu.Unlock()
	if again {
		return // sent; the informer has not brought the Node back yet
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := s.core.Nodes().Patch(ctx, s.cfg.NodeName, types.MergePatchType, body, metav1.PatchOptions{FieldManager: managerName}); err != nil {
		s.log.Warn("k8s sync: node labels", "node", s.cfg.NodeName, "err", err)
		s.mu.Lock()
		s.labelPatch = ""
		s.mu.Unlock()
		s.later(5 * time.Second) // the informer's copy is unchanged: the next pass tries again
	}
}
