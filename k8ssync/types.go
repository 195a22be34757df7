package k8ssync

import (
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/modelcache/modelcache/api"
)

// Group and version of the CRDs (deploy/crds/).
const (
	Group   = "modelcache.io"
	Version = "v1alpha1"
)

// Resources of the CRDs: ModelCache and ModelCacheNode are
// cluster-scoped, ModelCacheCredentials namespaced.
var (
	ModelCacheGVR            = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "modelcaches"}
	ModelCacheNodeGVR        = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "modelcachenodes"}
	ModelCacheCredentialsGVR = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "modelcachecredentials"}
)

// ModelCache declares an artifact that the selected nodes must hold (or
// must not: state Absent).
type ModelCache struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              ModelCacheSpec   `json:"spec"`
	Status            ModelCacheStatus `json:"status,omitempty"`
}

// ModelCacheSpec is the desired state.
type ModelCacheSpec struct {
	// Source URI: hf://, s3://, oci://, ngc://, http(s)://, file://.
	Source  string   `json:"source"`
	Include []string `json:"include,omitempty"`
	Exclude []string `json:"exclude,omitempty"`
	// Digest is the expected manifest digest (sha256:…).
	Digest string `json:"digest,omitempty"`
	// SecretRef names a Secret with the source's credentials: HF_TOKEN,
	// AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY(/AWS_SESSION_TOKEN),
	// HTTP_AUTHORIZATION (an http(s) source's Authorization header),
	// NGC_API_KEY (an ngc:// source) or .dockerconfigjson. A Secret of
	// the daemon's own namespace is used as named; a Secret of another
	// namespace N only where a ModelCacheCredentials in N grants it to
	// this ModelCache and its sources (credentials.go).
	SecretRef *SecretRef `json:"secretRef,omitempty"`
	// AllowedNamespaces are the namespaces whose pods may mount the
	// artifacts when they are fetched with a Secret of the daemon's
	// namespace (the daemon's namespace always may). Artifacts fetched
	// without credentials mount in any namespace; with a
	// ModelCacheCredentials, its own list governs.
	AllowedNamespaces []string `json:"allowedNamespaces,omitempty"`
	// Public is the operator's word that what the nodes fetch with
	// credentials may be public there: with the daemon's own credentials
	// or a Secret of the daemon's namespace, every pod may mount the
	// artifacts (api.Desire.Public). Without it they are private. A
	// Secret granted by a ModelCacheCredentials stays private to the
	// grant's namespaces.
	Public bool `json:"public,omitempty"`
	// NodeSelector selects nodes by their labels; empty selects every node.
	NodeSelector *metav1.LabelSelector `json:"nodeSelector,omitempty"`
	// State is Present (default) or Absent (evicted from every node).
	State string `json:"state,omitempty"`
	Pin   bool   `json:"pin,omitempty"`
	// KernelCaches are kernel cache images for the model, one per GPU
	// architecture; each node takes the ones its GPUs run.
	KernelCaches []KernelCacheSpec `json:"kernelCaches,omitempty"`
	// CaptureKernelCaches lets each node's admin capture what pods
	// compiled into writable kernel cache volumes of this model (modelctl
	// kernelcache capture, with the admin's credentials).
	CaptureKernelCaches bool `json:"captureKernelCaches,omitempty"`
	// Xet (hf:// sources) false makes the nodes read every file whole
	// through the Hub's resolve URL instead of rebuilding it from the Xet
	// store, which fetches only the chunks a node lacks; unset or true:
	// Xet where the Hub offers it and the node's --xet allows it
	// (api.Desire.Xet). It applies to spec.versions too.
	Xet *bool `json:"xet,omitempty"`
	// Versions keeps further revisions present besides the main one
	// (e.g. during a rollout), each as its own artifact <name>-<suffix>.
	Versions []VersionSpec `json:"versions,omitempty"`
	// UpdatePolicy says when the elected daemon resolves the sources
	// again: OnChange (default) when the spec names another source, Poll
	// also every interval; a revision that moved starts a rollout.
	UpdatePolicy *UpdatePolicy `json:"updatePolicy,omitempty"`
	// Rollout governs how a new revision of the model (and of each
	// versions entry) replaces the active one on the selected nodes.
	Rollout *RolloutSpec `json:"rollout,omitempty"`
}

// Update policies.
const (
	PolicyOnChange = "OnChange"
	PolicyPoll     = "Poll"
)

// MinPollInterval is the shortest Poll interval the CRD admits.
const MinPollInterval = time.Minute

// UpdatePolicy is spec.updatePolicy.
type UpdatePolicy struct {
	// Type is OnChange (default) or Poll.
	Type string `json:"type,omitempty"`
	// Interval is how often Poll resolves again: a Go duration, at
	// least 1m (e.g. 10m, 1h).
	Interval string `json:"interval,omitempty"`
}

// RolloutSpec is spec.rollout.
type RolloutSpec struct {
	// MinReadyPercent of the selected nodes that are not Failed or
	// Incompatible must hold the new revision before the cluster makes it
	// active (default 100).
	MinReadyPercent *int `json:"minReadyPercent,omitempty"`
	// RetainOld keeps the previous revision on the nodes for this long
	// after the flip (a Go duration), so that a rollback is immediate;
	// without it the previous revision goes once nothing holds it.
	RetainOld string `json:"retainOld,omitempty"`
}

// SecretRef points at a Secret.
type SecretRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

// ModelCacheCredentials (namespaced) is a namespace's consent that one
// ModelCache use one Secret of that namespace for the sources it lists:
// an object in namespace N names Secrets of N only, so whoever may
// create a ModelCache cannot borrow N's credentials without N.
type ModelCacheCredentials struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              ModelCacheCredentialsSpec `json:"spec"`
}

// ModelCacheCredentialsSpec is what the namespace grants.
type ModelCacheCredentialsSpec struct {
	// ModelCache is the name of the ModelCache the Secret is for; its
	// spec.secretRef must name this namespace and SecretName.
	ModelCache string `json:"modelCache"`
	// SecretName is a Secret of this namespace.
	SecretName string `json:"secretName"`
	// Sources are where the credentials may be sent: each source of the
	// ModelCache (spec.source, versions[].source, kernelCaches[].image)
	// must be one of them, exactly or pinned at a revision.
	Sources []string `json:"sources"`
	// AllowedNamespaces are further namespaces whose pods may mount the
	// artifacts (this namespace always may).
	AllowedNamespaces []string `json:"allowedNamespaces,omitempty"`
}

// KernelCacheSpec is one kernel cache image and its signature policy.
type KernelCacheSpec struct {
	Name      string               `json:"name,omitempty"`
	Image     string               `json:"image"`
	Signature *api.SignaturePolicy `json:"signature,omitempty"`
}

// VersionSpec is one more revision to keep present.
type VersionSpec struct {
	// Suffix names the artifact <ModelCache name>-<suffix>.
	Suffix string `json:"suffix"`
	Source string `json:"source"`
	Digest string `json:"digest,omitempty"`
}

// States of a ModelCache.
const (
	StatePresent = "Present"
	StateAbsent  = "Absent"
)

// ModelCacheStatus is aggregated over the nodes by the elected daemon.
type ModelCacheStatus struct {
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Revision is the cluster's revision of the main source (its
	// resolution), or, before one exists, the most common Ready revision.
	Revision   string             `json:"revision,omitempty"`
	Nodes      NodeCounts         `json:"nodes"`
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// Resolved is the cluster's one resolution of each source of the
	// ModelCache (the main one, each versions entry, each kernel cache
	// image): every node pulls exactly the pinned URI, never its own
	// resolution of a branch or tag.
	Resolved []ResolvedSource `json:"resolved,omitempty"`
	// Active is, per model artifact (the main one, each versions entry),
	// the resolution the nodes serve. While it differs from Resolved (a
	// rollout), nodes prefetch Resolved's revision and keep serving
	// Active's; the elected daemon flips Active when enough nodes hold
	// the new one (spec.rollout.minReadyPercent).
	Active []ResolvedSource `json:"active,omitempty"`
	// Rollout is the main artifact's rollout: target and active revision,
	// the nodes that hold the target.
	Rollout *RolloutStatus `json:"rollout,omitempty"`
	// Versions is, per model artifact (the main source first, then each
	// versions entry), what the nodes report of it: nodes by phase, the
	// revisions and folder checksums seen, the pods that use it and when
	// it was last used anywhere.
	Versions []VersionStatus `json:"versions,omitempty"`
	// Peers are, per artifact revision of this ModelCache, the nodes
	// that hold it or fetch it (or want or failed it), grouped by
	// phase; PeerAddresses says where each serves blobs. The elected
	// daemon publishes them from the nodes' statuses at most every
	// Config.PublishInterval, so that a daemon learns who holds what
	// from the ModelCaches it watches anyway, without watching every
	// ModelCacheNode (holders.go). Only nodes whose ModelCacheNode is
	// live and advertises a peer port are listed.
	Peers         []PeerSet     `json:"peers,omitempty"`
	PeerAddresses []PeerAddress `json:"peerAddresses,omitempty"`
}

// PeerSet is the nodes in one phase of one revision of an artifact, as
// their statuses report it: their current version, or (Next) the one
// they prefetch for a rollout. Nodes are sorted; Total counts them all
// when the list was cut to keep the status within MaxPeerStatusBytes.
type PeerSet struct {
	Artifact string   `json:"artifact"`
	Revision string   `json:"revision,omitempty"`
	Digest   string   `json:"digest,omitempty"`
	Phase    string   `json:"phase"`
	Next     bool     `json:"next,omitempty"`
	Nodes    []string `json:"nodes"`
	Total    int      `json:"total,omitempty"`
}

// PeerAddress is where a node listed in status.peers serves blobs.
type PeerAddress struct {
	Node    string `json:"node"`
	Address string `json:"address"`
}

// Bounds of status.versions, which must stay small (one object, written
// whole): at most MaxStatusPods pods and MaxStatusRevisions revisions are
// listed; the counts say how many there are.
const (
	MaxStatusPods      = 20
	MaxStatusRevisions = 10
)

// VersionStatus is one model artifact of a ModelCache across the nodes.
type VersionStatus struct {
	// Artifact is the node artifact: the ModelCache's name, or
	// <name>-<suffix> for a versions entry (Suffix).
	Artifact string `json:"artifact"`
	Suffix   string `json:"suffix,omitempty"`
	// Nodes counts the selected nodes by the artifact's phase.
	Nodes NodeCounts `json:"nodes"`
	// Revisions are the revisions the nodes serve (Ready), each with its
	// folder checksum and how many nodes serve it: more than one is drift
	// or a rollout. At most MaxStatusRevisions, most served first.
	Revisions []RevisionCount `json:"revisions,omitempty"`
	// Pods are the pods that use the artifact on any node, as
	// namespace/name, sorted; at most MaxStatusPods, PodCount is all.
	Pods     []string `json:"pods,omitempty"`
	PodCount int      `json:"podCount"`
	// LastUsed is the latest use on any node, to the hour (RFC 3339).
	LastUsed string `json:"lastUsed,omitempty"`
	// LastDownloaded is when the latest download of it finished on any
	// node (RFC 3339).
	LastDownloaded string `json:"lastDownloaded,omitempty"`
	// FromOrigin counts the nodes whose last download of it took more
	// than OriginShare of its bytes from the source rather than from
	// other nodes (a hub's small files without a digest always come from
	// the source); OriginBytes and PeerBytes add up those downloads.
	FromOrigin  int   `json:"fromOrigin"`
	OriginBytes int64 `json:"originBytes,omitempty"`
	PeerBytes   int64 `json:"peerBytes,omitempty"`
}

// OriginShare is the share of a download's bytes above which the node
// counts as having fetched it from the source (VersionStatus.FromOrigin).
const OriginShare = 0.01

// RevisionCount is one revision served by some nodes.
type RevisionCount struct {
	Revision string `json:"revision"`
	Digest   string `json:"digest,omitempty"`
	Nodes    int    `json:"nodes"`
}

// Rollout phases.
const (
	RolloutComplete    = "Complete"
	RolloutProgressing = "Progressing"
)

// RolloutStatus shows the main artifact's rollout.
type RolloutStatus struct {
	// Phase is Complete (the target is active) or Progressing (nodes
	// prefetch the target; the active revision serves).
	Phase string `json:"phase"`
	// Target is the revision the spec resolves to; Active the one the
	// nodes serve; Previous the one active before the last flip.
	Target   string `json:"target,omitempty"`
	Active   string `json:"active,omitempty"`
	Previous string `json:"previous,omitempty"`
	// NodesReady hold the target (current or prefetched); NodesEligible
	// are the selected nodes that are not Failed or Incompatible.
	NodesReady    int    `json:"nodesReady"`
	NodesEligible int    `json:"nodesEligible"`
	ReadyText     string `json:"readyText,omitempty"`
	// MinReadyPercent is the threshold of the flip in effect.
	MinReadyPercent int          `json:"minReadyPercent"`
	ActivatedAt     *metav1.Time `json:"activatedAt,omitempty"`
	// Message says what the rollout waits for, and which nodes could not
	// get the target (they keep serving the active revision).
	Message string `json:"message,omitempty"`
}

// ResolvedSource is one source as the elected daemon resolved it. It is
// resolved again only when the spec names another source for the
// artifact (updatePolicy OnChange).
type ResolvedSource struct {
	// Artifact is the node artifact it is for: the ModelCache's name,
	// <name>-<suffix> for a version, the kernel cache's name.
	Artifact string `json:"artifact"`
	// Source is the spec's source (or image) that was resolved.
	Source string `json:"source"`
	// Revision is the immutable revision: an hf commit, an OCI manifest
	// digest (hex), an NGC version, an S3 listing pin (s3-…), an HTTP
	// validator; empty where the source has none (the content is the
	// revision).
	Revision string `json:"revision,omitempty"`
	// URI is what every node pulls: the pinned form (hf://org/repo@<commit>,
	// oci://registry/repo@sha256:…, ngc://org/model:<version>), or the
	// source itself where the scheme has no pinned form (s3, http, file:
	// Digest then guarantees the bytes).
	URI string `json:"uri,omitempty"`
	// Digest is the folder checksum (manifest digest) that two nodes
	// reported for the revision, Ready, before any other (one node's
	// report alone never sets it); every other node must produce the same.
	Digest string `json:"digest,omitempty"`
	// OriginNodes are the nodes that fetch a model revision from the
	// source for the cluster, each its share of the blobs; the other
	// nodes take the blobs from them (fan-out between nodes). Recorded
	// once per resolution by the elected daemon (origins.go): the first
	// --origin-concurrency, at most MaxOriginNodes, of the selected nodes
	// with a live ModelCacheNode. Empty for kernel cache images, and while
	// no selected node is live.
	OriginNodes []string    `json:"originNodes,omitempty"`
	Generation  int64       `json:"generation,omitempty"`
	ResolvedAt  metav1.Time `json:"resolvedAt"`
	// Error is why the last resolution failed (retried by the elected
	// daemon; nodes wait meanwhile and keep what they serve).
	Error string `json:"error,omitempty"`
	// ActivatedAt (status.active only) is when the revision became
	// active, and Previous the revision it replaced (kept on the nodes
	// for spec.rollout.retainOld after ActivatedAt).
	ActivatedAt *metav1.Time `json:"activatedAt,omitempty"`
	Previous    string       `json:"previous,omitempty"`
}

// NodeCounts counts the selected nodes by phase.
type NodeCounts struct {
	Ready        int `json:"ready"`
	Downloading  int `json:"downloading"`
	Pending      int `json:"pending"`
	Failed       int `json:"failed"`
	Incompatible int `json:"incompatible"`
	Total        int `json:"total"`
	// ReadyText is "ready/total" for the printer column.
	ReadyText string `json:"readyText,omitempty"`
}

// ModelCacheNode is one node's report, named after the node.
type ModelCacheNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Status            ModelCacheNodeStatus `json:"status,omitempty"`
}

// ModelCacheNodeStatus is what the node has.
type ModelCacheNodeStatus struct {
	GPUs          []api.GPUDevice  `json:"gpus,omitempty"`
	GPUSource     string           `json:"gpuSource,omitempty"`
	CapacityBytes int64            `json:"capacityBytes"`
	UsedBytes     int64            `json:"usedBytes"`
	ReservedBytes int64            `json:"reservedBytes"`
	FreeBytes     int64            `json:"freeBytes"`
	Artifacts     []ArtifactStatus `json:"artifacts,omitempty"`
	// Summary counts the artifacts by phase for the printer column:
	// "2 Ready, 1 Downloading" ("" when there are none).
	Summary string `json:"summary,omitempty"`
	// Heartbeat is when the daemon last wrote: at each change (at most
	// every --status-interval), and once an hour when nothing changes
	// (Config.Heartbeat).
	Heartbeat metav1.Time `json:"heartbeat"`
	// PeerAddress is where this node's daemon serves its verified blobs to
	// the other daemons (http://<pod IP>:<port>); empty when it does not.
	PeerAddress string `json:"peerAddress,omitempty"`
	// Problems are what keeps this node's daemon from doing its part in
	// the cluster (e.g. the Lease namespace of the aggregator is missing),
	// each with its remedy.
	Problems []string `json:"problems,omitempty"`
}

// ArtifactStatus is one artifact on the node.
type ArtifactStatus struct {
	Name       string `json:"name"`
	ModelCache string `json:"modelCache,omitempty"`
	Kind       string `json:"kind,omitempty"`
	Phase      string `json:"phase"`
	Revision   string `json:"revision,omitempty"`
	// Source is the (redacted) source the current revision came from.
	Source string `json:"source,omitempty"`
	Digest string `json:"digest,omitempty"`
	Bytes  int64  `json:"bytes"`
	// LastUsed is when the current revision was last used (read, leased,
	// pulled), to the hour (RFC 3339): a model in use writes no status
	// for it more than once an hour.
	LastUsed string `json:"lastUsed,omitempty"`
	// InUseBy are what holds it: "pod ns/name", "lease <holder>",
	// "process pid 12 (python3)"; Pods the pods among them, as
	// namespace/name.
	InUseBy []string `json:"inUseBy,omitempty"`
	Pods    []string `json:"pods,omitempty"`
	// DownloadStarted and DownloadCompleted are when this node's last
	// download of the current revision started and finished (RFC 3339,
	// seconds); DownloadStarted alone while one is in flight.
	DownloadStarted   string  `json:"downloadStarted,omitempty"`
	DownloadCompleted string  `json:"downloadCompleted,omitempty"`
	DownloadSeconds   float64 `json:"downloadSeconds,omitempty"`
	BytesPerSecond    float64 `json:"bytesPerSecond,omitempty"`
	// OriginBytes and PeerBytes are what that download took from the
	// source and from other nodes' daemons (fan-out).
	OriginBytes int64  `json:"originBytes,omitempty"`
	PeerBytes   int64  `json:"peerBytes,omitempty"`
	Message     string `json:"message,omitempty"`
	Reason      string `json:"reason,omitempty"`
	// Next is the revision this node prefetches for a rollout while
	// Revision serves.
	Next *NextStatus `json:"next,omitempty"`
}

// NextStatus is a rollout's revision on one node before it is current.
type NextStatus struct {
	Revision string `json:"revision,omitempty"`
	// Source is the (redacted) pinned URI it is pulled from.
	Source  string `json:"source,omitempty"`
	Phase   string `json:"phase"`
	Digest  string `json:"digest,omitempty"`
	Message string `json:"message,omitempty"`
	Reason  string `json:"reason,omitempty"`
}
