package k8ssync

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"github.com/modelcache/modelcache/api"
)

func sha(s string) [32]byte { return sha256.Sum256([]byte(s)) }

func resourceBytes(n int64) *resource.Quantity {
	return resource.NewQuantity(max(n, 1), resource.BinarySI)
}

// aggregate runs for election of the one daemon that resolves each
// ModelCache's sources for the cluster and writes ModelCache status (a
// coordination.k8s.io Lease in Namespace); the leader watches every
// ModelCacheNode and writes a ModelCache's status only when it changes.
// One writer per cluster, not one per node: no write storms, no conflicts
// between nodes.
//
// The candidates watch the Lease instead of polling it (leaseLock reads
// it from an informer): a candidate that is not the leader sends nothing
// while the Lease is held, and one request to take it when it expires.
// The leader renews once a minute; a dead leader is replaced within
// LeaseDuration plus a RetryPeriod (about four minutes).
func (s *Syncer) aggregate(ctx context.Context) {
	leases := newInformer(s.coord.Leases(s.cfg.Namespace), &coordinationv1.Lease{}, 0,
		fields.OneTermEqualSelector("metadata.name", leaseName).String())
	go leases.Run(ctx.Done())
	// Until the watch has the Lease, Get says there is none and Create
	// asks the API server, which answers: wait a little for it, not for
	// ever (a list the RBAC forbids must not hide the problem that
	// aggregationProblem reports).
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	cache.WaitForCacheSync(wctx.Done(), leases.HasSynced)
	cancel()
	lock := reportingLock{leaseLocker: &leaseLock{client: s.coord, store: leases.GetStore(),
		ns: s.cfg.Namespace, name: leaseName, identity: s.cfg.NodeName}, report: s.aggregationProblem}
	for ctx.Err() == nil {
		// While the Lease cannot be written (no namespace, RBAC), try
		// every 10 s rather than every RetryPeriod, so that the fix shows
		// at once: such a candidate cannot be leading, and a new
		// election tries at once.
		ectx, cancel := context.WithCancel(ctx)
		go func() {
			t := time.NewTicker(10 * time.Second)
			defer t.Stop()
			for {
				select {
				case <-ectx.Done():
					return
				case <-t.C:
					s.mu.Lock()
					stuck := s.aggProblem != ""
					s.mu.Unlock()
					if stuck {
						cancel()
						return
					}
				}
			}
		}()
		e := &elector{lock: lock, leaseDuration: 3 * time.Minute, renewDeadline: 150 * time.Second, retryPeriod: time.Minute}
		e.run(ectx, func(ctx context.Context) {
			s.log.Info("k8s sync: resolving sources and aggregating ModelCache status", "node", s.cfg.NodeName)
			s.lead(ctx)
		})
		cancel()
	}
}

func (s *Syncer) lead(ctx context.Context) {
	s.mu.Lock()
	s.leading = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.leading = false
		s.mu.Unlock()
	}()
	mcn := newInformer(s.dyn.Resource(ModelCacheNodeGVR), &unstructured.Unstructured{}, 10*time.Minute, "")
	kick := make(chan struct{}, 1)
	poke := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	h := cache.ResourceEventHandlerFuncs{AddFunc: func(any) { poke() }, UpdateFunc: func(any, any) { poke() }, DeleteFunc: func(any) { poke() }}
	mcn.AddEventHandler(h)
	s.mcInf.AddEventHandler(h)
	go mcn.Run(ctx.Done())
	written := map[string]ModelCacheStatus{}
	// A ModelCache's status goes to every daemon: at most one write per
	// PublishInterval each, the changes in between merged (holders.go).
	published := map[string]time.Time{}
	var due <-chan time.Time
	var dueAt time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case <-due:
			due, dueAt = nil, time.Time{}
		case <-time.After(time.Minute):
		}
		if !mcn.HasSynced() {
			continue
		}
		time.Sleep(200 * time.Millisecond) // merge bursts
		nodes, _ := peerNodes(mcn.GetStore().List())
		for _, mc := range s.modelCaches() {
			fm := s.withFounded(mc, nodes) // what the nodes bear out of another leader's record (trust.go)
			resolved, again := s.resolveAll(ctx, fm)
			if again {
				go func() { time.Sleep(resolveRetry); poke() }()
			}
			m := *fm
			m.Status.Resolved = s.recordOrigins(ctx, mc, resolved, nodes, time.Now())
			st, flips := aggregate(&m, nodes, s.expected(mc, m.Status.Resolved), time.Now())
			s.endorsed.add(mc.Name, st.Resolved) // this leader's, written or about to be
			if old, ok := written[mc.Name]; ok && reflect.DeepEqual(old, st) {
				continue
			}
			if reflect.DeepEqual(stripTimes(mc.Status), stripTimes(st)) {
				written[mc.Name] = st
				s.endorsed.add(activeKey(mc.Name), st.Active)
				continue
			}
			if at := published[mc.Name].Add(s.cfg.PublishInterval); time.Now().Before(at) {
				if due == nil || at.Before(dueAt) {
					due, dueAt = time.After(time.Until(at)), at
				}
				continue
			}
			published[mc.Name] = time.Now()
			if err := s.writeMCStatus(ctx, mc, st); err != nil {
				s.log.Warn("k8s sync: ModelCache status", "modelcache", mc.Name, "err", err)
				go func() { time.Sleep(2 * time.Second); poke() }()
				continue
			}
			written[mc.Name] = st
			s.endorsed.add(activeKey(mc.Name), st.Active)
			s.announce(mc, flips)
		}
	}
}

// announce logs each flip of status.active and records an Event on the
// ModelCache, once per revision made active.
func (s *Syncer) announce(mc *ModelCache, flips []flip) {
	for _, f := range flips {
		key := mc.Name + "/" + f.artifact
		s.mu.Lock()
		seen := s.flipped[key] == f.to
		s.flipped[key] = f.to
		s.mu.Unlock()
		if seen {
			continue
		}
		msg := fmt.Sprintf("%s: active revision %s → %s (%d of %d nodes hold it; the flip needs %d%%)", f.artifact, f.from, f.to, f.ready, f.eligible, minReadyPercent(mc))
		s.log.Info("k8s sync: rollout flipped", "modelcache", mc.Name, "artifact", f.artifact, "from", f.from, "to", f.to, "ready", f.ready, "eligible", f.eligible)
		ref := &corev1.ObjectReference{APIVersion: Group + "/" + Version, Kind: "ModelCache", Name: mc.Name, UID: mc.UID}
		s.rec.Event(ref, corev1.EventTypeNormal, EventRolledOut, msg)
	}
}

// Aggregate is mc's status from the nodes' reports at now: the phases of
// its main artifact counted, the folder checksum of each of
// mc.Status.Resolved that has none, status.active and the rollout.
func Aggregate(mc *ModelCache, nodes []ModelCacheNode, now time.Time) ModelCacheStatus {
	st, _ := aggregate(mc, nodes, nil, now)
	return st
}

// aggregate is Aggregate, with expect (the nodes expected to pull each
// resolution: Syncer.expected) among the peers.
func aggregate(mc *ModelCache, nodes []ModelCacheNode, expect []PeerSet, now time.Time) (ModelCacheStatus, []flip) {
	statuses := make([]ModelCacheNodeStatus, len(nodes))
	for i := range nodes {
		statuses[i] = nodes[i].Status
	}
	st := ModelCacheStatus{ObservedGeneration: mc.Generation, Resolved: recordDigests(mc.Status.Resolved, nodes)}
	var flips []flip
	st.Active, st.Rollout, flips = rollouts(mc, st.Resolved, nodes, now)
	st.Active = recordDigests(st.Active, nodes) // a forged checksum of the active revision goes too
	st.Versions = versionStatuses(mc, statuses)
	var origins []string
	for _, e := range append(slices.Clone(st.Resolved), st.Active...) {
		origins = append(origins, e.OriginNodes...)
	}
	st.Peers, st.PeerAddresses = peerSets(mc, nodes, origins, expect, now)
	st.Nodes = st.Versions[0].Nodes
	if len(st.Versions[0].Revisions) > 0 {
		st.Revision = st.Versions[0].Revisions[0].Revision // the most common Ready revision
	}
	if e, ok := activeOf(&ModelCache{Status: st}, mc.Name); ok && e.Revision != "" {
		st.Revision = e.Revision // the cluster's active revision, not a vote
	}
	ready := metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: "NotReadyEverywhere",
		Message: st.Nodes.ReadyText + " selected nodes hold it", ObservedGeneration: mc.Generation}
	if st.Nodes.Total > 0 && st.Nodes.Ready == st.Nodes.Total {
		ready.Status, ready.Reason = metav1.ConditionTrue, "ReadyOnAllNodes"
	}
	if mc.Spec.State == StateAbsent {
		ready.Reason, ready.Message = "Absent", "state Absent: evicted from the selected nodes"
	}
	degraded := metav1.Condition{Type: "Degraded", Status: metav1.ConditionFalse, Reason: "NoFailures", ObservedGeneration: mc.Generation}
	if st.Nodes.Failed > 0 {
		degraded.Status, degraded.Reason, degraded.Message = metav1.ConditionTrue, api.ReasonPullFailed, strconv.Itoa(st.Nodes.Failed)+" nodes failed to pull it"
	}
	conds := append([]metav1.Condition(nil), mc.Status.Conditions...)
	meta.SetStatusCondition(&conds, ready)
	meta.SetStatusCondition(&conds, degraded)
	st.Conditions = conds
	return st, flips
}

func stripTimes(st ModelCacheStatus) ModelCacheStatus {
	st.Conditions = append([]metav1.Condition(nil), st.Conditions...)
	for i := range st.Conditions {
		st.Conditions[i].LastTransitionTime = metav1.Time{}
	}
	return st
}

func (s *Syncer) writeMCStatus(ctx context.Context, mc *ModelCache, st ModelCacheStatus) error {
	raw, _ := json.Marshal(st)
	var status map[string]any
	json.Unmarshal(raw, &status)
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": Group + "/" + Version, "kind": "ModelCache",
		"metadata": map[string]any{"name": mc.Name, "resourceVersion": mc.ResourceVersion},
		"status":   status,
	}}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := s.dyn.Resource(ModelCacheGVR).UpdateStatus(ctx, u, metav1.UpdateOptions{FieldManager: managerName})
	return err // a conflict: the informer brings the newer object and the next pass retries
}

// reportingLock is the aggregator's Lease lock that says why it cannot be
// taken: leader election only logs at a verbosity nobody runs, so a
// missing namespace would silently leave every ModelCache's status
// unwritten.
type reportingLock struct {
	leaseLocker
	report func(error)
}

func (l reportingLock) Create(ctx context.Context, ler leaseRecord) error {
	err := l.leaseLocker.Create(ctx, ler)
	l.report(err)
	return err
}

func (l reportingLock) Get(ctx context.Context) (*leaseRecord, []byte, error) {
	r, b, err := l.leaseLocker.Get(ctx)
	if err == nil {
		l.report(nil) // the Lease exists: whoever holds it, aggregation works
	}
	return r, b, err
}

func (l reportingLock) Update(ctx context.Context, ler leaseRecord) error {
	err := l.leaseLocker.Update(ctx, ler)
	l.report(err)
	return err
}

// aggregationProblem records why the Lease cannot be written (nil: it
// can): in the log and as an Event once per change, and in this node's
// ModelCacheNode status while it lasts.
func (s *Syncer) aggregationProblem(err error) {
	msg := ""
	switch {
	case err == nil:
	case apierrors.IsNotFound(err):
		msg = fmt.Sprintf("the aggregator's Lease cannot be created: namespace %q does not exist, so ModelCache status (ready counts) is not aggregated; "+
			"create it (kubectl create namespace %s) or point modelcached at an existing one (--lease-namespace, POD_NAMESPACE)", s.cfg.Namespace, s.cfg.Namespace)
	case apierrors.IsForbidden(err):
		msg = fmt.Sprintf("the aggregator's Lease in namespace %q is forbidden to this node's service account, so ModelCache status is not aggregated; "+
			"grant it get/create/update on coordination.k8s.io leases there (the kustomize bundle's Role does): %v", s.cfg.Namespace, err)
	default:
		return // a passing error: leader election retries
	}
	s.mu.Lock()
	changed := msg != s.aggProblem
	s.aggProblem = msg
	s.mu.Unlock()
	if !changed {
		return
	}
	ref := &corev1.ObjectReference{APIVersion: Group + "/" + Version, Kind: "ModelCacheNode", Name: s.cfg.NodeName}
	if msg != "" {
		s.log.Error("k8s sync: aggregation disabled", "namespace", s.cfg.Namespace, "why", msg)
		s.rec.Event(ref, corev1.EventTypeWarning, EventAggregation, msg)
	} else {
		s.log.Info("k8s sync: the aggregator's Lease can be written again", "namespace", s.cfg.Namespace)
	}
	s.poke()
}

// versionStatuses is status.versions: for mc's main artifact, then each
// versions entry, what the nodes report of it.
func versionStatuses(mc *ModelCache, nodes []ModelCacheNodeStatus) []VersionStatus {
	out := []VersionStatus{versionStatus(mc.Name, mc.Name, "", nodes)}
	for _, v := range mc.Spec.Versions {
		out = append(out, versionStatus(mc.Name, mc.Name+"-"+v.Suffix, v.Suffix, nodes))
	}
	return out
}

// versionStatus counts one artifact of ModelCache owner over the nodes:
// phases, the Ready revisions (most served first, then by name), the pods
// (sorted, at most MaxStatusPods), the latest use and download.
func versionStatus(owner, artifact, suffix string, nodes []ModelCacheNodeStatus) VersionStatus {
	vs := VersionStatus{Artifact: artifact, Suffix: suffix}
	type rd struct{ rev, digest string }
	revs := map[rd]int{}
	pods := map[string]bool{}
	for _, n := range nodes {
		for _, a := range n.Artifacts {
			if a.Name != artifact || a.ModelCache != owner {
				continue
			}
			vs.Nodes.Total++
			switch api.Phase(a.Phase) {
			case api.PhaseReady:
				vs.Nodes.Ready++
				revs[rd{clip(a.Revision, MaxStatusField), clip(a.Digest, MaxStatusField)}]++
			case api.PhaseDownloading:
				vs.Nodes.Downloading++
			case api.PhaseFailed:
				vs.Nodes.Failed++
			case api.PhaseIncompatible:
				vs.Nodes.Incompatible++
			default:
				vs.Nodes.Pending++
			}
			for _, p := range a.Pods {
				pods[clip(p, MaxStatusField)] = true
			}
			// RFC 3339 in UTC sorts as time; another node's report is
			// clipped like the rest of what is copied from it.
			vs.LastUsed = max(vs.LastUsed, clip(a.LastUsed, MaxStatusField))
			vs.LastDownloaded = max(vs.LastDownloaded, clip(a.DownloadCompleted, MaxStatusField))
			o, p := max(a.OriginBytes, 0), max(a.PeerBytes, 0)
			vs.OriginBytes += o
			vs.PeerBytes += p
			if o > 0 && float64(o) > OriginShare*float64(o+p) {
				vs.FromOrigin++
			}
		}
	}
	vs.Nodes.ReadyText = strconv.Itoa(vs.Nodes.Ready) + "/" + strconv.Itoa(vs.Nodes.Total)
	for r, n := range revs {
		vs.Revisions = append(vs.Revisions, RevisionCount{Revision: r.rev, Digest: r.digest, Nodes: n})
	}
	sort.Slice(vs.Revisions, func(i, j int) bool {
		a, b := vs.Revisions[i], vs.Revisions[j]
		if a.Nodes != b.Nodes {
			return a.Nodes > b.Nodes
		}
		return a.Revision+a.Digest < b.Revision+b.Digest
	})
	vs.Revisions = vs.Revisions[:min(len(vs.Revisions), MaxStatusRevisions)]
	vs.PodCount = len(pods)
	vs.Pods = slices.Sorted(maps.Keys(pods))
	vs.Pods = vs.Pods[:min(len(vs.Pods), MaxStatusPods)]
	return vs
}
