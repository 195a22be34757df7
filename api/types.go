// Package api holds the wire types of modelcached's unix-socket API and a
// small Go client for it. Both the daemon and modelctl import it, so the
// format is defined once. Routes are versioned under /v1/. Errors cross
// the socket as an HTTP status and {"code": …, "message": …}; the client
// turns them back into *Error values that match the sentinels with
// errors.Is.
//
// Where to find what:
//
//	types.go    the request and response types of every route
//	client.go   Client: the Go client over the unix socket
//	errors.go   stable error codes, their sentinels and HTTP statuses, Error
//	jsonout.go  WriteJSON and WriteJSONArray: JSON streamed through a bounded buffer
package api

import (
	"encoding/json"
	"strconv"
	"time"
)

// DefaultSocket is where the daemon listens unless told otherwise.
const DefaultSocket = "/run/modelcached/modelcached.sock"

// Phase of an artifact on this node.
type Phase string

const (
	PhasePending     Phase = "Pending"
	PhaseDownloading Phase = "Downloading"
	PhaseReady       Phase = "Ready"
	PhaseFailed      Phase = "Failed"
	// PhaseIncompatible: a kernel cache built for GPUs this node does not
	// have. Not a failure; nothing is downloaded and nothing is retried
	// until the desire or the node's GPUs change.
	PhaseIncompatible Phase = "Incompatible"
	// PhaseEvicted: an ad-hoc entry evicted to make room (Artifact.Evicted
	// says for what and when); nothing desires it any more. Pull it again
	// to bring it back.
	PhaseEvicted Phase = "Evicted"
)

// Entries: a declared artifact (a ModelCache, a models.d file, pull --pin
// or pull --keep) is kept until its declaration goes; an ad-hoc one (a
// plain modelctl pull) is a cache entry that admission may evict, least
// recently used first, to make room for another pull.
const (
	EntryDeclared = "declared"
	EntryAdHoc    = "ad-hoc"
)

// EvictionNote says why an ad-hoc entry went.
type EvictionNote struct {
	At     time.Time `json:"at"`
	For    string    `json:"for,omitempty"` // the pull it made room for
	Reason string    `json:"reason"`        // admission, or space (disk pressure)
}

// Reasons: why an artifact is Failed or Incompatible (Artifact.Reason),
// the same strings in ModelCacheNodeStatus, Events and conditions. Every
// package compares against these names, never a string literal.
const (
	// ReasonPullFailed: a failure worth retrying (a network error, a
	// server error, a stream cut short); retried with backoff.
	ReasonPullFailed = "PullFailed"
	// Failures no retry can fix: not retried until the desire changes or
	// an explicit pull asks again.
	ReasonSourceNotFound = "SourceNotFound" // the repo, revision, object, URL or host does not exist
	ReasonAccessDenied   = "AccessDenied"   // the source refuses these credentials (or none)
	ReasonInvalidSource  = "InvalidSource"  // the URI cannot name a source
	// ReasonDigestMismatch: the bytes do not hash to the digest the user
	// (#sha256=, --digest) or the source's listing gave; the message names
	// both digests. Another download of the same bytes cannot match.
	ReasonDigestMismatch = "DigestMismatch"
	// ReasonSourceInconsistent: the source contradicts itself (a file
	// listing shorter than the count it announces); asking again the same
	// way gets the same answer.
	ReasonSourceInconsistent = "SourceInconsistent"
	// ReasonSourceChanged: the source's files no longer hash to the folder
	// checksum the cluster recorded for this revision (the first node's):
	// the node keeps what it served and does not retry until the desire
	// changes.
	ReasonSourceChanged = "SourceChanged"
	// ReasonInsufficientCapacity: admission refused the pull (it does not
	// fit in free space plus what eviction may free); retried.
	ReasonInsufficientCapacity = "InsufficientCapacity"
	// ReasonIncompatible: a kernel cache built for GPUs this node does not
	// have (PhaseIncompatible).
	ReasonIncompatible = "Incompatible"
	// ReasonSignatureFailed: a kernel cache whose signature the policy
	// requires and that does not verify; retried.
	ReasonSignatureFailed = "SignatureVerificationFailed"
	// ReasonInvalidSpec: a desire from the cluster that the daemon refused
	// (a ModelCache that passed admission but not the daemon's validation);
	// the other desires still apply.
	ReasonInvalidSpec = "InvalidSpec"
)

// Artifact kinds. cachestore names the same values for the index (it
// imports no project package); TestArtifactKindsAgree holds them equal.
const (
	KindModel       = "model"
	KindKernelCache = "kernelcache"
)

// Desire is one wanted artifact: from `modelctl pull` (persisted in the
// index), from a YAML file in the models dir, or from a ModelCache object
// selected for this node (k8ssync; persisted too, without credentials).
type Desire struct {
	Name   string `json:"name"`
	URI    string `json:"uri"`
	Digest string `json:"digest,omitempty"` // expected manifest digest (folder checksum)
	// ClusterDigest says Digest is the folder checksum the cluster
	// recorded (the first node to commit the revision), not the user's:
	// a mismatch means the source changed since the cluster resolved it.
	// Set only by k8ssync; it leaves the desire's fingerprint, so a node
	// that already holds the revision does not pull it again when the
	// cluster records the checksum.
	ClusterDigest bool `json:"clusterDigest,omitempty"`
	// Ref is the branch or tag the cluster resolved a pinned hub URI's
	// commit from (hf://org/repo@<commit> for main): the HF view's
	// refs/<ref> then names the commit, as a pull of the branch would.
	// Set only by k8ssync.
	Ref string `json:"ref,omitempty"`
	// Revision is the immutable revision the cluster resolved the source
	// to (status.resolved): a pull whose own resolution differs fails
	// SourceChanged. Set only by k8ssync.
	Revision string `json:"revision,omitempty"`
	// Stage fetches and verifies the desire's revision without making it
	// current (a coordinated rollout's prefetch: the current revision
	// keeps serving); once the desire comes without Stage, the staged
	// version becomes current at once, without a pull. Set only by
	// k8ssync.
	Stage bool `json:"stage,omitempty"`
	// Retain names revisions to keep besides the current one (a
	// rollout's previous revision for spec.rollout.retainOld): eviction
	// passes them by. Set only by k8ssync.
	Retain []string `json:"retain,omitempty"`
	// Policy is the ModelCache's update policy as shown ("OnChange",
	// "Poll 30m"); for views only. Set only by k8ssync.
	Policy string `json:"policy,omitempty"`
	Pin    bool   `json:"pin,omitempty"`
	// Keep: a socket desire declared (pull --keep) rather than ad-hoc.
	Keep    bool     `json:"keep,omitempty"`
	State   string   `json:"state,omitempty"` // present (default) | absent
	Include []string `json:"include,omitempty"`
	Exclude []string `json:"exclude,omitempty"`
	// Origin says where the desire comes from: "api", or "file:<path>".
	Origin string `json:"origin,omitempty"`
	// Kind is model (default) or kernelcache (an oci:// kernel cache image).
	Kind string `json:"kind,omitempty"`
	// Signature is a kernel cache's signature policy.
	Signature *SignaturePolicy `json:"signature,omitempty"`
	// KernelCaches lists a model's kernel cache images, typically one per
	// GPU architecture; each node takes the ones its GPUs can run.
	KernelCaches []KernelCacheRef `json:"kernelCaches,omitempty"`
	// Serves names the model a kernel cache desire came from. Set only
	// by the daemon when it expands a model's KernelCaches: never from
	// the socket (PullRequest has no such field).
	Serves string `json:"serves,omitempty"`
	// Requester is who asked for the desire over the socket: a file://
	// source is read with its uid and groups, so a pull reads only what
	// the requester could read. Nil for desires from the node's own
	// configuration (models.d, the cluster), read as the daemon.
	Requester *Requester `json:"requester,omitempty"`
	// CredentialsFile (models.d only) is a file on the node holding the
	// source's credentials as KEY=VALUE lines, the keys of a ModelCache's
	// Secret: HF_TOKEN, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
	// AWS_SESSION_TOKEN, HTTP_AUTHORIZATION, NGC_API_KEY. Read at every pull, kept in
	// memory only; so no credential has to be written into a URI.
	CredentialsFile string `json:"credentialsFile,omitempty"`
	// AllowedNamespaces makes the artifact private: it was fetched with
	// credentials, and only pods of these namespaces may mount it (CSI);
	// its trees on the node are readable by root only. Empty: public.
	// Set only by k8ssync (a ModelCache's or a ModelCacheCredentials'
	// allow-list).
	AllowedNamespaces []string `json:"allowedNamespaces,omitempty"`
	// LocalGroup (models.d) is a local group whose members may read the
	// artifact's trees on the node (mode 0750, that group): a node's own
	// consumers. It makes the artifact private too (no pod of a namespace
	// AllowedNamespaces does not list mounts it).
	LocalGroup string `json:"localGroup,omitempty"`
}

// Requester is the identity of a socket peer (SO_PEERCRED and the
// supplementary groups of its process).
type Requester struct {
	UID    uint32   `json:"uid"`
	GID    uint32   `json:"gid"`
	Groups []uint32 `json:"groups,omitempty"`
}

// KernelCacheName is the artifact name of the desire's i-th kernel cache:
// the name it was given, else <model>.kc<i>.
func (d Desire) KernelCacheName(i int) string {
	if n := d.KernelCaches[i].Name; n != "" {
		return n
	}
	return d.Name + ".kc" + strconv.Itoa(i)
}

// KernelCacheRef is one kernel cache image of a model desire.
type KernelCacheRef struct {
	// Name defaults to <model>.kc<index>.
	Name      string           `json:"name,omitempty"`
	URI       string           `json:"uri"`
	Signature *SignaturePolicy `json:"signature,omitempty"`
}

// SignaturePolicy says what must have signed a kernel cache image.
type SignaturePolicy struct {
	// Policy is required (the default) or off.
	Policy string `json:"policy,omitempty"`
	// Keys: PEM public keys (cosign.pub); any one of them may sign. Over
	// the socket they are PEM text (modelctl pull --key FILE reads the
	// file); only a models.d file or a ModelCache may name a path on the
	// node.
	Keys []string `json:"keys,omitempty"`
	// Keyless: the certificate's subject and OIDC issuer (exact or
	// regexp), checked against TrustedRoot: a sigstore trusted_root.json
	// or a PEM CA bundle, as text over the socket (modelctl reads
	// --trusted-root FILE), or a path on the node in a models.d file.
	Identity       string `json:"identity,omitempty"`
	IdentityRegexp string `json:"identityRegexp,omitempty"`
	Issuer         string `json:"issuer,omitempty"`
	IssuerRegexp   string `json:"issuerRegexp,omitempty"`
	TrustedRoot    string `json:"trustedRoot,omitempty"`
}

// Signature policies.
const (
	PolicyRequired = "required"
	PolicyOff      = "off"
)

// KernelCacheInfo is what the daemon checked of a kernel cache version.
type KernelCacheInfo struct {
	Serves        string          `json:"serves,omitempty"`
	Signature     *SignatureCheck `json:"signature,omitempty"`
	Compatibility *Compatibility  `json:"compatibility,omitempty"`
	// CacheBytes is what was extracted under the cache directories.
	CacheBytes     int64   `json:"cacheBytes,omitempty"`
	Entries        int     `json:"entries,omitempty"`
	ExtractSeconds float64 `json:"extractSeconds,omitempty"`
	// Dirs are the cache directories found (io.triton.cache, …).
	Dirs []string `json:"dirs,omitempty"`
}

// SignatureCheck is the result of a signature verification.
type SignatureCheck struct {
	Policy   string    `json:"policy"`
	Verified bool      `json:"verified"`
	Digest   string    `json:"digest,omitempty"`
	Format   string    `json:"format,omitempty"`
	Signer   string    `json:"signer,omitempty"`
	At       time.Time `json:"at"`
}

// Desire states.
const (
	StatePresent = "present"
	StateAbsent  = "absent"
)

// Progress of a pull in flight.
type Progress struct {
	BytesDone      int64     `json:"bytesDone"`
	BytesTotal     int64     `json:"bytesTotal"` // -1 when a size is unknown
	BytesSkipped   int64     `json:"bytesSkipped"`
	FilesDone      int       `json:"filesDone"`
	FilesTotal     int       `json:"filesTotal"`
	BytesPerSecond float64   `json:"bytesPerSecond"`
	Started        time.Time `json:"started"`
}

// File is one file of an artifact version.
type File struct {
	Path   string `json:"path"`
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
	// Streamed: the source named no digest, so Digest is that of the bytes
	// as they streamed, checked against the size only (an NGC file listed
	// without sha256_base64, an http(s) URL without #sha256=).
	Streamed bool `json:"streamed,omitempty"`
}

// Version is one revision of an artifact in the store.
type Version struct {
	Revision       string    `json:"revision"`
	State          string    `json:"state"`
	Message        string    `json:"message,omitempty"`
	ManifestDigest string    `json:"manifestDigest"`
	Bytes          int64     `json:"bytes"`
	Pinned         bool      `json:"pinned"`
	Created        time.Time `json:"created"`
	LastUsed       time.Time `json:"lastUsed"`
	Source         string    `json:"source"`
	Files          []File    `json:"files,omitempty"` // only from Get
}

// Artifact is what the daemon knows of one name: its desire, its phase
// and the versions in the store.
type Artifact struct {
	Name     string `json:"name"`
	Kind     string `json:"kind"`
	URI      string `json:"uri,omitempty"`
	Phase    Phase  `json:"phase"`
	Message  string `json:"message,omitempty"`
	Revision string `json:"revision,omitempty"` // the current one
	// Source is the (redacted) source the current revision came from,
	// which URI (the desire's) need not be.
	Source         string     `json:"source,omitempty"`
	ManifestDigest string     `json:"manifestDigest,omitempty"`
	Bytes          int64      `json:"bytes"`
	Pinned         bool       `json:"pinned"`
	Path           string     `json:"path,omitempty"` // <root>/models/<name>/current when Ready
	Attempts       int        `json:"attempts,omitempty"`
	NextRetry      *time.Time `json:"nextRetry,omitempty"`
	Progress       *Progress  `json:"progress,omitempty"`
	Desire         *Desire    `json:"desire,omitempty"`
	Versions       []Version  `json:"versions,omitempty"`
	// Reason is a machine-readable cause of a Failed phase, e.g.
	// InsufficientCapacity or ReasonInvalidSpec.
	Reason string `json:"reason,omitempty"`
	// InUse lists what holds a version of the artifact: leases and
	// processes that have its files open or mapped. In-use versions are
	// never evicted.
	InUse []Holder `json:"inUse,omitempty"`
	// Metadata is what the model's files say (config.json, safetensors
	// headers); only from Get.
	Metadata *Metadata `json:"metadata,omitempty"`
	// LastUsed is when the current version was last used (read by a
	// process, leased, pulled).
	LastUsed *time.Time `json:"lastUsed,omitempty"`
	// Created is when the current version was committed (list's AGE).
	Created *time.Time `json:"created,omitempty"`
	// LastPull is how the last successful pull of this daemon went.
	LastPull *PullStats `json:"lastPull,omitempty"`
	// KernelCache is what was checked of a kernel cache: signature,
	// compatibility per GPU, extraction.
	KernelCache *KernelCacheInfo `json:"kernelCache,omitempty"`
	// Entry is EntryDeclared or EntryAdHoc for a desired artifact, "" for
	// one nothing desires.
	Entry string `json:"entry,omitempty"`
	// Evicted says when and for what an ad-hoc entry was evicted
	// (PhaseEvicted).
	Evicted *EvictionNote `json:"evicted,omitempty"`
	// Next is the revision prefetched for a coordinated rollout (a
	// desire with Stage) while Revision keeps serving: Ready when it is
	// held and waits for the cluster's flip, Failed with the reason when
	// it could not be had (Revision still serves).
	Next *NextRevision `json:"next,omitempty"`
}

// NextRevision is a rollout's revision on this node before it is current.
type NextRevision struct {
	URI            string    `json:"uri,omitempty"`
	Revision       string    `json:"revision,omitempty"`
	ManifestDigest string    `json:"manifestDigest,omitempty"`
	Phase          Phase     `json:"phase"`
	Message        string    `json:"message,omitempty"`
	Reason         string    `json:"reason,omitempty"`
	Progress       *Progress `json:"progress,omitempty"`
}

// ArtifactRow is the part of an Artifact that modelctl list's table shows;
// GET /v1/artifacts?fields=row answers with these fields only (the others
// cost the daemon encoding and the client decoding, for tens of thousands
// of artifacts).
type ArtifactRow struct {
	Name     string     `json:"name"`
	Phase    Phase      `json:"phase"`
	URI      string     `json:"uri,omitempty"`
	Message  string     `json:"message,omitempty"`
	Revision string     `json:"revision,omitempty"`
	Bytes    int64      `json:"bytes"`
	Pinned   bool       `json:"pinned"`
	Progress *Progress  `json:"progress,omitempty"`
	InUse    []Holder   `json:"inUse,omitempty"`
	Created  *time.Time `json:"created,omitempty"`
	Entry    string     `json:"entry,omitempty"`
	// Next: the detail column shows a prefetched rollout revision.
	Next *NextRevision `json:"next,omitempty"`
}

// Row is a's ArtifactRow.
func (a *Artifact) Row() ArtifactRow {
	return ArtifactRow{Name: a.Name, Phase: a.Phase, URI: a.URI, Message: a.Message, Revision: a.Revision, Bytes: a.Bytes,
		Pinned: a.Pinned, Progress: a.Progress, InUse: a.InUse, Created: a.Created, Entry: a.Entry, Next: a.Next}
}

// PullStats describes a finished pull.
type PullStats struct {
	Seconds        float64   `json:"seconds"`
	BytesFetched   int64     `json:"bytesFetched"`
	BytesPerSecond float64   `json:"bytesPerSecond"`
	At             time.Time `json:"at"`
}

// Metadata of a model version.
type Metadata struct {
	Architectures         []string         `json:"architectures,omitempty"`
	ModelType             string           `json:"modelType,omitempty"`
	TorchDtype            string           `json:"torchDtype,omitempty"`
	MaxPositionEmbeddings int64            `json:"maxPositionEmbeddings,omitempty"`
	QuantizationConfig    json.RawMessage  `json:"quantizationConfig,omitempty"`
	Parameters            int64            `json:"parameters,omitempty"`
	ParametersByDtype     map[string]int64 `json:"parametersByDtype,omitempty"`
	TensorBytes           int64            `json:"tensorBytes,omitempty"`
	SafetensorsFiles      int              `json:"safetensorsFiles,omitempty"`
	Problems              []string         `json:"problems,omitempty"`
}

// Holder is one reason an artifact version is in use.
type Holder struct {
	Kind     string     `json:"kind"` // lease, process or pod
	ID       string     `json:"id"`   // the lease holder, "pid 123 (python3)", or "ns/name" of a pod
	Revision string     `json:"revision"`
	Expires  *time.Time `json:"expires,omitempty"`
}

// String is how every view writes a holder: "pod ns/name", "lease job-7",
// "process pid 123 (python3)" (modelctl list and inspect, a
// ModelCacheNode's inUseBy, log lines).
func (h Holder) String() string { return h.Kind + " " + h.ID }

// LeaseRequest takes or renews a lease on an artifact's current version.
type LeaseRequest struct {
	Holder string `json:"holder"`
	TTL    string `json:"ttl"` // a duration, e.g. "2m"
}

// Lease is a granted lease.
type Lease struct {
	Name     string    `json:"name"`
	Revision string    `json:"revision"`
	Holder   string    `json:"holder"`
	Expires  time.Time `json:"expires"`
}

// Event is one line of a streamed response (pull with wait, wait).
type Event struct {
	Artifact *Artifact `json:"artifact,omitempty"`
	Error    *Error    `json:"error,omitempty"`
	Done     bool      `json:"done,omitempty"`
}

// MaxURIBytes caps a source URI (a pull's, a kernel cache's, a models.d
// file's, a ModelCache's): a longer one is refused, naming the cap. It
// bounds what a desire copies into messages, the index and the cluster's
// status.
const MaxURIBytes = 8 << 10

// PullRequest asks for an artifact over the socket; the daemon turns it
// into a persisted desire. It holds only what a socket client may set:
// where a desire comes from (Origin), which model a kernel cache serves
// (Serves) and who asked (Requester) are the daemon's to fill, and no
// field names a path on the node that the daemon would open (keys and
// trusted roots travel as their content). Unknown fields are refused.
type PullRequest struct {
	Name   string `json:"name"`
	URI    string `json:"uri"`
	Digest string `json:"digest,omitempty"`
	Pin    bool   `json:"pin,omitempty"`
	// Keep declares the entry (kept until evicted by hand) without
	// pinning it: disk pressure may still take it, admission may not.
	Keep    bool     `json:"keep,omitempty"`
	State   string   `json:"state,omitempty"`
	Include []string `json:"include,omitempty"`
	Exclude []string `json:"exclude,omitempty"`
	Kind    string   `json:"kind,omitempty"`
	// Signature: a kernel cache's policy; it may tighten the node's
	// policy, never loosen it.
	Signature    *SignaturePolicy `json:"signature,omitempty"`
	KernelCaches []KernelCacheRef `json:"kernelCaches,omitempty"`
	// Replace allows a pull that names another source than the name's
	// desire has; without it such a pull is refused (CodeConflict).
	Replace bool `json:"replace,omitempty"`
}

// Desire is the desire the request asks for, before the daemon fills in
// its origin and requester.
func (r PullRequest) Desire() Desire {
	return Desire{Name: r.Name, URI: r.URI, Digest: r.Digest, Pin: r.Pin, Keep: r.Keep, State: r.State, Include: r.Include,
		Exclude: r.Exclude, Kind: r.Kind, Signature: r.Signature, KernelCaches: r.KernelCaches}
}

// EvictResult lists what an evict removed.
type EvictResult struct {
	Name      string   `json:"name"`
	Revisions []string `json:"revisions"`
	GC        GCResult `json:"gc"`
}

// GCResult is what a garbage collection removed.
type GCResult struct {
	BlobsRemoved int      `json:"blobsRemoved"`
	BytesFreed   int64    `json:"bytesFreed"`
	BlobsKept    int      `json:"blobsKept"`
	Removed      []string `json:"removed,omitempty"` // digests removed, or with a dry run that would be
	DryRun       bool     `json:"dryRun,omitempty"`
	// IngestsRemoved and IngestBytesFreed count partial downloads that no
	// pull will resume (their artifact is no longer desired).
	IngestsRemoved   int   `json:"ingestsRemoved,omitempty"`
	IngestBytesFreed int64 `json:"ingestBytesFreed,omitempty"`
}

// VerifyRequest names the artifacts to verify; empty means every blob.
type VerifyRequest struct {
	Names []string `json:"names,omitempty"`
	// Fsck checks that index, blobs and trees agree instead of rehashing.
	Fsck bool `json:"fsck,omitempty"`
}

// VerifyResult is what a verification found and did.
type VerifyResult struct {
	BlobsChecked int      `json:"blobsChecked"`
	BytesChecked int64    `json:"bytesChecked"`
	Corrupt      []string `json:"corrupt,omitempty"`
	Missing      []string `json:"missing,omitempty"`
	Refetching   []string `json:"refetching,omitempty"` // name@rev queued for re-fetch
	Quarantined  []string `json:"quarantined,omitempty"`
	// Problems are what an fsck found (index, blobs and trees disagree).
	Problems []string `json:"problems,omitempty"`
	Fsck     bool     `json:"fsck,omitempty"`
}

// ArtifactUsage is one artifact's share of the store.
type ArtifactUsage struct {
	Name        string `json:"name"`
	Bytes       int64  `json:"bytes"`
	UniqueBytes int64  `json:"uniqueBytes"`
	SharedBytes int64  `json:"sharedBytes"`
	// Serves: a kernel cache's model. KernelCacheBytes: a model's kernel
	// caches, which it keeps on disk besides its own Bytes.
	Serves           string `json:"serves,omitempty"`
	KernelCacheBytes int64  `json:"kernelCacheBytes,omitempty"`
}

// Usage is the disk use of the store.
type Usage struct {
	Root            string          `json:"root"`
	StoreBytes      int64           `json:"storeBytes"`
	Blobs           int             `json:"blobs"`
	FSCapacityBytes int64           `json:"fsCapacityBytes"`
	FSFreeBytes     int64           `json:"fsFreeBytes"`
	Artifacts       []ArtifactUsage `json:"artifacts"`
}

// Status is the daemon's state at a glance.
type Status struct {
	Version         string        `json:"version"`
	Root            string        `json:"root"`
	Socket          string        `json:"socket"`
	ModelsDir       string        `json:"modelsDir"`
	Started         time.Time     `json:"started"`
	Phases          map[Phase]int `json:"phases"`
	PullsInFlight   int           `json:"pullsInFlight"`
	StoreBytes      int64         `json:"storeBytes"`
	FSFreeBytes     int64         `json:"fsFreeBytes"`
	FSCapacityBytes int64         `json:"fsCapacityBytes"`
	ModelsDirError  []string      `json:"modelsDirErrors,omitempty"`
	ReservedBytes   int64         `json:"reservedBytes"`
	DiskPressure    bool          `json:"diskPressure"`
	QuotaBytes      int64         `json:"quotaBytes,omitempty"`
	HighWatermark   int           `json:"highWatermarkPercent,omitempty"`
	LowWatermark    int           `json:"lowWatermarkPercent,omitempty"`
	LastEviction    *Eviction     `json:"lastEviction,omitempty"`
	DirectIO        bool          `json:"directIO"`
}

// Eviction summarises the last eviction pass that removed something or
// could not free what the policy wanted.
type Eviction struct {
	At         time.Time `json:"at"`
	Evicted    []string  `json:"evicted,omitempty"` // name@rev (reason)
	Failed     []string  `json:"failed,omitempty"`
	BytesFreed int64     `json:"bytesFreed"`
	ShortBytes int64     `json:"shortBytes,omitempty"` // wanted but not freeable (pinned, in use, too young)
}

// GPUInventory is what this node's GPUs are.
type GPUInventory struct {
	// Source is nvml, simulated (from --gpu-inventory) or none.
	Source    string `json:"source"`
	Simulated bool   `json:"simulated,omitempty"`
	// Reason says why the inventory is empty or partial (no driver, NVML
	// error on one device).
	Reason            string      `json:"reason,omitempty"`
	DriverVersion     string      `json:"driverVersion,omitempty"`
	CUDADriverVersion string      `json:"cudaDriverVersion,omitempty"` // e.g. "12.4"
	Devices           []GPUDevice `json:"devices"`
	DetectedAt        time.Time   `json:"detectedAt"`
}

// GPUDevice is one GPU.
type GPUDevice struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	UUID  string `json:"uuid"`
	// ComputeCapability is major.minor, e.g. "9.0" (sm_90).
	ComputeCapability string `json:"computeCapability"`
	// Architecture is the family: Volta, Turing, Ampere, Ada, Hopper,
	// Blackwell (or an AMD gfx name in a simulated inventory).
	Architecture string `json:"architecture"`
	MemoryBytes  uint64 `json:"memoryBytes"`
	// Backend is what kernels target: cuda (every NVML device) or hip.
	Backend string `json:"backend"`
	// Arch is the kernel target as Triton names it: "90" for sm_90,
	// "gfx90a" for an AMD device.
	Arch     string `json:"arch"`
	WarpSize int    `json:"warpSize"`
}

// GPUCompat is the verdict of a kernel cache for one GPU.
type GPUCompat struct {
	Index      int    `json:"index"`
	UUID       string `json:"uuid,omitempty"`
	Name       string `json:"name,omitempty"`
	Compatible bool   `json:"compatible"`
	// Entries is how many of the cache's entries this GPU can run.
	Entries int    `json:"entries"`
	Reason  string `json:"reason,omitempty"`
}

// Compatibility is the verdict of a kernel cache against the inventory.
type Compatibility struct {
	// Compatible: at least one GPU runs at least one entry of the cache.
	Compatible bool        `json:"compatible"`
	Simulated  bool        `json:"simulated,omitempty"`
	Targets    int         `json:"targets"`
	Devices    []GPUCompat `json:"devices"`
	Reason     string      `json:"reason,omitempty"`
}
