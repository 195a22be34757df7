package cachestore

import (
	"context"
	"os"
)

// The store as its consumers see it: small role interfaces, each a few
// methods, composed into what one consumer needs (containerd's content
// package: Provider, Ingester, Manager, composed into Store). They are
// declared here, beside the one implementation, so that a consumer takes
// the narrowest role it needs and a test can hand it a fake; a consumer
// that needs a different mix composes its own from these.

// Ingester brings bytes in: a Writer per blob (resumable by ref) and the
// commit of many small blobs in one batch.
type Ingester interface {
	Writer(ctx context.Context, opts WriterOpts) (*Writer, error)
	CommitBatch(ctx context.Context, ws []*Writer, sizes []int64) ([]string, error)
}

// Provider reads committed blobs by digest.
type Provider interface {
	HasBlob(d string) bool
	OpenBlob(d string) (*os.File, error)
}

// Leaser protects blobs from GC while a pull that wants them is in flight.
type Leaser interface {
	NewLease() *Lease
}

// Committer makes versions visible: a manifest of present blobs becomes a
// Ready version, and a staged version becomes current.
type Committer interface {
	CommitVersion(ctx context.Context, spec VersionSpec) (*Version, error)
	Activate(name, rev string) error
}

// Inspector looks one artifact up: Summary without manifests, Get with.
type Inspector interface {
	Summary(name string) (*Artifact, error)
	Get(name string) (*Artifact, error)
}

// Lister lists every artifact without manifests and says where a
// version's tree is.
type Lister interface {
	ListSummaries() ([]Artifact, error)
	TreePath(kind, name, rev string) string
}

// Puller is what a pull needs: look the artifact up, lease and check
// blobs, ingest what is missing, commit the version.
type Puller interface {
	Inspector
	Provider
	Leaser
	Ingester
	Committer
}

// Viewer is what the read views need (list, inspect, status, usage);
// nothing in it changes the store.
type Viewer interface {
	Inspector
	Lister
	Usage() (*Usage, error)
	BlobStats() (bytes int64, count int, err error)
	FSStat() (capacity, free int64, err error)
}

// Pruner is what eviction needs: every version's size and last use
// (ListSummaries), the bytes the store holds, the removal of a version,
// and GC of the blobs nothing references any more.
type Pruner interface {
	ListSummaries() ([]Artifact, error)
	StoreBytes() (int64, error)
	Evict(ctx context.Context, name, rev string, force bool) ([]string, error)
	GC(ctx context.Context) (*GCReport, error)
}

var (
	_ Puller = (*Store)(nil)
	_ Viewer = (*Store)(nil)
	_ Pruner = (*Store)(nil)
)
