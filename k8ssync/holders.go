package k8ssync

import (
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Who holds what, without every daemon watching every node.
//
// Fan-out needs, on each node, the nodes that hold or fetch a revision
// and where they serve blobs. Were every daemon to watch every
// ModelCacheNode, each status write would reach every daemon: N² events
// for a rollout of N nodes. Instead the elected daemon, which watches the
// ModelCacheNodes anyway to count them, publishes the nodes of each
// revision in the ModelCache's status (status.peers, peerAddresses), at
// most once per Config.PublishInterval per ModelCache; every daemon reads
// them from the ModelCaches it watches anyway (a few objects). A status
// write reaches one watcher (the elected daemon), and each daemon
// receives at most one ModelCache update per PublishInterval per
// ModelCache it watches, however large the fleet (Kraken's tracker
// answers its agents the same way, every few seconds).
//
// The chosen alternative to the origin nodes learning their downloaders
// from their requests: it tells who holds a blob only to the nodes a node
// talks to, while a waiting node needs the holders it has never talked
// to; one object per ModelCache keeps the answer where the desire already
// is.

// MaxPeerStatusBytes bounds status.peers and peerAddresses together (the
// API server refuses an object over about 1.5 MB): beyond it the largest
// lists are cut (a waiting node asks at most 8 peers of a blob; the cut
// lists still name hundreds).
const MaxPeerStatusBytes = 384 << 10

// peerSets are mc's status.peers and peerAddresses from the nodes'
// statuses at now: each artifact of mc on each live node with a peer
// port (Live), its current version and its prefetch, grouped by
// (artifact, revision, digest, phase, next), sorted; and the addresses of
// those nodes and of the live origin nodes recorded with its resolutions
// (origins), listed or not (a recorded node that never pulls must still
// be asked, to be found gone); and, of each set in expect, the live
// nodes whose status does not list its artifact yet, as its phase at its
// revision (the nodes about to pull a resolution: Syncer.expected).
func peerSets(mc *ModelCache, nodes []ModelCacheNode, origins []string, expect []PeerSet, now time.Time) ([]PeerSet, []PeerAddress) {
	type key struct {
		artifact, revision, digest, phase string
		next                              bool
	}
	sets := map[key][]string{}
	addr := map[string]string{}
	for _, n := range nodes {
		if !Live(n, now) {
			continue
		}
		if slices.Contains(origins, n.Name) {
			addr[n.Name] = clip(n.Status.PeerAddress, MaxStatusField)
		}
		for _, a := range n.Status.Artifacts {
			if a.ModelCache != mc.Name {
				continue
			}
			addr[n.Name] = clip(n.Status.PeerAddress, MaxStatusField)
			k := key{clip(a.Name, MaxStatusField), clip(a.Revision, MaxStatusField), clip(a.Digest, MaxStatusField), clip(a.Phase, MaxStatusField), false}
			sets[k] = append(sets[k], n.Name)
			if x := a.Next; x != nil {
				k := key{k.artifact, clip(x.Revision, MaxStatusField), clip(x.Digest, MaxStatusField), clip(x.Phase, MaxStatusField), true}
				sets[k] = append(sets[k], n.Name)
			}
		}
	}
	for _, e := range expect {
		listed := map[string]bool{}
		for k, ns := range sets {
			if k.artifact == e.Artifact {
				for _, n := range ns {
					listed[n] = true
				}
			}
		}
		k := key{clip(e.Artifact, MaxStatusField), clip(e.Revision, MaxStatusField), "", clip(e.Phase, MaxStatusField), false}
		want := map[string]bool{}
		for _, n := range e.Nodes {
			want[n] = true
		}
		for _, n := range nodes {
			if !listed[n.Name] && want[n.Name] && Live(n, now) {
				addr[n.Name] = clip(n.Status.PeerAddress, MaxStatusField)
				sets[k] = append(sets[k], n.Name)
			}
		}
	}
	if len(sets) == 0 && len(addr) == 0 {
		return nil, nil
	}
	var out []PeerSet
	for k, ns := range sets {
		slices.Sort(ns)
		out = append(out, PeerSet{Artifact: k.artifact, Revision: k.revision, Digest: k.digest, Phase: k.phase, Next: k.next, Nodes: slices.Compact(ns)})
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Artifact != b.Artifact {
			return a.Artifact < b.Artifact
		}
		if a.Next != b.Next {
			return !a.Next
		}
		return a.Revision+"\x00"+a.Digest+"\x00"+a.Phase < b.Revision+"\x00"+b.Digest+"\x00"+b.Phase
	})
	// Cut the largest list by half until the whole fits.
	for jsonSize(out)+jsonSize(addr) > MaxPeerStatusBytes {
		big := 0
		for i := range out {
			if len(out[i].Nodes) > len(out[big].Nodes) {
				big = i
			}
		}
		if len(out[big].Nodes) <= 1 {
			break
		}
		if out[big].Total == 0 {
			out[big].Total = len(out[big].Nodes)
		}
		out[big].Nodes = out[big].Nodes[:len(out[big].Nodes)/2]
		listed := map[string]bool{}
		for _, s := range out {
			for _, n := range s.Nodes {
				listed[n] = true
			}
		}
		for n := range addr {
			if !listed[n] && !slices.Contains(origins, n) {
				delete(addr, n)
			}
		}
	}
	addrs := make([]PeerAddress, 0, len(addr))
	for n, a := range addr {
		addrs = append(addrs, PeerAddress{Node: n, Address: a})
	}
	sort.Slice(addrs, func(i, j int) bool { return addrs[i].Node < addrs[j].Node })
	return out, addrs
}

// PeerView is what the fan-out planner reads of the cluster, as
// ModelCacheNodes (Node.SetPeerNodes): the nodes the ModelCaches' status.peers
// list, each with its peer address and the artifacts it is listed for
// (name, phase, revision, digest, next), and self with what its own
// status says now. Their heartbeat is now: the elected daemon lists only
// live nodes.
func PeerView(mcs []*ModelCache, self string, own ModelCacheNodeStatus, now time.Time) []ModelCacheNode {
	byName := map[string]*ModelCacheNode{}
	var order []string
	get := func(name, addr string) *ModelCacheNode {
		n := byName[name]
		if n == nil {
			n = &ModelCacheNode{Status: ModelCacheNodeStatus{PeerAddress: addr, Heartbeat: metav1.NewTime(now)}}
			n.Name = name
			byName[name] = n
			order = append(order, name)
		}
		return n
	}
	for _, mc := range mcs {
		addr := map[string]string{}
		for _, a := range mc.Status.PeerAddresses {
			addr[a.Node] = a.Address
			if a.Node != self && a.Address != "" {
				get(a.Node, a.Address) // listed or not: a recorded origin node
			}
		}
		for _, set := range mc.Status.Peers {
			for _, name := range set.Nodes {
				if name == self || addr[name] == "" {
					continue
				}
				n := get(name, addr[name])
				i := slices.IndexFunc(n.Status.Artifacts, func(a ArtifactStatus) bool { return a.Name == set.Artifact })
				if i < 0 {
					n.Status.Artifacts = append(n.Status.Artifacts, ArtifactStatus{Name: set.Artifact, ModelCache: mc.Name})
					i = len(n.Status.Artifacts) - 1
				}
				a := &n.Status.Artifacts[i]
				if set.Next {
					a.Next = &NextStatus{Revision: set.Revision, Phase: set.Phase, Digest: set.Digest}
				} else {
					a.Phase, a.Revision, a.Digest = set.Phase, set.Revision, set.Digest
				}
			}
		}
	}
	me := get(self, own.PeerAddress)
	for _, a := range own.Artifacts {
		as := ArtifactStatus{Name: a.Name, ModelCache: a.ModelCache, Phase: a.Phase, Revision: a.Revision, Digest: a.Digest}
		if x := a.Next; x != nil {
			as.Next = &NextStatus{Revision: x.Revision, Phase: x.Phase, Digest: x.Digest}
		}
		me.Status.Artifacts = append(me.Status.Artifacts, as)
	}
	sort.Strings(order)
	out := make([]ModelCacheNode, 0, len(order))
	for _, name := range order {
		out = append(out, *byName[name])
	}
	return out
}

// peerRefresh: the view is handed over again at least this often, though
// unchanged, so that the planner never finds its heartbeats past
// PeerStale.
const peerRefresh = 10 * time.Minute

// handPeers hands the daemon the peer view of mcs (PeerView) when it
// changed since the last hand-over, or peerRefresh passed.
func (s *Syncer) handPeers(mcs []*ModelCache) {
	s.mu.Lock()
	own := s.ownStatus
	s.mu.Unlock()
	own.PeerAddress = clip(s.cfg.PeerAddress, MaxStatusField)
	now := time.Now()
	view := PeerView(mcs, s.cfg.NodeName, own, now)
	var b strings.Builder
	for _, n := range view {
		n.Status.Heartbeat = metav1.Time{}
		j, _ := json.Marshal(n)
		b.Write(j)
	}
	key := b.String()
	s.mu.Lock()
	if key == s.peersKey && now.Sub(s.peersAt) < peerRefresh {
		s.mu.Unlock()
		return
	}
	s.peersKey, s.peersAt = key, now
	s.mu.Unlock()
	s.node.SetPeerNodes(view)
}
