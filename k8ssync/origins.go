package k8ssync

import (
	"context"
	"crypto/sha256"
	"net/url"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelcache/modelcache/api"
)

// The origin nodes of a resolution. With fan-out between nodes, of the
// nodes that pull one revision only a few fetch it from the origin; the
// others take its blobs from them. Were each node to work out which from
// the statuses it happens to have seen, two nodes that saw different
// statuses would both go to the origin. So the elected daemon records
// them with the resolution (status.resolved[].originNodes): the first
// OriginConcurrency, by rendezvous hashing of (artifact, node), of the
// nodes the ModelCache selects whose ModelCacheNode is live, and every
// node reads the same list. Kernel cache images are left out: a node
// takes one only where its GPUs run it, which the selector does not say;
// their nodes rank the nodes that want them as before.

// PeerStale: a ModelCacheNode whose heartbeat is older than this is not
// live (its daemon may be gone): no peer, no origin node. Statuses are
// written at least hourly.
const PeerStale = 3 * time.Hour

// MaxOriginNodes bounds status.resolved[].originNodes, whatever
// --origin-concurrency the elected daemon runs with.
const MaxOriginNodes = 8

// defaultOriginConcurrency is Config.OriginConcurrency's default.
const defaultOriginConcurrency = 2

// Rendezvous orders items by the hash of (key, item): the same order for
// one key on every node, a different one for each key, whatever order
// items come in.
func Rendezvous(key string, items []string) []string {
	type scored struct {
		item  string
		score [32]byte
	}
	s := make([]scored, 0, len(items))
	for _, it := range items {
		s = append(s, scored{it, sha256.Sum256([]byte(key + "\x00" + it))})
	}
	slices.SortFunc(s, func(a, b scored) int { return strings.Compare(string(a.score[:]), string(b.score[:])) })
	out := make([]string, len(s))
	for i := range s {
		out[i] = s[i].item
	}
	return out
}

// Live says whether n's daemon counts as present at now: its heartbeat
// is within PeerStale and it advertises a peer port (http or https).
func Live(n ModelCacheNode, now time.Time) bool {
	if now.Sub(n.Status.Heartbeat.Time) > PeerStale {
		return false
	}
	u, err := url.Parse(n.Status.PeerAddress)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// OriginNodes is the assignment for artifact: of the candidates (node
// names; duplicates count once), the first n by Rendezvous(artifact, ·),
// at most MaxOriginNodes. Nil when there is no candidate.
func OriginNodes(artifact string, candidates []string, n int) []string {
	c := slices.Compact(slices.Sorted(slices.Values(candidates)))
	out := Rendezvous(artifact, c)
	out = out[:min(len(out), max(n, 1), MaxOriginNodes)]
	if len(out) == 0 {
		return nil
	}
	return out
}

// originsMemo is the leader's last assignment of one ModelCache
// artifact: for which revision and live nodes, and what it was, so a
// pass whose write failed gives the same answer again without asking the
// API server.
type originsMemo struct {
	key   string
	nodes []string
	cand  []string // the candidates it was assigned from: the nodes expected to pull it (expected)
}

// recordOrigins fills the origin nodes of each model resolution of mc
// that has none (a kernel cache's stays without: see above), and checks
// a list another leader recorded (originsBorneOut): one this leader would
// not assign now is assigned again. The
// candidates are the live ModelCacheNodes of the nodes mc selects: one
// LIST of Nodes by mc's selector, done only when an entry lacks its
// list and the live nodes, or those of them whose status lists the
// artifact (a node whose labels came to match), changed since the last
// try. Once recorded, a list stays for as long as its resolution does.
// Without any live selected node the entries stay without, and the nodes
// rank as before.
func (s *Syncer) recordOrigins(ctx context.Context, mc *ModelCache, resolved []ResolvedSource, nodes []ModelCacheNode, now time.Time) []ResolvedSource {
	var live []string
	lists := map[string][]string{} // artifact → the live nodes whose status lists it
	for _, n := range nodes {
		if !Live(n, now) {
			continue
		}
		live = append(live, n.Name)
		for _, a := range n.Status.Artifacts {
			lists[a.Name] = append(lists[a.Name], n.Name)
		}
	}
	if len(live) == 0 || mc.Spec.State == StateAbsent {
		return ownOriginsOnly(resolved, func(artifact string) []string {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.origins[mc.Name+"/"+artifact].nodes
		})
	}
	slices.Sort(live)
	kernel := map[string]bool{}
	for _, src := range sources(mc) {
		kernel[src.artifact] = src.ds.Kind == api.KindKernelCache
	}
	var selected map[string]bool
	candidates := func() ([]string, error) {
		if selected == nil {
			var err error
			if selected, err = s.selectedNodes(ctx, mc); err != nil {
				s.log.Warn("k8s sync: listing the nodes the ModelCache selects, for its origin nodes (retried at the next pass)", "modelcache", mc.Name, "err", err)
				return nil, err
			}
		}
		var cand []string
		for _, n := range live {
			if selected[n] {
				cand = append(cand, n)
			}
		}
		return cand, nil
	}
	out := append([]ResolvedSource(nil), resolved...)
	for i := range out {
		e := &out[i]
		if e.URI == "" || e.Error != "" || kernel[e.Artifact] {
			e.OriginNodes = nil // none is ever assigned to these (a forged list goes)
			continue
		}
		memoKey := mc.Name + "/" + e.Artifact
		key := e.URI + "\x00" + e.Revision + "\x00" + strings.Join(live, ",") + "\x00" + strings.Join(slices.Sorted(slices.Values(lists[e.Artifact])), ",")
		s.mu.Lock()
		m, ok := s.origins[memoKey]
		s.mu.Unlock()
		if len(e.OriginNodes) > 0 {
			if ok && slices.Equal(m.nodes, e.OriginNodes) {
				continue // this leader's own
			}
			// Another leader's (trust.go): kept when it is what this one
			// would assign now.
			cand, err := candidates()
			if err != nil {
				return out
			}
			if originsBorneOut(e.Artifact, e.OriginNodes, cand, s.cfg.OriginConcurrency) {
				s.mu.Lock()
				s.origins[memoKey] = originsMemo{key: key, nodes: slices.Clone(e.OriginNodes), cand: cand}
				s.mu.Unlock()
				continue
			}
			s.log.Warn("k8s sync: dropping recorded origin nodes this daemon would not assign (written by an earlier leader)", "modelcache", mc.Name,
				"artifact", e.Artifact, "recorded", clipList(e.OriginNodes), "candidates", len(cand))
			e.OriginNodes, ok = nil, false
		}
		if !ok || m.key != key {
			cand, err := candidates()
			if err != nil {
				return out
			}
			m = originsMemo{key: key, nodes: OriginNodes(e.Artifact, cand, s.cfg.OriginConcurrency), cand: cand}
			s.mu.Lock()
			s.origins[memoKey] = m
			s.mu.Unlock()
			if len(m.nodes) > 0 {
				s.log.Info("k8s sync: origin nodes", "modelcache", mc.Name, "artifact", e.Artifact, "revision", e.Revision, "nodes", m.nodes)
			}
		}
		e.OriginNodes = slices.Clone(m.nodes)
	}
	return out
}

// expected is, for each model resolution of mc with origin nodes this
// leader assigned, the nodes it assigned them from (the live nodes mc
// selects) as Pending at that revision: published with the resolution
// (peerSets adds those whose own status does not list the artifact
// yet), so that a node's first view of a rollout holds the nodes that
// will fetch it, not only the few whose statuses were in by then, and
// the fan-out planner lays each blob's tree out over all of them at
// once (daemon/fanout: treeParents).
func (s *Syncer) expected(mc *ModelCache, resolved []ResolvedSource) []PeerSet {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []PeerSet
	for _, e := range resolved {
		m, ok := s.origins[mc.Name+"/"+e.Artifact]
		if !ok || len(e.OriginNodes) == 0 || !slices.Equal(m.nodes, e.OriginNodes) || len(m.cand) == 0 {
			continue
		}
		out = append(out, PeerSet{Artifact: e.Artifact, Revision: e.Revision, Phase: string(api.PhasePending), Nodes: slices.Clone(m.cand)})
	}
	return out
}

// selectedNodes are the names of the Nodes mc selects: one LIST with its
// selector (served from the API server's watch cache).
func (s *Syncer) selectedNodes(ctx context.Context, mc *ModelCache) (map[string]bool, error) {
	opts := metav1.ListOptions{ResourceVersion: "0"}
	if mc.Spec.NodeSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(mc.Spec.NodeSelector)
		if err != nil {
			return nil, err
		}
		opts.LabelSelector = sel.String()
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	list, err := s.core.Nodes().List(ctx, opts)
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool, len(list.Items))
	for _, n := range list.Items {
		out[n.Name] = true
	}
	return out, nil
}

// ownOriginsOnly is resolved without the origin-node lists the leader
// did not assign (own: its last assignment of an artifact; trust.go):
// with no live node, or nothing to pull, it would assign none.
func ownOriginsOnly(resolved []ResolvedSource, own func(artifact string) []string) []ResolvedSource {
	var out []ResolvedSource
	for i, e := range resolved {
		if len(e.OriginNodes) == 0 || slices.Equal(own(e.Artifact), e.OriginNodes) {
			continue
		}
		if out == nil {
			out = slices.Clone(resolved)
		}
		out[i].OriginNodes = nil
	}
	if out == nil {
		return resolved
	}
	return out
}
