package k8ssync

import (
	"errors"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/modelcache/modelcache/fetchers"
	hffetcher "github.com/modelcache/modelcache/fetchers/hf"
	ngcfetcher "github.com/modelcache/modelcache/fetchers/ngc"
)

// The fleet follows the spec, not a node. status.resolved and
// status.active are written by whichever daemon holds the aggregator's
// Lease, and every node's service account may update a ModelCache's
// status: a node pulls a recorded URI (with the ModelCache's Secret) only
// when it is the spec's source at a revision, and the elected daemon
// drops a recorded entry that is not.

var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// atRevision says whether pinned names source at some revision: the same
// scheme, host, repository (or bucket, or model) and path, only the
// revision part differing, and that revision immutable. Per scheme, as
// the daemon pins them (daemon/sources.go pinnedURI):
//
//	hf    hf://<repo>@<40-hex commit>
//	oci   oci://<registry>/<repo>@sha256:<64 hex> (the source's tag or digest replaced)
//	ngc   ngc://<org>[/<team>]/<model>:<version>
//
// s3, http(s) and file sources have no pinned form (the revision travels
// beside the URI and the folder checksum guards the bytes): pinned must
// be the source itself. The error says why not, without the URIs.
func atRevision(source, pinned string) error {
	if pinned == source {
		return nil
	}
	scheme, err := fetchers.Scheme(source)
	if err != nil {
		return errors.New("the spec's source does not parse")
	}
	if p, err := fetchers.Scheme(pinned); err != nil || p != scheme {
		return errors.New("another scheme")
	}
	switch scheme {
	case "hf":
		repo, _, err := hffetcher.ParseURI(source)
		if err != nil {
			return errors.New("the spec's source does not parse")
		}
		rev, ok := strings.CutPrefix(pinned, "hf://"+repo+"@")
		if !ok {
			return errors.New("another repository")
		}
		if !hffetcher.IsCommit(rev) {
			return errors.New("the revision is not a commit")
		}
		return nil
	case "oci":
		digest, ok := strings.CutPrefix(pinned, "oci://"+ociRepository(source)+"@sha256:")
		if !ok {
			return errors.New("another registry or repository")
		}
		if !sha256Hex.MatchString(digest) {
			return errors.New("the revision is not a sha256 manifest digest")
		}
		return nil
	case "ngc":
		r, err := ngcfetcher.ParseURI(source)
		if err != nil {
			return errors.New("the spec's source does not parse")
		}
		p, err := ngcfetcher.ParseURI(pinned)
		if err != nil || p.Version == "" {
			return errors.New("not a model version")
		}
		if r.Version = p.Version; r.String() != pinned {
			return errors.New("another org, team or model")
		}
		return nil
	}
	return errors.New(scheme + " sources have no pinned form: the URI must be the source itself")
}

// ociRepository is an oci:// source's registry and repository, without
// its tag or digest.
func ociRepository(source string) string {
	ref, _, _ := strings.Cut(strings.TrimPrefix(source, "oci://"), "@")
	if i := strings.LastIndexByte(ref, ':'); i > strings.LastIndexByte(ref, '/') {
		ref = ref[:i]
	}
	return ref
}

// refusal is an entry of a ModelCache's status that names an artifact's
// source (Source is the spec's) but a URI that is not it at a revision.
type refusal struct {
	artifact, field, source, uri string
	err                          error
}

// forged lists mc's refused entries, of status.resolved and
// status.active.
func forged(mc *ModelCache) []refusal {
	var out []refusal
	for _, src := range sources(mc) {
		for _, f := range []struct {
			field string
			es    []ResolvedSource
		}{{"status.resolved", mc.Status.Resolved}, {"status.active", mc.Status.Active}} {
			for _, e := range f.es {
				if e.Artifact != src.artifact || e.Source != src.source || e.URI == "" {
					continue
				}
				if err := atRevision(src.source, e.URI); err != nil {
					out = append(out, refusal{artifact: src.artifact, field: f.field, source: src.source, uri: e.URI, err: err})
				}
			}
		}
	}
	return out
}

// message is r as an Event's message: both URIs (redacted, clipped).
func (r refusal) message() string {
	return r.artifact + ": refused " + r.field + " uri " + clip(fetchers.RedactURI(r.uri), MaxStatusURI) +
		": it is not the spec's source " + clip(fetchers.RedactURI(r.source), MaxStatusURI) + " at a revision (" + r.err.Error() + ")"
}

// refusedWhy is why a node waits on a refused entry of field.
func refusedWhy(field string, err error) string {
	return "refused the cluster's " + field + ": its uri is not the spec's source at a revision (" + err.Error() +
		"); this node keeps what it serves until the elected modelcached records the source again"
}

// refuse records a Warning Event on mc for each of rs not reported at
// the previous pass (seen collects this pass's; desires keeps them).
func (s *Syncer) refuse(mc *ModelCache, rs []refusal, seen map[string]bool) {
	for _, r := range rs {
		if s.told(mc.Name+"/"+r.artifact+"/"+r.field+"/"+r.uri, seen) {
			continue
		}
		s.log.Warn("k8s sync: refused a resolution that is not the spec's source at a revision", "modelcache", mc.Name, "artifact", r.artifact,
			"field", r.field, "uri", clip(fetchers.RedactURI(r.uri), MaxStatusURI), "source", fetchers.RedactURI(r.source), "why", r.err)
		s.warnOn(mc, EventResolutionRefused, r.message())
	}
}

// told marks key as seen this pass and says whether the previous pass
// told it already (one Event per refusal, not one per pass).
func (s *Syncer) told(key string, seen map[string]bool) bool {
	seen[key] = true
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused[key]
}

// warnOn raises a Warning Event on mc, from this node.
func (s *Syncer) warnOn(mc *ModelCache, reason, msg string) {
	ref := &corev1.ObjectReference{APIVersion: Group + "/" + Version, Kind: "ModelCache", Name: mc.Name, UID: mc.UID}
	s.rec.Event(ref, corev1.EventTypeWarning, reason, "node "+s.cfg.NodeName+": "+msg)
}
