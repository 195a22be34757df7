package peer

import (
	"bytes"
	"crypto/sha256"
	"sort"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/k8ssync"
)

// PickQuery says which peers Pick looks for.
type PickQuery struct {
	// Self is this node's name: never its own peer.
	Self string
	// Artifact is the node artifact's name (ArtifactStatus.Name), Revision
	// the cluster's resolved revision, Digest (optional) the resolution's
	// manifest digest: a node is a holder only where its status reports
	// that revision (and digest) Ready, as its current revision or as a
	// rollout's prefetched next one.
	Artifact string
	Revision string
	Digest   string
	// Now and MaxAge leave out a node whose heartbeat is older than
	// MaxAge (its daemon may be gone); MaxAge 0 keeps every node.
	Now    time.Time
	MaxAge time.Duration
	// Addr is the base URL of a node's peer port (http://ip:port); a node
	// it does not know is left out.
	Addr func(node string) (string, bool)
	// Max bounds the list; 0 means no bound.
	Max int
}

// Pick lists the base URLs of the nodes that hold q's revision, in the
// order q.Self should ask them. The order is rendezvous hashing of
// (Self, node): stable for one requester, different between requesters,
// so that N nodes fetching at once spread over the holders instead of
// all asking the first. A pure function of its arguments.
func Pick(nodes []k8ssync.ModelCacheNode, q PickQuery) []string {
	type cand struct {
		url   string
		score [32]byte
	}
	var cs []cand
	for i := range nodes {
		n := &nodes[i]
		if n.Name == q.Self || !Holds(n.Status.Artifacts, q) {
			continue
		}
		if q.MaxAge > 0 && q.Now.Sub(n.Status.Heartbeat.Time) > q.MaxAge {
			continue
		}
		u, ok := q.Addr(n.Name)
		if !ok || u == "" {
			continue
		}
		cs = append(cs, cand{url: u, score: sha256.Sum256([]byte(q.Self + "\x00" + n.Name))})
	}
	sort.Slice(cs, func(i, j int) bool { return bytes.Compare(cs[i].score[:], cs[j].score[:]) < 0 })
	if q.Max > 0 && len(cs) > q.Max {
		cs = cs[:q.Max]
	}
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.url
	}
	return out
}

// Holds reports whether one of arts is q's artifact with q's revision
// Ready, current or next.
func Holds(arts []k8ssync.ArtifactStatus, q PickQuery) bool {
	match := func(phase, rev, digest string) bool {
		return phase == string(api.PhaseReady) && rev == q.Revision && (q.Digest == "" || digest == q.Digest)
	}
	for _, a := range arts {
		if a.Name != q.Artifact {
			continue
		}
		if match(a.Phase, a.Revision, a.Digest) || (a.Next != nil && match(a.Next.Phase, a.Next.Revision, a.Next.Digest)) {
			return true
		}
	}
	return false
}
