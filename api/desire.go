package api

import "strconv"

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
	// OriginNodes are the nodes the cluster chose to fetch Revision from
	// the source (status.resolved[].originNodes); with fan-out between
	// nodes the others take its blobs from them. Set only by k8ssync.
	OriginNodes []string `json:"originNodes,omitempty"`
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
	// CaptureKernelCaches lets the node's admin capture what pods compiled
	// into writable kernel cache volumes of this model (modelctl
	// kernelcache capture). The node's or the cluster's configuration sets
	// it (models.d, a ModelCache); a socket pull cannot.
	CaptureKernelCaches bool `json:"captureKernelCaches,omitempty"`
	// Xet (hf:// sources only) false makes the hub fetcher read every
	// file whole through the resolve URL, never rebuilt from the Hub's
	// Xet store; nil or true: Xet where the Hub offers it and the daemon's
	// --xet allows it. How the bytes come, not which: it leaves the
	// desire's fingerprint, so a change pulls nothing again. The node's
	// or the cluster's configuration sets it (models.d, a ModelCache's
	// spec.xet); a socket pull cannot.
	Xet *bool `json:"xet,omitempty"`
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
	// Public is the operator's word that an artifact fetched with
	// credentials may be public on the node anyway (every local user
	// reads its trees, every pod mounts it, it gets an hf/ view): without
	// it such an artifact is private (root only, unless AllowedNamespaces
	// or LocalGroup say who else). It does not open an artifact that
	// AllowedNamespaces or LocalGroup make private. modelctl pull
	// --public, models.d public: true.
	Public bool `json:"public,omitempty"`
	// Credentialed says the artifact is fetched with credentials: a
	// models.d credentialsFile, a ModelCache's Secret, credentials in the
	// source URI, or the daemon's own for the source (HF_TOKEN, AWS keys,
	// NGC_API_KEY, a registry login). Set only by the daemon, at every
	// pull and when it loads the desires it keeps.
	Credentialed bool `json:"credentialed,omitempty"`
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

// Desire states.
const (
	StatePresent = "present"
	StateAbsent  = "absent"
)

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
	// Public keeps the artifact public though the daemon fetches it with
	// credentials (Desire.Public).
	Public bool `json:"public,omitempty"`
}

// Desire is the desire the request asks for, before the daemon fills in
// its origin and requester.
func (r PullRequest) Desire() Desire {
	return Desire{Name: r.Name, URI: r.URI, Digest: r.Digest, Pin: r.Pin, Keep: r.Keep, State: r.State, Include: r.Include,
		Exclude: r.Exclude, Kind: r.Kind, Signature: r.Signature, KernelCaches: r.KernelCaches, Public: r.Public}
}
