package k8ssync

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers"
	hffetcher "github.com/modelcache/modelcache/fetchers/hf"
)

// One resolution per cluster. The elected daemon resolves each source of
// a ModelCache (main, versions, kernel caches) once and records it in
// status.resolved; every node turns that record into the desire it hands
// its daemon: the pinned URI (only when it is the spec's source at a
// revision: pinned.go), and the folder checksum that two nodes agreed on
// (recordDigests). A node never resolves a branch or tag on its own, so a
// node that joins later serves the same bytes as its peers.

// resolveRetry is how soon a failed resolution is tried again.
const resolveRetry = 30 * time.Second

// sourceOf is one source of a ModelCache as a desire to resolve.
type sourceOf struct {
	artifact string
	source   string
	ds       api.Desire
}

// sources lists mc's sources: the main one, each kernel cache image, each
// version.
func sources(mc *ModelCache) []sourceOf {
	main := api.Desire{Name: mc.Name, URI: mc.Spec.Source, Include: mc.Spec.Include, Exclude: mc.Spec.Exclude}
	out := []sourceOf{{artifact: mc.Name, source: mc.Spec.Source, ds: main}}
	for i, kc := range mc.Spec.KernelCaches {
		main.KernelCaches = append(main.KernelCaches, api.KernelCacheRef{Name: kc.Name, URI: kc.Image})
		n := main.KernelCacheName(i)
		out = append(out, sourceOf{artifact: n, source: kc.Image, ds: api.Desire{Name: n, URI: kc.Image, Kind: api.KindKernelCache}})
	}
	for _, v := range mc.Spec.Versions {
		n := mc.Name + "-" + v.Suffix
		out = append(out, sourceOf{artifact: n, source: v.Source, ds: api.Desire{Name: n, URI: v.Source, Include: mc.Spec.Include, Exclude: mc.Spec.Exclude}})
	}
	return out
}

// resolveAll is mc's status.resolved after this pass: an entry whose
// source the spec still names is kept (with its folder checksum) when
// its URI is that source at a revision (atRevision); a new or changed
// source, or a forged entry, is resolved now; a failed one again after
// resolveRetry; under updatePolicy Poll every entry again each interval
// (kept as it was when the revision has not moved, and when the poll
// fails: a known resolution is never dropped for a passing error). again
// says when a failure wants another pass.
func (s *Syncer) resolveAll(ctx context.Context, mc *ModelCache) (out []ResolvedSource, again bool) {
	old := map[string]ResolvedSource{}
	for _, e := range mc.Status.Resolved {
		old[e.Artifact] = e
	}
	if mc.Spec.State == StateAbsent {
		return mc.Status.Resolved, false // nothing to pull; keep the record
	}
	poll, _ := pollInterval(mc)
	now := s.cfg.Now()
	var creds map[string]string
	credsRead := false
	for _, src := range sources(mc) {
		key := mc.Name + "/" + src.artifact
		e, had := old[src.artifact]
		if had && e.Source == src.source && e.URI != "" {
			if err := atRevision(src.source, e.URI); err != nil {
				// Forged: resolved again now (the nodes refused it).
				s.log.Warn("k8s sync: dropping a recorded resolution that is not the spec's source at a revision", "modelcache", mc.Name,
					"artifact", src.artifact, "source", fetchers.RedactURI(src.source), "uri", clip(fetchers.RedactURI(e.URI), MaxStatusURI), "why", err)
				had = false
			}
		}
		polling := false
		if had && e.Source == src.source {
			switch {
			case e.Error != "" && now.Sub(e.ResolvedAt.Time) < resolveRetry:
				out = append(out, e)
				again = true
				continue
			case e.Error == "" && (poll == 0 || now.Sub(s.lastPoll(key, e.ResolvedAt.Time)) < poll):
				out = append(out, e)
				continue
			}
			polling = e.Error == ""
		}
		var refused error
		if u, ok := s.credentialsOf(mc); ok && u.refused != "" {
			refused = errors.New(u.refused) // resolved with no Secret at all
		} else if ok && !credsRead {
			credsRead = true
			var err error
			if creds, err = s.secret(ctx, u.ns, u.name); err != nil {
				s.log.Warn("k8s sync: credentials for resolution", "modelcache", mc.Name, "secret", u.key(), "err", err)
			}
		}
		var rev, uri string
		err := refused
		if err == nil {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			rev, uri, err = s.node.Resolve(rctx, src.ds, creds)
			cancel()
		}
		if err == nil {
			if bad := atRevision(src.source, uri); bad != nil {
				// The nodes would refuse it: an error, retried.
				err = fmt.Errorf("the resolution %s is not the source at a revision: %w", clip(fetchers.RedactURI(uri), MaxStatusURI), bad)
			} else if len(rev) > MaxStatusField {
				// Not clipped: a clipped revision names no revision.
				err = fmt.Errorf("a revision of %d bytes; the status holds at most %d", len(rev), MaxStatusField)
			}
		}
		if polling {
			if err != nil || (rev == e.Revision && uri == e.URI) {
				// Nothing to record: the next poll is an interval on. (A
				// moved revision is not marked: its record's resolvedAt
				// is, once written; a write that fails polls again.)
				s.mu.Lock()
				s.polled[key] = now
				s.mu.Unlock()
				if err != nil {
					s.log.Warn("k8s sync: polling the source (the known resolution stays)", "modelcache", mc.Name, "artifact", src.artifact,
						"source", fetchers.RedactURI(src.source), "err", fetchers.RedactText(err.Error()))
				}
				out = append(out, e)
				continue
			}
			s.log.Info("k8s sync: the source moved (updatePolicy Poll); rolling out", "modelcache", mc.Name, "artifact", src.artifact,
				"source", fetchers.RedactURI(src.source), "from", e.Revision, "to", rev)
		}
		e = ResolvedSource{Artifact: src.artifact, Source: src.source, Revision: rev, URI: uri, Generation: mc.Generation,
			ResolvedAt: metav1.NewTime(now.Truncate(time.Second))}
		if err != nil {
			e.Revision, e.URI, e.Error = "", "", clip(fetchers.RedactText(err.Error()), MaxStatusMessage)
			again = true
			s.log.Warn("k8s sync: resolving for the cluster", "modelcache", mc.Name, "artifact", src.artifact, "source", fetchers.RedactURI(src.source), "err", e.Error)
		} else {
			s.log.Info("k8s sync: resolved for the cluster", "modelcache", mc.Name, "artifact", src.artifact, "source", fetchers.RedactURI(src.source), "revision", rev)
		}
		out = append(out, e)
	}
	return out, again
}

// lastPoll is when key (modelcache/artifact) was last resolved: polled
// by this leader, else resolvedAt.
func (s *Syncer) lastPoll(key string, resolvedAt time.Time) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.polled[key]; ok && t.After(resolvedAt) {
		return t
	}
	return resolvedAt
}

// pollInterval is mc's Poll interval, 0 for OnChange. A bad policy (the
// CRD refuses it; an older CRD may not) is an error and counts as
// OnChange; an interval under MinPollInterval counts as that.
func pollInterval(mc *ModelCache) (time.Duration, error) {
	p := mc.Spec.UpdatePolicy
	if p == nil || p.Type == "" || p.Type == PolicyOnChange {
		return 0, nil
	}
	if p.Type != PolicyPoll {
		return 0, fmt.Errorf("spec.updatePolicy.type %q: want OnChange or Poll", p.Type)
	}
	d, err := time.ParseDuration(p.Interval)
	if err != nil {
		return 0, fmt.Errorf("spec.updatePolicy.interval %q: want a duration of at least %s, e.g. 10m or 1h", p.Interval, MinPollInterval)
	}
	return max(d, MinPollInterval), nil
}

// digestQuorum is how many nodes must report the same folder checksum
// of a resolution, Ready, before the elected daemon records it: no one
// node's report (a node that lies, a node whose origin served it other
// bytes) decides what every other node must produce.
const digestQuorum = 2

// recordDigests fills the folder checksum of each resolution that has
// none once digestQuorum nodes hold its revision Ready with the same one
// (each node counts once; were several checksums to reach it at once,
// the most common, then the least). Until then nodes pull without it.
// A recorded one stays while digestQuorum nodes bear it out; one they do
// not (written while a node held the Lease: trust.go) is dropped, or
// replaced by the one they do agree on.
func recordDigests(resolved []ResolvedSource, nodes []ModelCacheNode) []ResolvedSource {
	out := append([]ResolvedSource(nil), resolved...)
	for i := range out {
		e := &out[i]
		if e.URI == "" || e.Error != "" {
			e.Digest = ""
			continue
		}
		seen := readyDigestVotes(*e, nodes)
		if e.Digest != "" && len(seen[e.Digest]) >= digestQuorum {
			continue
		}
		e.Digest = ""
		best := digestQuorum - 1
		for d, by := range seen {
			if c := len(by); c > best || (c == best && c >= digestQuorum && d < e.Digest) {
				e.Digest, best = d, c
			}
		}
	}
	return out
}

// resolution is mc's record for artifact when it is for the source the
// spec names now, and its URI is that source at a revision (refused says
// why a record for the source is not, pinned.go).
func resolution(mc *ModelCache, artifact, source string) (e ResolvedSource, ok bool, refused error) {
	for _, e := range mc.Status.Resolved {
		if e.Artifact == artifact && e.Source == source {
			if e.URI == "" || e.Error != "" {
				return e, false, nil
			}
			if err := atRevision(source, e.URI); err != nil {
				return e, false, err
			}
			return e, true, nil
		}
	}
	return ResolvedSource{}, false, nil
}

// pinned turns a desire of mc into the cluster's: the pinned URI and,
// unless the user gave a digest, the cluster's folder checksum. ok is
// false while the cluster has no resolution for it, or one this node
// refuses (why says so).
func pinned(mc *ModelCache, ds api.Desire, source string) (out api.Desire, ok bool, why string) {
	e, ok, refused := resolution(mc, ds.Name, source)
	if !ok {
		if refused != nil {
			return ds, false, refusedWhy("status.resolved", refused)
		}
		if e.Error != "" {
			return ds, false, "the cluster could not resolve its source (the elected modelcached retries): " + clip(e.Error, MaxStatusMessage)
		}
		return ds, false, "waiting for the cluster's resolution of its source (status.resolved, written by the elected modelcached)"
	}
	return pinnedFrom(e, ds), true, ""
}

// pinnedFrom is ds pulled as the cluster resolved it in e.
func pinnedFrom(e ResolvedSource, ds api.Desire) api.Desire {
	ds.URI = e.URI
	if _, rev, err := hffetcher.ParseURI(e.Source); err == nil && !hffetcher.IsCommit(rev) {
		ds.Ref = rev // the HF view's refs/<branch> names the pinned commit
	}
	if ds.Digest == "" && e.Digest != "" {
		ds.Digest, ds.ClusterDigest = e.Digest, true
	}
	ds.OriginNodes = slices.Clone(e.OriginNodes[:min(len(e.OriginNodes), MaxOriginNodes)])
	return ds
}
