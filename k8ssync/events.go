package k8ssync

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers"
)

// Event reasons.
const (
	EventDownloaded           = "Downloaded"
	EventFailed               = "Failed"
	EventIncompatible         = api.ReasonIncompatible
	EventSignature            = api.ReasonSignatureFailed
	EventInsufficientCapacity = api.ReasonInsufficientCapacity
	EventEvicted              = "Evicted"
	EventInvalidSpec          = api.ReasonInvalidSpec
	EventAggregation          = "AggregationDisabled"
	// EventRolledOut: the elected daemon made a new revision active.
	EventRolledOut = "RolledOut"
	// EventPrefetched and EventPrefetchFailed: this node holds a
	// rollout's new revision, or could not get it (it keeps serving the
	// active one).
	EventPrefetched     = "Prefetched"
	EventPrefetchFailed = "PrefetchFailed"
	// EventResolutionRefused: this node refused an entry of the
	// ModelCache's status.resolved or status.active that is not the
	// spec's source at a revision; it keeps what it serves.
	EventResolutionRefused = "ResolutionRefused"
)

// events emits an Event on the ModelCache for each transition of one of
// its artifacts on this node. The recorder's correlator merges repeats.
func (s *Syncer) events(arts []api.Artifact, owners map[string]string, all []*ModelCache) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := map[string]string{}
	byName := map[string]api.Artifact{}
	for _, a := range arts {
		byName[a.Name] = a
		if _, ok := owners[a.Name]; ok {
			now[a.Name] = string(a.Phase)
		}
	}
	mcs := map[string]*ModelCache{}
	for _, mc := range all {
		mcs[mc.Name] = mc
	}
	emit := func(name, typ, reason, msg string) {
		mc := mcs[owners[name]]
		if mc == nil {
			return
		}
		ref := &corev1.ObjectReference{APIVersion: Group + "/" + Version, Kind: "ModelCache", Name: mc.Name, UID: mc.UID}
		s.rec.Event(ref, typ, reason, fetchers.RedactText(fmt.Sprintf("node %s: %s: %s", s.cfg.NodeName, name, msg)))
	}
	for name, p := range now {
		old := s.phases[name]
		if old == p {
			continue
		}
		a := byName[name]
		switch api.Phase(p) {
		case api.PhaseReady:
			emit(name, corev1.EventTypeNormal, EventDownloaded, "Ready at revision "+a.Revision)
		case api.PhaseIncompatible:
			emit(name, corev1.EventTypeNormal, EventIncompatible, a.Message)
		case api.PhaseFailed:
			reason := EventFailed
			switch a.Reason {
			case api.ReasonSignatureFailed:
				reason = EventSignature
			case api.ReasonInsufficientCapacity:
				reason = EventInsufficientCapacity
			case api.ReasonInvalidSpec:
				reason = EventInvalidSpec
			}
			emit(name, corev1.EventTypeWarning, reason, a.Message)
		case api.PhasePending:
			if old == string(api.PhaseReady) {
				// Disk pressure took a declared model: the daemon says so
				// in the message ("evicted for disk space …").
				msg := "evicted from this node"
				if a.Message != "" {
					msg += ": " + a.Message
				}
				emit(name, corev1.EventTypeWarning, EventEvicted, msg)
			}
		}
	}
	nexts := map[string]string{}
	for name := range now {
		n := byName[name].Next
		if n == nil {
			continue
		}
		nexts[name] = string(n.Phase) + " " + n.Revision + " " + n.URI
		if nexts[name] == s.nexts[name] {
			continue
		}
		switch n.Phase {
		case api.PhaseReady:
			emit(name, corev1.EventTypeNormal, EventPrefetched, "prefetched revision "+n.Revision+" for the rollout; revision "+byName[name].Revision+" serves until the cluster flips")
		case api.PhaseFailed:
			emit(name, corev1.EventTypeWarning, EventPrefetchFailed, "could not prefetch "+n.URI+" for the rollout; keeps serving revision "+byName[name].Revision+": "+n.Message)
		}
	}
	s.nexts = nexts
	for name, old := range s.phases {
		if _, ok := now[name]; !ok && old == string(api.PhaseReady) {
			emit(name, corev1.EventTypeNormal, EventEvicted, "evicted from this node")
		}
	}
	s.phases = now
}
