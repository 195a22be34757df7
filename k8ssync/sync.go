// Package k8ssync is the daemon's thin loop with a Kubernetes cluster: it
// turns the ModelCache objects selected for this node into desires,
// writes this node's ModelCacheNode status, emits Events on transitions,
// holds artifacts that running pods mount, makes local PersistentVolumes
// for Ready models, and (on the one daemon that holds a Lease) aggregates
// the ModelCache status counts. The daemon keeps serving and reconciling
// from its last known desires when the API server is away.
//
// Where each concern lives:
//
//	sync.go       the Node it serves, Config, New, Run and one pass of the loop
//	desires.go    ModelCache objects selected for this node → desires
//	secrets.go    watches of the Secrets that hold their credentials
//	credentials.go which Secrets a ModelCache may use (its own namespace's
//	              or a ModelCacheCredentials grant) and who may mount the result
//	pods.go       pods on this node that mount an artifact (hostPath or a
//	              PV of ours) → the holders that keep it from eviction
//	events.go     Events on a ModelCache when one of its artifacts changes phase
//	status.go     this node's ModelCacheNode status (server-side apply)
//	volumes.go    local PersistentVolumes for Ready public models (LocalPV, the
//	              shape the bundle's admission policy admits)
//	aggregate.go  the Lease holder's roll-up of ModelCache status counts
//	resolve.go    one resolution per cluster: the Lease holder resolves each
//	              source once into status.resolved; nodes pull what it recorded
//	pinned.go     a recorded URI is pulled only when it is the spec's source at
//	              a revision (atRevision); forged entries are refused
//	trust.go      what a seized Lease cannot make last: each pass keeps only
//	              the checksums, resolutions, active revisions and origin
//	              nodes the nodes' own reports bear out
//	rollout.go    coordinated rollouts: status.active vs status.resolved,
//	              prefetch of the target, the flip at minReadyPercent, retainOld
//	peers.go      watched ModelCacheNode objects converted (the leader's)
//	holders.go    who holds what for fan-out: the leader publishes the
//	              nodes of each revision in the ModelCache status at a
//	              bounded rate; every daemon hands them to the planner
//	              (with Config.PeerAddress), watching no ModelCacheNode
//	selection.go  whether a ModelCache selects a given node (NodeSelection,
//	              for the peer port's authorizer), whether a request comes
//	              from the pod or Node its token is bound to (From), and
//	              which ModelCache a desire comes from
//	origins.go    the nodes that fetch a resolution from the origin for the
//	              cluster (status.resolved[].originNodes), and Rendezvous
//	labels.go     scheduling labels on this node's Node (model ready, kernel
//	              cache compatible)
//	lease.go      a quiet API footprint: long watches, informers without a
//	              factory, a Lease lock that candidates read from an informer,
//	              and the election over it
//	limits.go     caps on what a status copies (clip, clipText, clipList)
//	types.go      the CRD types
package k8ssync

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes/scheme"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
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
	// SetPodHolders hands over the artifacts pods on this node mount
	// (artifact → holders) and the names of those pods (UID →
	// "namespace/name").
	SetPodHolders(holders map[string][]api.Holder, names map[string]string)
	// Resolve pins a desire's source (the elected daemon's one
	// resolution for the cluster), with the ModelCache Secret's
	// credentials: the immutable revision and the URI that names it.
	Resolve(ctx context.Context, ds api.Desire, creds map[string]string) (revision, pinnedURI string, err error)
	// SetPeerNodes hands over the nodes that hold, fetch, want or failed
	// the artifacts of the ModelCaches, as the elected daemon published
	// them (status.peers), and this node's own artifacts (only with
	// Config.PeerAddress): where the other daemons serve blobs and what
	// they hold (holders.go). Only the fields the planner reads are set:
	// name, peer address, heartbeat (the hand-over's time), and per
	// artifact name, ModelCache, phase, revision, digest and next.
	SetPeerNodes(nodes []ModelCacheNode)
}

// Config of the loop.
type Config struct {
	NodeName string
	Kube     *rest.Config
	// Namespace is the daemon's own: it holds the aggregator's Lease, and
	// its Secrets are the ones a ModelCache may name without a grant
	// (credentials.go).
	Namespace string
	// StatusInterval is the least time between two writes of this node's
	// status (changes in between are merged; default 10s: at most 6
	// writes a minute during a rollout); Heartbeat is the most (default
	// an hour: a request an hour at steady state). A change of the
	// capacity figures alone (used, free bytes: they move through every
	// download) is written with the next other change or the heartbeat,
	// or on its own at most every CapacityInterval (default 5m) once it
	// passes 5% of the capacity.
	StatusInterval   time.Duration
	Heartbeat        time.Duration
	CapacityInterval time.Duration
	// PublishInterval is the least time between two writes of one
	// ModelCache's status by the elected daemon (default 5s): the counts
	// and the nodes of each revision (holders.go) that every daemon
	// receives.
	PublishInterval time.Duration
	// LocalPVs makes a read-only local PersistentVolume of StorageClass for
	// each Ready model; PVQPS and PVBurst bound their creation and deletion.
	LocalPVs     bool
	StorageClass string
	PVQPS        float32
	PVBurst      int
	// Aggregate takes part in the election of the daemon that writes the
	// ModelCache status counts.
	Aggregate bool
	// Self is the daemon's own pod, "namespace/name" (POD_NAMESPACE and
	// POD_NAME from the downward API); empty outside a pod. It mounts the
	// whole store, so it is never counted as a holder.
	Self string
	// PeerAddress, when set, is this daemon's peer port as the others
	// reach it (http://10.0.0.7:7435): written to status.peerAddress, and
	// with it the loop hands the nodes the ModelCaches' status.peers list
	// to Node.SetPeerNodes (holders.go).
	PeerAddress string
	// OriginConcurrency is how many nodes the elected daemon records as
	// the origin nodes of a model resolution (default 2, at most
	// MaxOriginNodes; origins.go).
	OriginConcurrency int
	Log               *slog.Logger
	// Now is the clock of the elected daemon's Poll schedule (default
	// time.Now; tests move it on).
	Now func() time.Time
}

// Defaults of Config.StatusInterval and PublishInterval.
const (
	DefaultStatusInterval  = 10 * time.Second
	DefaultPublishInterval = 5 * time.Second
)

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
	// The typed clients of the two API groups the loop uses, not
	// kubernetes.Interface, which links the client of every built-in group.
	core  typedcorev1.CoreV1Interface
	coord coordinationv1client.CoordinationV1Interface
	dyn   dynamic.Interface
	rec   record.EventRecorder
	pvRL  flowcontrol.RateLimiter

	mcInf   cache.SharedIndexInformer
	credInf cache.SharedIndexInformer // ModelCacheCredentials (credentials.go)
	nodeInf cache.SharedIndexInformer
	podInf  cache.SharedIndexInformer

	kick    chan struct{}
	secrets secretWatches // the watches of the Secrets ModelCaches name (secrets.go)

	mu           sync.Mutex
	lastStatus   []byte
	lastRest     string               // lastStatus without its capacity figures (withoutCapacity)
	lastCapacity ModelCacheNodeStatus // lastStatus as written (its capacity figures)
	lastWrite    time.Time
	phases       map[string]string     // artifact → phase at the last pass (for Events)
	owners       map[string]string     // artifact → ModelCache
	lastWant     map[string]api.Desire // the desires last handed to the daemon
	labelPatch   string                // the last patch of this node's labels, and when
	labelPatchAt time.Time
	polled       map[string]time.Time   // modelcache/artifact → when this leader last polled its source
	flipped      map[string]string      // modelcache/artifact → the revision this leader last made active (one Event per flip)
	origins      map[string]originsMemo // modelcache/artifact → this leader's last assignment of origin nodes
	nexts        map[string]string      // artifact → the phase of its prefetch at the last pass (for Events)
	refused      map[string]bool        // the status entries this node refused at the last pass (one Event each)
	writeErrs    int
	timer        bool                 // a later poke is pending
	created      bool                 // this node's ModelCacheNode exists
	aggProblem   string               // why this node cannot take part in aggregation ("" when it can)
	leading      bool                 // this daemon is the elected one
	ownStatus    ModelCacheNodeStatus // this node's status at the last pass (written or not)
	peersKey     string               // the peer view last handed over, without heartbeats, and when
	peersAt      time.Time

	endorsed endorsements // the resolutions this leader wrote or kept (trust.go)
}

// New prepares the loop; Run starts it.
func New(cfg Config, node Node) (*Syncer, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("k8s sync: no node name: set NODE_NAME from the downward API (spec.nodeName) or --node-name")
	}
	if cfg.StatusInterval <= 0 {
		cfg.StatusInterval = DefaultStatusInterval
	}
	if cfg.CapacityInterval <= 0 {
		cfg.CapacityInterval = 5 * time.Minute
	}
	if cfg.PublishInterval <= 0 {
		cfg.PublishInterval = DefaultPublishInterval
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = time.Hour
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
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.OriginConcurrency <= 0 {
		cfg.OriginConcurrency = defaultOriginConcurrency
	}
	SetClientLog(cfg.Log)
	kcfg := rest.CopyConfig(cfg.Kube)
	kcfg.UserAgent = "modelcached/" + cfg.NodeName
	core, coord, err := typedClients(kcfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(kcfg)
	if err != nil {
		return nil, err
	}
	s := &Syncer{cfg: cfg, node: node, log: cfg.Log, core: core, coord: coord, dyn: dyn, kick: make(chan struct{}, 1),
		phases: map[string]string{}, owners: map[string]string{},
		polled: map[string]time.Time{}, flipped: map[string]string{}, origins: map[string]originsMemo{}, nexts: map[string]string{},
		pvRL: flowcontrol.NewTokenBucketRateLimiter(cfg.PVQPS, cfg.PVBurst)}
	b := record.NewBroadcaster(record.WithCorrelatorOptions(record.CorrelatorOptions{QPS: 1.0 / 10, BurstSize: 10}))
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: core.Events("")})
	s.rec = b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: managerName, Host: cfg.NodeName})
	return s, nil
}

// typedClients are the core and coordination clients as
// kubernetes.NewForConfig makes them: one HTTP client, and one rate
// limiter shared by both when cfg sets QPS.
func typedClients(cfg *rest.Config) (typedcorev1.CoreV1Interface, coordinationv1client.CoordinationV1Interface, error) {
	c := *cfg
	if c.RateLimiter == nil && c.QPS > 0 {
		if c.Burst <= 0 {
			return nil, nil, errors.New("k8s sync: the client's Burst must be above 0 when QPS is set")
		}
		c.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(c.QPS, c.Burst)
	}
	hc, err := rest.HTTPClientFor(&c)
	if err != nil {
		return nil, nil, err
	}
	core, err := typedcorev1.NewForConfigAndClient(&c, hc)
	if err != nil {
		return nil, nil, err
	}
	coord, err := coordinationv1client.NewForConfigAndClient(&c, hc)
	return core, coord, err
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
	s.mcInf = newInformer(s.dyn.Resource(ModelCacheGVR), &unstructured.Unstructured{}, resync, "")
	s.nodeInf = newInformer(s.core.Nodes(), &corev1.Node{}, resync, fields.OneTermEqualSelector("metadata.name", s.cfg.NodeName).String())
	s.podInf = newInformer(s.core.Pods(""), &corev1.Pod{}, resync, fields.OneTermEqualSelector("spec.nodeName", s.cfg.NodeName).String())
	// Not waited for: a bundle without its CRD refuses the Secrets of other
	// namespaces (credentialsOf says why) and serves the rest.
	s.credInf = newInformer(s.dyn.Resource(ModelCacheCredentialsGVR), &unstructured.Unstructured{}, resync, "")
	for _, inf := range []cache.SharedIndexInformer{s.mcInf, s.credInf, s.nodeInf, s.podInf} {
		inf.AddEventHandler(s.handler())
		go inf.Run(ctx.Done())
	}
	defer s.keepSecrets(map[string]bool{}, nil) // stops the Secrets' watches
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
	current := map[string]served{}
	if arts, err := s.node.Artifacts(); err == nil {
		for _, a := range arts {
			if a.Path != "" { // its current version is Ready
				current[a.Name] = served{a.Revision, fetchers.RedactURI(a.Source)}
			}
		}
	}
	want, creds, owners, pending := s.desires(ctx, node, mcs, current)
	if err := s.node.SetClusterDesires(want, creds); err != nil {
		s.log.Warn("k8s sync: desires", "err", err)
	}
	s.mu.Lock()
	s.owners, s.lastWant = owners, want
	s.mu.Unlock()
	s.node.SetPodHolders(s.podHolders())
	arts, err := s.node.Artifacts()
	if err != nil {
		s.log.Warn("k8s sync: list artifacts", "err", err)
		return
	}
	s.events(arts, owners, mcs)
	s.writeStatus(ctx, arts, owners, want, pending)
	if s.cfg.PeerAddress != "" {
		s.handPeers(mcs)
	}
	s.syncLabels(ctx, node, arts, mcs, want)
	if s.cfg.LocalPVs {
		s.syncPVs(ctx, arts, owners, want)
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
