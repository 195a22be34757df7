// Package k8ssync is the daemon's thin loop with a Kubernetes cluster: it
// turns the ModelCache objects selected for this node into desires,
// writes this node's ModelCacheNode status, emits Events on transitions,
// holds artifacts that running pods mount, makes local PersistentVolumes
// for Ready models, and (on the one daemon that holds a Lease) aggregates
// the ModelCache status counts. The daemon keeps serving and reconciling
// from its last known desires when the API server is away.
package k8ssync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers"
)

// Node is what the loop needs of the daemon (daemon.Daemon implements it).
type Node interface {
	SetClusterDesires(want map[string]api.Desire, creds map[string]map[string]string) error
	Artifacts() ([]api.Artifact, error)
	StatusNow() (*api.Status, error)
	GPUs() api.GPUInventory
	Root() string
	Changed() <-chan struct{}
	SetPodHolders(map[string][]api.Holder)
}

// Config of the loop.
type Config struct {
	NodeName string
	Kube     *rest.Config
	// Namespace holds the aggregator's Lease (and nothing else).
	Namespace string
	// StatusInterval is the least time between two writes of this node's
	// status (changes in between are merged); Heartbeat is the most.
	StatusInterval time.Duration
	Heartbeat      time.Duration
	// LocalPVs makes a read-only local PersistentVolume of StorageClass for
	// each Ready model; PVQPS and PVBurst bound their creation and deletion.
	LocalPVs     bool
	StorageClass string
	PVQPS        float32
	PVBurst      int
	// Aggregate takes part in the election of the daemon that writes the
	// ModelCache status counts.
	Aggregate bool
	Log       *slog.Logger
}

// Labels on what the loop makes.
const (
	LabelNode    = "modelcache.io/node"
	LabelModel   = "modelcache.io/model"
	managerName  = "modelcached"
	leaseName    = "modelcache-aggregator"
	originPrefix = "k8s:"
)

var klogOnce sync.Once

// SetClientLog sends client-go's logs (klog, a global) to log, once per
// process. klog's setter must not race its readers: call it before any
// goroutine uses client-go (daemon.New does, before Run starts the loop).
func SetClientLog(log *slog.Logger) {
	klogOnce.Do(func() { klog.SetSlogLogger(log.With("lib", "client-go")) })
}

// Syncer is one node's loop.
type Syncer struct {
	cfg  Config
	node Node
	log  *slog.Logger
	kc   kubernetes.Interface
	dyn  dynamic.Interface
	rec  record.EventRecorder
	pvRL flowcontrol.RateLimiter

	mcInf   cache.SharedIndexInformer
	nodeInf cache.SharedIndexInformer
	podInf  cache.SharedIndexInformer

	kick chan struct{}

	mu          sync.Mutex
	lastStatus  []byte
	lastWrite   time.Time
	phases      map[string]string // artifact → phase at the last pass (for Events)
	owners      map[string]string // artifact → ModelCache
	secretCache map[string]secretEntry
	writeErrs   int
	timer       bool   // a later poke is pending
	created     bool   // this node's ModelCacheNode exists
	aggProblem  string // why this node cannot take part in aggregation ("" when it can)
}

type secretEntry struct {
	data map[string]string
	at   time.Time
}

// New prepares the loop; Run starts it.
func New(cfg Config, node Node) (*Syncer, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("k8s sync: no node name: set NODE_NAME from the downward API (spec.nodeName) or --node-name")
	}
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = 2 * time.Second
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 5 * time.Minute
	}
	if cfg.Namespace == "" {
		cfg.Namespace = "modelcache-system"
	}
	if cfg.PVQPS <= 0 {
		cfg.PVQPS, cfg.PVBurst = 1, 5
	}
	if cfg.StorageClass == "" {
		cfg.StorageClass = "modelcache-local"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	SetClientLog(cfg.Log)
	kcfg := rest.CopyConfig(cfg.Kube)
	kcfg.UserAgent = "modelcached/" + cfg.NodeName
	kc, err := kubernetes.NewForConfig(kcfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(kcfg)
	if err != nil {
		return nil, err
	}
	s := &Syncer{cfg: cfg, node: node, log: cfg.Log, kc: kc, dyn: dyn, kick: make(chan struct{}, 1),
		phases: map[string]string{}, owners: map[string]string{}, secretCache: map[string]secretEntry{},
		pvRL: flowcontrol.NewTokenBucketRateLimiter(cfg.PVQPS, cfg.PVBurst)}
	b := record.NewBroadcaster(record.WithCorrelatorOptions(record.CorrelatorOptions{QPS: 1.0 / 10, BurstSize: 10}))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kc.CoreV1().Events("")})
	s.rec = b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: managerName, Host: cfg.NodeName})
	return s, nil
}

// later pokes the loop after d; one timer at a time.
func (s *Syncer) later(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.timer {
		return
	}
	s.timer = true
	time.AfterFunc(d, func() {
		s.mu.Lock()
		s.timer = false
		s.mu.Unlock()
		s.poke()
	})
}

func (s *Syncer) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *Syncer) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.poke() },
		UpdateFunc: func(any, any) { s.poke() },
		DeleteFunc: func(any) { s.poke() },
	}
}

// Run syncs until ctx ends. Informers retry on their own while the API
// server is away; writes back off.
func (s *Syncer) Run(ctx context.Context) error {
	const resync = 10 * time.Minute
	df := dynamicinformer.NewDynamicSharedInformerFactory(s.dyn, resync)
	s.mcInf = df.ForResource(ModelCacheGVR).Informer()
	s.mcInf.AddEventHandler(s.handler())
	nf := informers.NewSharedInformerFactoryWithOptions(s.kc, resync, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", s.cfg.NodeName).String()
	}))
	s.nodeInf = nf.Core().V1().Nodes().Informer()
	s.nodeInf.AddEventHandler(s.handler())
	pf := informers.NewSharedInformerFactoryWithOptions(s.kc, resync, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", s.cfg.NodeName).String()
	}))
	s.podInf = pf.Core().V1().Pods().Informer()
	s.podInf.AddEventHandler(s.handler())
	df.Start(ctx.Done())
	nf.Start(ctx.Done())
	pf.Start(ctx.Done())
	if s.cfg.Aggregate {
		go s.aggregate(ctx)
	}
	synced := false
	tick := time.NewTicker(s.cfg.StatusInterval)
	defer tick.Stop()
	for {
		changed := s.node.Changed()
		if !synced && s.mcInf.HasSynced() && s.nodeInf.HasSynced() && s.podInf.HasSynced() {
			synced = true
			s.log.Info("k8s sync: informers synced", "node", s.cfg.NodeName)
		}
		if synced {
			s.pass(ctx)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.kick:
		case <-changed:
		case <-tick.C:
		}
		// Merge bursts of changes into one pass.
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// pass does one round: desires, pods, status, events, PVs.
func (s *Syncer) pass(ctx context.Context) {
	node, _ := s.thisNode()
	mcs := s.modelCaches()
	want, creds, owners := s.desires(ctx, node, mcs)
	if err := s.node.SetClusterDesires(want, creds); err != nil {
		s.log.Warn("k8s sync: desires", "err", err)
	}
	s.mu.Lock()
	s.owners = owners
	s.mu.Unlock()
	s.node.SetPodHolders(s.podHolders())
	arts, err := s.node.Artifacts()
	if err != nil {
		s.log.Warn("k8s sync: list artifacts", "err", err)
		return
	}
	s.events(arts, owners, mcs)
	s.writeStatus(ctx, arts, owners, want)
	if s.cfg.LocalPVs {
		s.syncPVs(ctx, arts, owners)
	}
}

func (s *Syncer) thisNode() (*corev1.Node, bool) {
	obj, ok, err := s.nodeInf.GetStore().GetByKey(s.cfg.NodeName)
	if err != nil || !ok {
		return nil, false
	}
	n, ok := obj.(*corev1.Node)
	return n, ok
}

// modelCaches lists the informer's ModelCaches as typed objects.
func (s *Syncer) modelCaches() []*ModelCache {
	var out []*ModelCache
	for _, o := range s.mcInf.GetStore().List() {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		var mc ModelCache
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &mc); err != nil {
			s.log.Warn("k8s sync: unreadable ModelCache", "name", u.GetName(), "err", err)
			continue
		}
		out = append(out, &mc)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Selected says whether mc selects a node with these labels.
func Selected(mc *ModelCache, nodeLabels map[string]string) (bool, error) {
	if mc.Spec.NodeSelector == nil {
		return true, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(mc.Spec.NodeSelector)
	if err != nil {
		return false, err
	}
	return sel.Matches(labels.Set(nodeLabels)), nil
}

// desires turns the selected ModelCaches into desires; owners maps every
// artifact name (with kernel caches and extra versions) to its ModelCache.
func (s *Syncer) desires(ctx context.Context, node *corev1.Node, all []*ModelCache) (map[string]api.Desire, map[string]map[string]string, map[string]string) {
	want := map[string]api.Desire{}
	creds := map[string]map[string]string{}
	owners := map[string]string{}
	var nodeLabels map[string]string
	if node != nil {
		nodeLabels = node.Labels
	}
	for _, mc := range all {
		ok, err := Selected(mc, nodeLabels)
		if err != nil {
			s.log.Warn("k8s sync: bad nodeSelector", "modelcache", mc.Name, "err", err)
			continue
		}
		if !ok {
			continue // deselected: no longer desired here; eviction may take it
		}
		state := api.StatePresent
		if mc.Spec.State == StateAbsent {
			state = api.StateAbsent
		}
		base := api.Desire{Name: mc.Name, URI: mc.Spec.Source, Include: mc.Spec.Include, Exclude: mc.Spec.Exclude, Digest: mc.Spec.Digest,
			Pin: mc.Spec.Pin, State: state, Origin: originPrefix + mc.Name}
		for i, kc := range mc.Spec.KernelCaches {
			ref := api.KernelCacheRef{Name: kc.Name, URI: kc.Image, Signature: kc.Signature}
			base.KernelCaches = append(base.KernelCaches, ref)
			owners[base.KernelCacheName(i)] = mc.Name
		}
		want[mc.Name], owners[mc.Name] = base, mc.Name
		for _, v := range mc.Spec.Versions {
			n := mc.Name + "-" + v.Suffix
			want[n] = api.Desire{Name: n, URI: v.Source, Digest: v.Digest, Include: mc.Spec.Include, Exclude: mc.Spec.Exclude,
				Pin: mc.Spec.Pin, State: state, Origin: originPrefix + mc.Name}
			owners[n] = mc.Name
		}
		if ref := mc.Spec.SecretRef; ref != nil {
			data, err := s.secret(ctx, ref.Namespace, ref.Name)
			if err != nil {
				s.log.Warn("k8s sync: credentials", "modelcache", mc.Name, "secret", ref.Namespace+"/"+ref.Name, "err", err)
			}
			if data != nil {
				for n, o := range owners {
					if o == mc.Name {
						creds[n] = data
					}
				}
			}
		}
	}
	return want, creds, owners
}

// secret reads one referenced Secret (only those; cached for a minute).
func (s *Syncer) secret(ctx context.Context, ns, name string) (map[string]string, error) {
	key := ns + "/" + name
	s.mu.Lock()
	e, ok := s.secretCache[key]
	s.mu.Unlock()
	if ok && time.Since(e.at) < time.Minute {
		return e.data, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sec, err := s.kc.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if ok {
			return e.data, err // keep the last known while the API server is away
		}
		return nil, err
	}
	data := map[string]string{}
	for k, v := range sec.Data {
		data[k] = string(v)
	}
	s.mu.Lock()
	s.secretCache[key] = secretEntry{data: data, at: time.Now()}
	s.mu.Unlock()
	return data, nil
}

// podHolders maps the artifacts that pods on this node mount (a hostPath
// under the store root, or a PV the loop made) to the pods.
func (s *Syncer) podHolders() map[string][]api.Holder {
	out := map[string][]api.Holder{}
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
		id := "pod " + p.Namespace + "/" + p.Name
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
	return out
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
// models/<name> or kernels/<name> holds that one; the root, models/ or
// kernels/ hold all of theirs.
func artifactsUnder(root, p string, names func() []string) []string {
	p = strings.TrimRight(p, "/")
	rel, ok := strings.CutPrefix(p, root)
	if !ok || (rel != "" && !strings.HasPrefix(rel, "/")) {
		return nil
	}
	parts := strings.Split(strings.TrimPrefix(rel, "/"), "/")
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
	pvc, err := s.kc.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claim, metav1.GetOptions{})
	if err != nil || pvc.Spec.VolumeName == "" {
		return ""
	}
	pv, err := s.kc.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil || pv.Labels[LabelNode] != s.cfg.NodeName {
		return ""
	}
	return pv.Labels[LabelModel]
}

// Event reasons.
const (
	EventDownloaded           = "Downloaded"
	EventFailed               = "Failed"
	EventIncompatible         = "Incompatible"
	EventSignature            = "SignatureVerificationFailed"
	EventInsufficientCapacity = "InsufficientCapacity"
	EventEvicted              = "Evicted"
	EventInvalidSpec          = api.ReasonInvalidSpec
	EventAggregation          = "AggregationDisabled"
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
			case "SignatureVerificationFailed":
				reason = EventSignature
			case "InsufficientCapacity":
				reason = EventInsufficientCapacity
			case api.ReasonInvalidSpec:
				reason = EventInvalidSpec
			}
			emit(name, corev1.EventTypeWarning, reason, a.Message)
		case api.PhasePending:
			if old == string(api.PhaseReady) {
				emit(name, corev1.EventTypeNormal, EventEvicted, "evicted from this node")
			}
		}
	}
	for name, old := range s.phases {
		if _, ok := now[name]; !ok && old == string(api.PhaseReady) {
			emit(name, corev1.EventTypeNormal, EventEvicted, "evicted from this node")
		}
	}
	s.phases = now
}

// writeStatus applies this node's ModelCacheNode when it changed, at most
// once per StatusInterval, and at least once per Heartbeat. Server-side
// apply: no read, no conflict.
func (s *Syncer) writeStatus(ctx context.Context, arts []api.Artifact, owners map[string]string, want map[string]api.Desire) {
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
			Digest: a.ManifestDigest, Bytes: a.Bytes, Message: fetchers.RedactText(a.Message), Reason: a.Reason}
		for _, h := range a.InUse {
			as.InUseBy = append(as.InUseBy, h.Kind+" "+h.ID)
		}
		if a.LastPull != nil {
			as.DownloadSeconds, as.BytesPerSecond = round(a.LastPull.Seconds), round(a.LastPull.BytesPerSecond)
		}
		if a.LastUsed != nil {
			as.LastUsed = a.LastUsed.UTC().Truncate(time.Minute).Format(time.RFC3339) // minutes: no status churn on every read
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
	sort.Slice(st.Artifacts, func(i, j int) bool { return st.Artifacts[i].Name < st.Artifacts[j].Name })
	s.mu.Lock()
	if s.aggProblem != "" {
		st.Problems = append(st.Problems, s.aggProblem)
	}
	s.mu.Unlock()
	body, _ := json.Marshal(st)
	s.mu.Lock()
	same := string(body) == string(s.lastStatus)
	due := time.Since(s.lastWrite) >= s.cfg.StatusInterval
	heartbeat := time.Since(s.lastWrite) >= s.cfg.Heartbeat
	backoff := s.cfg.StatusInterval << min(s.writeErrs, 6) // 2s, 4s, … 128s while writes fail
	if s.writeErrs > 0 && time.Since(s.lastWrite) < backoff {
		due = false
	}
	s.mu.Unlock()
	if (same && !heartbeat) || !due {
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
	s.lastStatus = body
}

func round(f float64) float64 { return float64(int64(f*100)) / 100 }

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

// syncPVs makes a read-only local PV for each Ready model of a ModelCache
// and deletes those of models no longer Ready; each create or delete
// takes a token from the bucket, so a fleet never bursts the API server.
func (s *Syncer) syncPVs(ctx context.Context, arts []api.Artifact, owners map[string]string) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pvs := s.kc.CoreV1().PersistentVolumes()
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
		if a.Phase == api.PhaseReady && a.Kind == api.KindModel && owners[a.Name] != "" && a.Path != "" {
			wantPV[PVName(s.cfg.NodeName, a.Name)] = a
		}
	}
	throttled := false
	for name, a := range wantPV {
		if _, ok := existing[name]; ok {
			continue
		}
		if !s.pvRL.TryAccept() {
			throttled = true
			break
		}
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{LabelNode: s.cfg.NodeName, LabelModel: a.Name}},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:                      corev1.ResourceList{corev1.ResourceStorage: *resourceBytes(a.Bytes)},
				AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadOnlyMany},
				PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
				StorageClassName:              s.cfg.StorageClass,
				MountOptions:                  nil,
				PersistentVolumeSource:        corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: a.Path}},
				NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{s.cfg.NodeName}}},
				}}}},
			},
		}
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
