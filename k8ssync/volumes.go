package k8ssync

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/modelcache/modelcache/api"
)

// PVName is the local PV of a model on a node: DNS-1123, at most 63.
func PVName(node, model string) string {
	n := strings.ToLower("modelcache-" + node + "-" + model)
	n = strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-' || r == '.' {
			return r
		}
		return '-'
	}, n)
	if len(n) > 63 {
		sum := fmt.Sprintf("%x", sha(n))
		n = n[:50] + "-" + sum[:12]
	}
	return strings.Trim(n, "-.")
}

// LocalPV is the read-only local PV the daemon on node makes for a's
// tree (a.Path), in storageClass: the shape the bundle's admission
// policy admits from that node's token (deploy/daemonset/base/admission.yaml).
func LocalPV(node, storageClass string, a api.Artifact) *corev1.PersistentVolume {
	return &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: PVName(node, a.Name), Labels: map[string]string{LabelNode: node, LabelModel: a.Name}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: *resourceBytes(a.Bytes)},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              storageClass,
			// kubelet binds a local PV read-only only for a claim or
			// volumeMount marked readOnly; "ro" makes every pod's view
			// of the store read-only (ReadOnlyMany is not enforced).
			MountOptions:           []string{"ro"},
			PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: a.Path}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
	}
}

// syncPVs makes a read-only local PV for each Ready public model of a
// ModelCache selected here and not Absent, and deletes the others (like the node's
// labels: a new claim must not bind to a model the node is letting go; a
// bound PV stays until its claim goes, by the pv-protection finalizer);
// each create or delete takes a token from the bucket, so a fleet never
// bursts the API server.
func (s *Syncer) syncPVs(ctx context.Context, arts []api.Artifact, owners map[string]string, want map[string]api.Desire) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pvs := s.core.PersistentVolumes()
	have, err := pvs.List(ctx, metav1.ListOptions{LabelSelector: LabelNode + "=" + s.cfg.NodeName})
	if err != nil {
		return
	}
	existing := map[string]corev1.PersistentVolume{}
	for _, pv := range have.Items {
		existing[pv.Name] = pv
	}
	wantPV := map[string]api.Artifact{}
	for _, a := range arts {
		if ds, ok := want[a.Name]; !ok || ds.State == api.StateAbsent || len(ds.AllowedNamespaces) > 0 ||
			(a.Desire != nil && a.Desire.Credentialed && !a.Desire.Public) {
			// A private model (or one the daemon fetches with its own
			// credentials, not declared public) gets no PV: a claim of any namespace could
			// bind it; its pods mount it through the CSI driver, which
			// checks their namespace (credentials.go).
			continue
		}
		if a.Phase == api.PhaseReady && a.Kind == api.KindModel && owners[a.Name] != "" && a.Path != "" {
			wantPV[PVName(s.cfg.NodeName, a.Name)] = a
		}
	}
	throttled := false
	for name, a := range wantPV {
		if pv, ok := existing[name]; ok {
			// A PV made before the PVs were read-only (an older daemon),
			// or with anything beside "ro" ("ro,rw" mounts read-write),
			// gets exactly "ro"; mountOptions may change on a live PV.
			if pv.DeletionTimestamp == nil && !slices.Equal(pv.Spec.MountOptions, []string{"ro"}) {
				if !s.pvRL.TryAccept() {
					throttled = true
					break
				}
				patch := []byte(`{"spec":{"mountOptions":["ro"]}}`)
				if _, err := pvs.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: managerName}); err != nil {
					s.log.Warn("k8s sync: make a local PV read-only", "pv", name, "err", err)
				}
			}
			continue
		}
		if !s.pvRL.TryAccept() {
			throttled = true
			break
		}
		pv := LocalPV(s.cfg.NodeName, s.cfg.StorageClass, a)
		if _, err := pvs.Create(ctx, pv, metav1.CreateOptions{FieldManager: managerName}); err != nil && !apierrors.IsAlreadyExists(err) {
			s.log.Warn("k8s sync: create local PV", "pv", name, "err", err)
		}
	}
	for name, pv := range existing {
		if _, ok := wantPV[name]; ok || pv.DeletionTimestamp != nil {
			continue
		}
		if !s.pvRL.TryAccept() {
			throttled = true
			break
		}
		pre := metav1.Preconditions{UID: &pv.UID}
		if err := pvs.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &pre}); err != nil && !apierrors.IsNotFound(err) {
			s.log.Warn("k8s sync: delete local PV", "pv", name, "err", err)
		}
	}
	if throttled { // the rest at the bucket's pace
		s.later(time.Duration(float32(time.Second) / s.cfg.PVQPS))
	}
}
