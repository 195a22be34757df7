package k8ssync

import (
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcache/modelcache/api"
)

// What a seized Lease cannot make last. Any node's token may take the
// aggregator's Lease (every node is a candidate) and, while it holds it,
// write ModelCache status: status.resolved and status.active (URIs,
// revisions, folder checksums, origin nodes). The nodes refuse a
// resolution that is not the spec's source at a revision (pinned.go);
// the rest the elected daemon checks on every pass against what the
// nodes themselves report, so that whatever a forger wrote does not
// outlive its Lease:
//   - a folder checksum stays only while digestQuorum nodes report it,
//     Ready, for that revision (recordDigests), in status.resolved and
//     status.active alike;
//   - a resolution this leader did not write or check itself, and that
//     digestQuorum nodes do not hold Ready (borneOut), is resolved again now
//     (founded), as is one stamped in the future (which would put off its
//     retry or its poll for ever);
//   - an active revision this leader did not write that the nodes do not
//     bear out gives way to the target (foundedActive);
//   - an origin-node list this leader did not assign is kept only when it
//     is what the leader would assign now (recordOrigins, originsBorneOut).
// A node that failed a pull on a forged checksum pulls again when the
// record changes (daemon: SourceChanged).

// futureSlack is how far ahead of the leader's clock a resolvedAt may be
// (clocks differ a little between nodes).
const futureSlack = time.Minute

// founded is mc's status.resolved without the entries the leader must
// resolve again: those it did not write or endorse itself (endorsed) that
// the nodes do not bear out (borneOut), and those stamped after now.
// resolveAll then resolves the missing ones as it does a new source.
func founded(mc *ModelCache, nodes []ModelCacheNode, now time.Time, endorsed *endorsements, log *slog.Logger) []ResolvedSource {
	var out []ResolvedSource
	for _, e := range mc.Status.Resolved {
		if e.ResolvedAt.After(now.Add(futureSlack)) {
			log.Warn("k8s sync: resolving again a recorded resolution stamped in the future", "modelcache", mc.Name, "artifact", e.Artifact, "resolved_at", e.ResolvedAt.Time)
			continue
		}
		if !endorsed.has(mc.Name, e) && !borneOut(nodes, mc.Name, e) {
			if own, ok := endorsed.own(mc.Name, e); ok {
				out = append(out, own) // resolved again already (its write still to come): not asked again
				continue
			}
			if e.URI != "" || e.Error != "" {
				log.Info("k8s sync: resolving again a recorded resolution this daemon did not make and no two nodes hold (written by an earlier leader)",
					"modelcache", mc.Name, "artifact", e.Artifact, "revision", e.Revision)
			}
			continue
		}
		out = append(out, e)
	}
	return out
}

// foundedActive is mc's status.active without the entries this leader
// did not write (endorsed under activeKey) that the nodes do not bear
// out: rollouts then makes the target active in their place.
func foundedActive(mc *ModelCache, nodes []ModelCacheNode, endorsed *endorsements, log *slog.Logger) []ResolvedSource {
	var out []ResolvedSource
	for _, e := range mc.Status.Active {
		if !endorsed.has(activeKey(mc.Name), e) && !borneOut(nodes, mc.Name, e) {
			log.Info("k8s sync: dropping a recorded active revision this daemon did not make and the nodes do not hold (written by an earlier leader)",
				"modelcache", mc.Name, "artifact", e.Artifact, "revision", e.Revision)
			continue
		}
		out = append(out, e)
	}
	return out
}

// activeKey is the name under which the leader endorses mc's
// status.active (its status.resolved: mc).
func activeKey(mc string) string { return "active\x00" + mc }

// withFounded is mc with status.resolved and status.active as founded and
// foundedActive leave them (mc itself when nothing is left out).
func (s *Syncer) withFounded(mc *ModelCache, nodes []ModelCacheNode) *ModelCache {
	f := founded(mc, nodes, s.cfg.Now(), &s.endorsed, s.log)
	a := foundedActive(mc, nodes, &s.endorsed, s.log)
	if len(f) == len(mc.Status.Resolved) && len(a) == len(mc.Status.Active) {
		return mc
	}
	m := *mc
	m.Status.Resolved, m.Status.Active = f, a
	return &m
}

// endorsements are the resolutions the leader wrote or kept (after
// founded), by modelcache/artifact: the next passes keep them without
// asking the nodes. The zero value is ready; safe for concurrent use.
type endorsements struct {
	mu sync.Mutex
	m  map[string]ResolvedSource // without checksum and origin nodes
}

// add endorses the resolutions of ModelCache mc.
func (en *endorsements) add(mc string, resolved []ResolvedSource) {
	en.mu.Lock()
	defer en.mu.Unlock()
	if en.m == nil {
		en.m = map[string]ResolvedSource{}
	}
	for _, e := range resolved {
		e.Digest, e.OriginNodes = "", nil
		en.m[mc+"/"+e.Artifact] = e
	}
}

// has: e, of ModelCache mc, is as the leader endorsed it.
func (en *endorsements) has(mc string, e ResolvedSource) bool {
	en.mu.Lock()
	defer en.mu.Unlock()
	k, ok := en.m[mc+"/"+e.Artifact]
	return ok && endorsedKey(k) == endorsedKey(e)
}

// own is the leader's endorsed resolution of e's artifact of ModelCache
// mc, when it is of e's source.
func (en *endorsements) own(mc string, e ResolvedSource) (ResolvedSource, bool) {
	en.mu.Lock()
	defer en.mu.Unlock()
	k, ok := en.m[mc+"/"+e.Artifact]
	return k, ok && k.Source == e.Source
}

// resolutionKey is what of a resolution the leader vouches for: not its
// checksum nor its origin nodes, which are checked on their own.
type resolutionKey struct {
	source, uri, revision, err string
	generation                 int64
	at                         time.Time
}

func endorsedKey(e ResolvedSource) resolutionKey {
	return resolutionKey{e.Source, e.URI, e.Revision, e.Error, e.Generation, e.ResolvedAt.Time.UTC().Truncate(time.Second)}
}

// holders is how many distinct nodes report e's revision of artifact
// e.Artifact of ModelCache mc Ready, current or prefetched.
func holders(nodes []ModelCacheNode, mc string, e ResolvedSource) int {
	if e.URI == "" || e.Error != "" {
		return 0
	}
	by := map[string]bool{}
	for _, n := range nodes {
		for _, as := range n.Status.Artifacts {
			if as.Name == e.Artifact && as.ModelCache == mc && holds(as, e) {
				by[n.Name] = true
			}
		}
	}
	return len(by)
}

// reporters is how many distinct nodes report artifact of ModelCache mc
// at all.
func reporters(nodes []ModelCacheNode, mc, artifact string) int {
	n := 0
	for _, node := range nodes {
		if slices.ContainsFunc(node.Status.Artifacts, func(as ArtifactStatus) bool { return as.Name == artifact && as.ModelCache == mc }) {
			n++
		}
	}
	return n
}

// borneOut says whether the nodes bear out resolution e of ModelCache
// mc: digestQuorum of them hold it Ready (all of them, when fewer report
// the artifact at all: a cluster of one node).
func borneOut(nodes []ModelCacheNode, mc string, e ResolvedSource) bool {
	return holders(nodes, mc, e) >= min(digestQuorum, max(reporters(nodes, mc, e.Artifact), 1))
}

// originsBorneOut says whether recorded, an origin-node list of artifact
// this leader did not assign, is one it would assign now: the first
// len(recorded) of the candidates (live, selected) by Rendezvous, no
// fewer than want of them (the leader's OriginConcurrency, or every
// candidate when there are fewer). A node that seized the Lease can
// name itself only where it would be named anyway.
func originsBorneOut(artifact string, recorded, candidates []string, want int) bool {
	if len(recorded) == 0 || len(recorded) > MaxOriginNodes || len(recorded) < min(max(want, 1), len(candidates)) {
		return false
	}
	return slices.Equal(recorded, OriginNodes(artifact, candidates, len(recorded)))
}

// readyDigestVotes is, for each folder checksum reported for e's
// revision of e.Artifact, the nodes that report it Ready (current, or
// prefetched for a rollout).
func readyDigestVotes(e ResolvedSource, nodes []ModelCacheNode) map[string]map[string]bool {
	seen := map[string]map[string]bool{}
	vote := func(d, node string) {
		if !folderChecksum(d) {
			return // a report no checksum could be (a node that lies) never counts
		}
		if seen[d] == nil {
			seen[d] = map[string]bool{}
		}
		seen[d][node] = true
	}
	for _, n := range nodes {
		for _, a := range n.Status.Artifacts {
			// The revision, from the pinned URI: an old pull of the
			// same name (a source without revisions, another source)
			// does not count.
			if a.Name != e.Artifact {
				continue
			}
			if api.Phase(a.Phase) == api.PhaseReady && a.Digest != "" && (served{a.Revision, a.Source}).is(e) {
				vote(a.Digest, n.Name)
			} else if x := a.Next; x != nil && api.Phase(x.Phase) == api.PhaseReady && x.Digest != "" && (served{x.Revision, x.Source}).is(e) {
				vote(x.Digest, n.Name) // prefetched for a rollout
			}
		}
	}
	return seen
}

// folderChecksum: d is sha256:<64 lowercase hex>.
func folderChecksum(d string) bool {
	h, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(h) != 64 {
		return false
	}
	for _, c := range h {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
