// Package fetchers defines how a source is resolved to an immutable
// revision and a file list, and how one file is streamed from an offset.
// One sub-package per scheme implements Fetcher: file, http (and https),
// hf, ngc, s3 and oci. The package also holds what every fetcher shares: retry with
// backoff and jitter that honours Retry-After, include/exclude globs,
// progress counting, bandwidth limits and per-read idle timeouts, and the
// options of the fetchers that speak HTTP (HTTPOptions, Option: transport,
// redirect policy, idle timeout, User-Agent, Range connections), which
// each of them takes through its own WithHTTP.
//
// Fetchers know nothing about the store's layout: they hand bytes to the
// caller, which ingests and verifies them.
//
// Where to find what:
//
//	fetchers.go     Source, Identity (whose credentials a read uses), Resolved,
//	                File, the Fetcher interface
//	retry.go        Backoff with jitter, Retry-After, RetryAfterError
//	parallel.go     reading a large file in Range chunks, adding connections
//	                when one stream is slow (AdaptiveReader)
//	io.go           counting, bandwidth limits, idle timeouts and a minimum rate of a read
//	glob.go         include/exclude globs over a file list
//	outbound.go     Guard: no request to a host-internal address (loopback,
//	                link-local, cloud metadata, this host's interfaces)
//	options.go      HTTPOptions and the Options every HTTP fetcher shares (transport, connections, chunk, User-Agent)
//	redirect.go     the redirect policy: credentials go only to their origin
//	redact.go       credentials out of URIs, texts and log records
//	config_file.go  reading a small file the node's configuration names, safely
//	untar.go        Untar: a tar stream within limits, paths checked, whiteouts reported
package fetchers

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
)

// Sentinel errors; fetchers wrap them with the URI or path first.
var (
	ErrNotFound     = errors.New("not found")
	ErrUnauthorized = errors.New("access denied")
	ErrBadSource    = errors.New("invalid source")
	ErrUnsupported  = errors.New("unsupported scheme")
	// ErrCannotResume says the source cannot continue the file from the
	// offset asked: it changed since it was resolved (its validator no
	// longer matches) or it cannot prove it did not. The bytes the caller
	// holds are of another version: it discards them and opens the file
	// again from offset 0. Not Permanent.
	ErrCannotResume = errors.New("cannot resume")
	// ErrInconsistent says the source contradicts itself (a listing that
	// holds fewer files than it announces): another attempt gets the same
	// answer, so the daemon does not retry it (api.ReasonSourceInconsistent).
	ErrInconsistent = errors.New("inconsistent source")
)

// Source is what a desire asks for.
type Source struct {
	URI     string
	Include []string // globs; empty means every file
	Exclude []string // globs
	// KernelCache asks an oci source for a kernel cache image: every tar
	// layer is taken whole (not only a /models subtree) and the image
	// labels come back in Resolved.Labels.
	KernelCache bool
	// As is who asked for the source: a local source (file://) is read
	// with this uid and these groups, so a pull reads only what they
	// could. Nil: the daemon's own configuration, read as the daemon.
	As *Identity
}

// CredentialSender is implemented by a fetcher that can say whether its
// requests for uri carry credentials of its own configuration (a token,
// keys, a registry login): what it fetches with them may be gated or
// private at the source, so the daemon keeps it private on the node
// unless its operator says otherwise. A fetcher that does not implement
// it sends none.
type CredentialSender interface {
	SendsCredentials(ctx context.Context, uri string) bool
}

// Identity is a local user: a uid, its primary gid and its groups.
type Identity struct {
	UID    uint32
	GID    uint32
	Groups []uint32
}

// File is one file of a resolved source.
type File struct {
	Path   string // slash-separated, relative: the path in the artifact tree
	Size   int64  // bytes, or -1 when the source does not say
	Digest string // "sha256:<hex>" when the source knows it, else ""
	Mode   uint32 // permission bits at the source, 0 when unknown
	// Locator is private to the fetcher that resolved the file (a URL, an
	// absolute path); callers pass it back to Open unchanged.
	Locator string
	// Etag is the name the source gives the content (a hub's LFS sha256 or
	// git blob sha1); the HF cache view names its blobs by it.
	Etag string
	// Validator, when set, names the version of the content the source had
	// at Resolve (an HTTP strong ETag, else its Last-Modified date). Open
	// continues a file from an offset only against the same validator and
	// fails with ErrCannotResume otherwise; a caller that keeps partial
	// data across attempts keys it by the validator too, so bytes of one
	// version are never continued with bytes of another.
	Validator string
	// Check, when set, is a second verification of the complete content
	// (a git blob sha1) that must pass before the bytes become a blob.
	Check func(io.Reader) error
	// Archive, when set, says this "file" is an archive (an OCI tar layer)
	// whose members are the artifact's files: the caller streams it with
	// Open, checks Digest over the whole stream, and unpacks it with Untar.
	// Path is then only a label.
	Archive *Archive
}

// Archive describes a layer to unpack.
type Archive struct {
	MediaType string // tells the compression: +gzip, +zstd, or none
	Subtree   string // only members under it, prefix removed ("models" for modelcar images)
}

// Resolved pins a source to an immutable revision.
type Resolved struct {
	URI string
	// Revision is the immutable revision the source resolved to. Empty
	// means the source has no revision of its own (a plain file or URL):
	// the store then uses the digest of the manifest, so the content is
	// the revision.
	Revision string
	Files    []File
	// Repo and Ref are set by hub sources: the repo id and the revision
	// the user asked for (a branch, tag or commit), for the HF cache view.
	Repo string
	Ref  string
	// Labels are an OCI image's config labels (kernel cache summaries).
	Labels map[string]string
}

// Fetcher resolves and streams one kind of source. Implementations are
// safe for concurrent use.
type Fetcher interface {
	// Resolve pins src to a revision and lists its files. Include and
	// exclude globs are applied by the caller (Filter).
	Resolve(ctx context.Context, src Source) (*Resolved, error)
	// Open streams f from offset. The caller closes the reader. Errors
	// from Open or Read that are worth retrying are not Permanent.
	Open(ctx context.Context, f File, offset int64) (io.ReadCloser, error)
}

// Registry maps URI schemes to fetchers.
type Registry map[string]Fetcher

// For returns the fetcher for uri's scheme.
func (r Registry) For(uri string) (Fetcher, error) {
	scheme, err := Scheme(uri)
	if err != nil {
		return nil, err
	}
	f, ok := r[scheme]
	if !ok {
		known := make([]string, 0, len(r))
		for k := range r {
			known = append(known, k+"://")
		}
		return nil, fmt.Errorf("source %q: %w %q; this daemon knows %s", uri, ErrUnsupported, scheme, strings.Join(known, ", "))
	}
	return f, nil
}

// Scheme parses uri just enough to return its scheme, lower-cased.
func Scheme(uri string) (string, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", fmt.Errorf("source %q: %w: %v", uri, ErrBadSource, err)
	}
	if u.Scheme == "" {
		return "", fmt.Errorf("source %q: %w: no scheme; write file:///abs/path or https://host/path", uri, ErrBadSource)
	}
	return strings.ToLower(u.Scheme), nil
}

// permanent marks an error that a retry cannot fix.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// Permanent marks err as not worth retrying.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

// IsPermanent reports whether err (or what it wraps) was marked Permanent,
// or is a context cancellation.
func IsPermanent(err error) bool {
	var p permanent
	return errors.As(err, &p) || errors.Is(err, context.Canceled)
}
