package api

import "time"

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
	// Credentials names the credentials the daemon's own environment
	// holds (never their values): HF_TOKEN (or the hub's token file),
	// NGC_API_KEY, AWS_ACCESS_KEY_ID (or AWS_PROFILE, a web identity).
	// Credentials are the daemon's: modelctl sends none.
	Credentials []string `json:"credentials,omitempty"`
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
