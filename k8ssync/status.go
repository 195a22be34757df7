package k8ssync

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers"
)

// writeStatus applies this node's ModelCacheNode when it changed, at most
// once per StatusInterval, and at least once per Heartbeat; a change of
// the capacity figures alone waits for CapacityInterval. Server-side
// apply: no read, no conflict. Progress is not in the status (metrics,
// modelctl and the socket API have it): a pull writes its phases.
func (s *Syncer) writeStatus(ctx context.Context, arts []api.Artifact, owners map[string]string, want map[string]api.Desire, pending map[string]string) {
	st := s.nodeStatus(arts, owners, want, pending)
	body, _ := json.Marshal(st)
	rest := withoutCapacity(st)
	s.mu.Lock()
	s.ownStatus = st
	since := time.Since(s.lastWrite)
	same := string(body) == string(s.lastStatus)
	sameRest := rest == s.lastRest
	due := since >= s.cfg.StatusInterval && (!sameRest || (since >= s.cfg.CapacityInterval && s.capacityMoved(st)))
	heartbeat := since >= s.cfg.Heartbeat
	backoff := s.cfg.StatusInterval << min(s.writeErrs, 6) // 10s, 20s, … while writes fail
	if s.writeErrs > 0 && since < backoff {
		due = false
	}
	s.mu.Unlock()
	if (same && !heartbeat) || (!due && !heartbeat) {
		if !same {
			s.later(s.cfg.StatusInterval)
		}
		return
	}
	st.Heartbeat = metav1.Now()
	obj := map[string]any{
		"apiVersion": Group + "/" + Version, "kind": "ModelCacheNode",
		"metadata": map[string]any{"name": s.cfg.NodeName, "labels": map[string]any{LabelNode: s.cfg.NodeName}},
	}
	raw, _ := json.Marshal(st)
	var status map[string]any
	json.Unmarshal(raw, &status)
	obj["status"] = status
	u := &unstructured.Unstructured{Object: obj}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	opts := metav1.ApplyOptions{FieldManager: managerName, Force: true}
	res := s.dyn.Resource(ModelCacheNodeGVR)
	var err error
	s.mu.Lock()
	exists := s.created
	s.mu.Unlock()
	if !exists { // the object once; then only its status
		_, err = res.Apply(ctx, s.cfg.NodeName, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": obj["metadata"]}}, opts)
	}
	if err == nil {
		_, err = res.ApplyStatus(ctx, s.cfg.NodeName, u, opts)
	}
	if apierrors.IsNotFound(err) {
		s.mu.Lock()
		s.created = false // deleted meanwhile: make it again next time
		s.mu.Unlock()
	} else if err == nil {
		s.mu.Lock()
		s.created = true
		s.mu.Unlock()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastWrite = time.Now()
	if err != nil {
		if s.writeErrs == 0 || s.writeErrs%10 == 0 {
			s.log.Warn("k8s sync: writing node status (retrying with backoff)", "err", err, "failures", s.writeErrs+1)
		}
		s.writeErrs++
		return
	}
	if s.writeErrs > 0 {
		s.log.Info("k8s sync: node status written again", "after_failures", s.writeErrs)
	}
	s.writeErrs = 0
	s.lastStatus, s.lastRest, s.lastCapacity = body, rest, st
}

// capacityMoved says whether st's used or free bytes moved by
// capacityStep of the capacity since the last write: worth a write of
// its own (at most every CapacityInterval); a smaller drift waits for the
// next other change or the heartbeat, so a node at rest writes nothing
// more often than hourly. Called with s.mu held.
func (s *Syncer) capacityMoved(st ModelCacheNodeStatus) bool {
	last := s.lastCapacity
	step := max(st.CapacityBytes/capacityStep, 1)
	return abs(st.FreeBytes-last.FreeBytes) >= step || abs(st.UsedBytes-last.UsedBytes) >= step || abs(st.ReservedBytes-last.ReservedBytes) >= step ||
		st.CapacityBytes != last.CapacityBytes
}

// capacityStep: a move of 1/20 (5%) of the capacity is written on its own.
const capacityStep = 20

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// withoutCapacity is st as JSON without the figures that move through
// every download (used, reserved, free bytes), to tell a change worth a
// write from one that can wait for CapacityInterval.
func withoutCapacity(st ModelCacheNodeStatus) string {
	st.UsedBytes, st.ReservedBytes, st.FreeBytes, st.CapacityBytes = 0, 0, 0, 0
	b, _ := json.Marshal(st)
	return string(b)
}

// nodeStatus is this node's ModelCacheNode status: every string clipped
// to its cap and the whole within MaxNodeStatusBytes (limits.go).
func (s *Syncer) nodeStatus(arts []api.Artifact, owners map[string]string, want map[string]api.Desire, pending map[string]string) ModelCacheNodeStatus {
	st := ModelCacheNodeStatus{}
	inv := s.node.GPUs()
	st.GPUs, st.GPUSource = inv.Devices, inv.Source
	if ds, err := s.node.StatusNow(); err == nil {
		st.CapacityBytes, st.UsedBytes, st.ReservedBytes, st.FreeBytes = ds.FSCapacityBytes, ds.StoreBytes, ds.ReservedBytes, ds.FSFreeBytes
	}
	seen := map[string]bool{}
	for _, a := range arts {
		seen[a.Name] = true
		as := ArtifactStatus{Name: a.Name, ModelCache: owners[a.Name], Kind: a.Kind, Phase: string(a.Phase), Revision: a.Revision,
			Digest: a.ManifestDigest, Bytes: a.Bytes, Message: a.Message, Reason: a.Reason} // messages: redacted and clipped below (clipArtifact)
		as.Source = a.Source
		if n := a.Next; n != nil {
			as.Next = &NextStatus{Revision: n.Revision, Source: fetchers.RedactURI(n.URI), Phase: string(n.Phase), Digest: n.ManifestDigest,
				Message: n.Message, Reason: n.Reason}
		}
		for _, h := range a.InUse {
			as.InUseBy = append(as.InUseBy, h.String())
			if h.Kind == "pod" && !slices.Contains(as.Pods, h.ID) {
				as.Pods = append(as.Pods, h.ID)
			}
		}
		sort.Strings(as.Pods)
		if lp := a.LastPull; lp != nil {
			as.DownloadSeconds, as.BytesPerSecond = round(lp.Seconds), round(lp.BytesPerSecond)
			as.OriginBytes, as.PeerBytes = max(lp.BytesFetched-lp.BytesFromPeers, 0), lp.BytesFromPeers
			done := lp.At.UTC().Truncate(time.Second)
			as.DownloadCompleted = done.Format(time.RFC3339)
			as.DownloadStarted = done.Add(-time.Duration(lp.Seconds * float64(time.Second))).Truncate(time.Second).Format(time.RFC3339)
		}
		if p := a.Progress; p != nil && a.Phase == api.PhaseDownloading && !p.Started.IsZero() {
			as.DownloadStarted, as.DownloadCompleted = p.Started.UTC().Truncate(time.Second).Format(time.RFC3339), ""
		}
		if a.LastUsed != nil {
			// Hours: a model in use would otherwise write status on every
			// read (a request per minute per node); the heartbeat is hourly.
			as.LastUsed = a.LastUsed.UTC().Truncate(time.Hour).Format(time.RFC3339)
		}
		st.Artifacts = append(st.Artifacts, as)
	}
	// A selected ModelCache is listed even before anything is known of it,
	// so the aggregator counts this node in its total.
	for name := range want {
		if !seen[name] && want[name].State != api.StateAbsent {
			st.Artifacts = append(st.Artifacts, ArtifactStatus{Name: name, ModelCache: owners[name], Phase: string(api.PhasePending)})
		}
	}
	for name, why := range pending {
		if !seen[name] {
			st.Artifacts = append(st.Artifacts, ArtifactStatus{Name: name, ModelCache: owners[name], Phase: string(api.PhasePending), Message: why})
		}
	}
	sort.Slice(st.Artifacts, func(i, j int) bool { return st.Artifacts[i].Name < st.Artifacts[j].Name })
	st.Summary = phaseSummary(st.Artifacts)
	st.PeerAddress = clip(s.cfg.PeerAddress, MaxStatusField)
	s.mu.Lock()
	if s.aggProblem != "" {
		st.Problems = append(st.Problems, clip(s.aggProblem, MaxStatusMessage))
	}
	s.mu.Unlock()
	for i := range st.Artifacts {
		clipArtifact(&st.Artifacts[i])
	}
	fit(&st)
	return st
}

// clipArtifact clips what an artifact's status copies from the daemon to
// its caps (limits.go) and redacts its messages.
func clipArtifact(as *ArtifactStatus) {
	for _, f := range []*string{&as.Kind, &as.Phase, &as.Revision, &as.Digest, &as.Reason, &as.LastUsed, &as.DownloadStarted, &as.DownloadCompleted} {
		*f = clip(*f, MaxStatusField)
	}
	as.Source, as.Message = clip(as.Source, MaxStatusURI), clipText(as.Message, MaxStatusMessage)
	as.InUseBy = clipList(as.InUseBy)
	for i := range as.Pods {
		as.Pods[i] = clip(as.Pods[i], MaxStatusField)
	}
	as.Pods = as.Pods[:min(len(as.Pods), MaxNodePods)]
	if n := as.Next; n != nil {
		for _, f := range []*string{&n.Revision, &n.Phase, &n.Digest, &n.Reason} {
			*f = clip(*f, MaxStatusField)
		}
		n.Source, n.Message = clip(n.Source, MaxStatusURI), clipText(n.Message, MaxStatusMessage)
	}
}

// fit leaves artifacts out of st until it is within MaxNodeStatusBytes:
// those of no ModelCache first (the cluster counts the others), each
// group from the end of the list; status.problems says how many. The
// summary still counts every artifact.
func fit(st *ModelCacheNodeStatus) {
	size := jsonSize(st)
	if size <= MaxNodeStatusBytes {
		return
	}
	var order []int
	for _, own := range []bool{false, true} {
		for i := len(st.Artifacts) - 1; i >= 0; i-- {
			if (st.Artifacts[i].ModelCache != "") == own {
				order = append(order, i)
			}
		}
	}
	out := map[int]bool{}
	const room = 512 // the problem's line
	for _, i := range order {
		if size+room <= MaxNodeStatusBytes {
			break
		}
		size -= jsonSize(st.Artifacts[i]) + 1
		out[i] = true
	}
	kept := st.Artifacts[:0:0]
	for i, a := range st.Artifacts {
		if !out[i] {
			kept = append(kept, a)
		}
	}
	st.Problems = append(st.Problems, fmt.Sprintf("%d of %d artifacts are not listed here: the status would pass its cap of %d KiB "+
		"(the API server refuses an object over about 1.5 MB); modelctl list on the node shows them all", len(out), len(st.Artifacts), MaxNodeStatusBytes>>10))
	st.Artifacts = kept
}

func jsonSize(v any) int {
	b, _ := json.Marshal(v)
	return len(b)
}

// round keeps 3 significant digits, so the status does not churn with
// noise digits and a download of 7 ms reads 0.007 s, not 0 (which
// omitempty would drop beside its bytes per second).
func round(f float64) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(f, 'g', 3, 64), 64)
	return v
}

// phaseSummary is "2 Ready, 1 Downloading": the artifacts' phases counted,
// in the order of an artifact's life, then any other phase by name.
func phaseSummary(arts []ArtifactStatus) string {
	n := map[string]int{}
	for _, a := range arts {
		n[a.Phase]++
	}
	order := []string{string(api.PhaseReady), string(api.PhaseDownloading), string(api.PhasePending), string(api.PhaseFailed), string(api.PhaseIncompatible), string(api.PhaseEvicted)}
	var rest []string
	for p := range n {
		if !slices.Contains(order, p) {
			rest = append(rest, p)
		}
	}
	sort.Strings(rest)
	var parts []string
	for _, p := range append(order, rest...) {
		if n[p] > 0 {
			parts = append(parts, strconv.Itoa(n[p])+" "+p)
		}
	}
	return strings.Join(parts, ", ")
}
