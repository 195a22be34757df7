// Package api holds the wire types of modelcached's unix-socket API and a
// small Go client for it. Both the daemon and modelctl import it, so the
// format is defined once. Routes are versioned under /v1/. Errors cross
// the socket as an HTTP status and {"code": …, "message": …}; the client
// turns them back into *Error values that match the sentinels with
// errors.Is.
//
// Where to find what:
//
//	types.go    phases, reasons and kinds; Artifact and its versions, files,
//	            holders, leases and events (what list, inspect and wait show)
//	desire.go   Desire, what is wanted of an artifact, and PullRequest, what a
//	            socket client may set of one; kernel cache refs and signature policy
//	store.go    what evict, gc, verify, du and status answer
//	gpu.go      the GPU inventory and what was checked of a kernel cache
//	            (signature, compatibility per GPU)
//	client.go   Client: the Go client over the unix socket
//	capture.go  the Client's capture routes: where a volume's compiled kernels are,
//	            the layers kept for capture, a capture done
//	follow.go   WaitFollow, PullFollow, RetryFollow: a wait that rides out a
//	            daemon restart until its timeout (Outage says what happened)
//	errors.go   stable error codes, their sentinels and HTTP statuses, Error
//	jsonout.go  WriteJSON and WriteJSONArray: JSON streamed through a bounded buffer
package api

import (
	"encoding/json"
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
	// Peers: the peer daemons that sent bytes of the file when this
	// version was pulled (fan-out); none, the origin sent them all.
	Peers []string `json:"peers,omitempty"`
	// Transport is how the source sent the file when this version was
	// pulled, where the source says: TransportXet (an hf:// file rebuilt
	// from the Hub's Xet store, chunks the node held taken from its own
	// blobs) or TransportResolve (an hf:// file read whole through the
	// resolve URL). Empty: the source does not say, or the store held the
	// file already.
	Transport string `json:"transport,omitempty"`
}

// How an hf:// file was fetched (File.Transport).
const (
	TransportXet     = "xet"
	TransportResolve = "resolve"
)

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
	// Resident is how much of the current revision's files is in the
	// page cache (mincore); only from Get, Ready artifacts.
	Resident *Residency `json:"resident,omitempty"`
}

// Residency is how much of a tree is in the page cache.
type Residency struct {
	Bytes int64 `json:"bytes"` // resident
	Total int64 `json:"total"` // of the tree's files
}

// WarmResult is one warm of a revision: reading it into the page cache
// ahead of the process about to load it (modelctl warm).
type WarmResult struct {
	Name     string `json:"name"`
	Revision string `json:"revision"`
	// Joined: a warm of this revision ran already; the request joined it.
	Joined bool `json:"joined,omitempty"`
	// Reason is why it ended (WarmDone, WarmBudget, WarmOvertaken,
	// WarmCancelled, WarmFailed); empty while it runs.
	Reason string `json:"reason,omitempty"`
	// Message says the same for people.
	Message       string  `json:"message,omitempty"`
	WarmedBytes   int64   `json:"warmedBytes"`   // read into the page cache
	ResidentBytes int64   `json:"residentBytes"` // found resident already
	TotalBytes    int64   `json:"totalBytes"`    // of the revision's files (0 until planned)
	BudgetBytes   int64   `json:"budgetBytes"`   // the most it may read (0 until planned)
	Seconds       float64 `json:"seconds"`
}

// Why a warm ended (WarmResult.Reason).
const (
	WarmDone      = "done"      // every byte is resident
	WarmBudget    = "budget"    // it read its memory budget's worth
	WarmOvertaken = "overtaken" // the consumer's own reads got ahead of it
	WarmCancelled = "cancelled" // every hold that asked for it ended (unpublished, lease ended, evicted)
	WarmFailed    = "failed"    // the tree could not be read (Message says why)
)

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
	// BytesFromPeers is how many of BytesFetched other daemons of the
	// cluster sent (fan-out between nodes); the rest came from the origin.
	BytesFromPeers int64 `json:"bytesFromPeers,omitempty"`
	// FilesFromPeers names the files whose bytes came (wholly or partly)
	// from peers, each with the peers' base URLs; at most 1024 files.
	FilesFromPeers map[string][]string `json:"filesFromPeers,omitempty"`
	// Unchanged says the source was as the Ready version holds it (the
	// same files, by digest or by the validator the source gave, such as
	// a file:// file's inode, size and times): nothing was read or
	// committed; the version stays as it was.
	Unchanged bool `json:"unchanged,omitempty"`
	// BytesReused is what the pull did not fetch because the store held
	// it already (a blob of the same digest, a file:// file unchanged).
	BytesReused int64 `json:"bytesReused,omitempty"`
	// Evicted are the versions evicted to make room for this pull.
	Evicted []EvictedVersion `json:"evicted,omitempty"`
}

// EvictedVersion is one version an eviction took.
type EvictedVersion struct {
	Name     string `json:"name"`
	Revision string `json:"revision"`
	Bytes    int64  `json:"bytes"`
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
	// Notes say what a wait still waits for (a model's kernel caches on
	// their way) and, at its end, what will not come: a GPU of this node
	// that no kernel cache of the model runs on, a kernel cache that failed.
	Notes []string `json:"notes,omitempty"`
}
