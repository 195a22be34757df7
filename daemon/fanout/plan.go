package fanout

import (
	"context"
	"slices"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/k8ssync"
	p2p "github.com/modelcache/modelcache/peer"
)

// Plan is where one blob of a pull is fetched from now.
type Plan struct {
	Peers  []string  // whom to ask, in order (base URLs)
	Origin bool      // the origin may be asked (after the peers)
	First  []string  // the nodes that go to the origin first (a cluster's)
	Until  time.Time // when this node's wait for a peer ends (--peer-wait; a static fleet's Settle): past it, it goes to the origin within the cap (Fleet.Plan)
	// Hold is until when a peer may hold this node's ask (p2p.Blob.Wait):
	// Until, or sooner when the plan may let this node go to the origin
	// with no change of the statuses (a first node whose Settle has not
	// passed: at its end; not listed yet: now, for only a status change
	// settles it; now, too, when a peer holds the revision Ready: it
	// answers at once, and an ask held at a peer before it would wait
	// for nothing); past Until, for a node beyond the cap, p2p.MaxWait
	// from now (only a change of the statuses can let it go to the
	// origin). A held ask does not see the plan change: held past
	// this, the first nodes would all wait on each other.
	Hold time.Time
}

// Plan says where the blobs of ds at revision (the pull's resolution:
// the cluster's) come from for a pull that started at started.
//
// The first nodes go to the origin, each for the blobs it owns among
// them (rendezvous hashing of (artifact, blob)); every other node asks
// its peers, the first nodes first (the blob's owner before the others:
// it is the one fetching that blob). Once Wait has passed, the cap still
// holds, per blob, in a cluster: at most OriginConcurrency nodes fetch a
// blob from the origin (until a second --peer-wait passes: then any node
// may), the first nodes that still want the revision
// and, in the slots they leave, the other nodes that want it, ranked by
// the blob's hash (pastWait); a node beyond the cap keeps asking its
// peers, its ask held at the first. A first node whose peer port was set aside for
// anything but being busy or its source failing it (no connection, wrong bytes, a stall) is
// passed over: its share moves to the others at this node's next plan,
// and what a peer port did is learned once per node, by whichever of
// this node's fetches asked it.
//
// In a cluster the first nodes are the origin nodes the cluster recorded
// (ds.OriginNodes) less those passed over (clusterPeers); when it
// recorded none, or none is left, the first OriginConcurrency of the
// nodes that want it (rendezvous hashing of (artifact, node): every node
// ranks them alike), and then only once this node's own status has
// listed it for Settle (so that the statuses of the nodes that wanted it
// at about the same moment have landed too).
//
// In a cluster each blob has a tree (treeParents): its owner at the root,
// then the nodes that want or hold the revision, each streaming the blob
// from its parent as it lands there. A node asks its parent first (the
// ask held there until the parent has bytes to send: Hold is not cut
// short for a holder further down), then its parent's parent and the
// root, then the other first nodes, the peers that hold the revision
// Ready and those fetching it, at most MaxPeersAsked in all. So a node
// receives each blob once and sends it on about once, whatever the
// fleet's size, and no node is asked by more than a few.
//
// A static fleet cannot tell who wants what: its first nodes are the
// first OriginConcurrency of the whole list (this node included) by the
// same hash, so that nodes that start at once do not all go to the
// origin; a node that owns no blob goes to the origin once Settle has
// passed since its pull started (a lone pull waits no longer for a peer
// that does not want the artifact).
func (f *Fleet) Plan(ds api.Desire, revision, digest string, started, now time.Time) Plan {
	pl := Plan{Until: started.Add(f.cfg.Wait)}
	var addr map[string]string // node → base URL
	var rest []string          // the peers after the first nodes, in order
	var members []string       // the nodes that want it (a cluster's)
	var holders []string       // the nodes that hold it Ready (a cluster's)
	settled := false
	if !f.cluster {
		addr = map[string]string{}
		for _, b := range f.static {
			addr[b] = b
		}
		all := rendezvous(ds.Name, append([]string{f.self}, f.static...))
		all = slices.DeleteFunc(all, func(n string) bool { return n != f.self && f.passedOver(n) })
		pl.First = all[:min(len(all), f.cfg.OriginConcurrency)]
		rest = rendezvous(f.self, f.static)
		settled = true
		if grace := started.Add(f.cfg.Settle); grace.Before(pl.Until) {
			pl.Until = grace
		}
	} else {
		var passed map[string]bool
		var listed bool
		rest, holders, members, passed, listed, addr = f.clusterPeers(ds, revision, now)
		for _, n := range recordedOrigins(ds) {
			if !passed[n] && !slices.Contains(pl.First, n) {
				pl.First = append(pl.First, n)
			}
		}
		settled = len(pl.First) > 0
		if !settled {
			pl.First = rendezvous(ds.Name, members)
			pl.First = pl.First[:min(len(pl.First), f.cfg.OriginConcurrency)]
		}
		key := ds.Name + "@" + revision
		f.mu.Lock()
		since, ok := f.listed[key]
		switch {
		case !listed:
			delete(f.listed, key)
		case !ok:
			f.listed[key], since = now, now
		}
		f.mu.Unlock()
		settled = settled || (listed && now.Sub(since) >= f.cfg.Settle)
		if !settled && slices.Contains(pl.First, f.self) && pl.Hold.IsZero() {
			pl.Hold = now // its own status settles it: hold no ask
			if listed {
				pl.Hold = since.Add(f.cfg.Settle)
			}
		}
	}
	owners := rendezvous(ds.Name+"\x00"+digest, pl.First)
	if len(owners) > 0 && f.cluster {
		f.askParents(&pl, ds.Name+"\x00"+digest, owners[0], members, holders, addr, now)
	} else if len(holders) > 0 {
		pl.Hold = now // a holder answers at once: a held ask would wait at the peer asked before it
	}
	for _, n := range owners {
		if b := addr[n]; b != "" && n != f.self && !slices.Contains(pl.Peers, b) && len(pl.Peers) < MaxPeersAsked {
			pl.Peers = append(pl.Peers, b)
		}
	}
	for _, b := range rest {
		if !slices.Contains(pl.Peers, b) && len(pl.Peers) < MaxPeersAsked {
			pl.Peers = append(pl.Peers, b)
		}
	}
	pl.Origin = settled && len(owners) > 0 && owners[0] == f.self
	switch {
	case now.Before(pl.Until):
	case !f.cluster:
		pl.Origin = true // a static fleet cannot tell who wants the artifact
	case !pl.Origin && slices.Contains(f.pastWait(ds.Name+"\x00"+digest, pl.First, members), f.self):
		pl.Origin = true
	case !pl.Origin && !now.Before(started.Add(2*f.cfg.Wait)):
		// A second --peer-wait passed and the nodes holding the slots
		// have not delivered: one that lists the revision Downloading
		// and never sends (a wedged daemon, a forged status) stalls the
		// others at most this long.
		pl.Origin = true
	case !pl.Origin:
		// Past --peer-wait, beyond the cap: only a change of the
		// statuses (a slot given up) lets this node go to the origin.
		if pl.Hold.IsZero() {
			pl.Hold = now.Add(p2p.MaxWait)
		}
		return pl
	}
	if pl.Hold.IsZero() || pl.Until.Before(pl.Hold) {
		pl.Hold = pl.Until
	}
	return pl
}

// pastWait is the nodes that may fetch a blob from the origin once a
// node's --peer-wait has passed (key: the artifact and the blob), at
// most OriginConcurrency of them: the first nodes that still want the
// revision (members), ranked by the blob's hash, then the other members
// by the same hash. A first node that no longer wants it, or that was
// passed over, gives its slot up; while it is alive and wants it, it
// keeps it, and a node past its wait asks it (and the other peers)
// again rather than the origin.
func (f *Fleet) pastWait(key string, first, members []string) []string {
	var firsts, others []string
	for _, n := range members {
		if slices.Contains(first, n) {
			firsts = append(firsts, n)
		} else {
			others = append(others, n)
		}
	}
	slots := append(rendezvous(key, firsts), rendezvous(key, others)...)
	return slots[:min(len(slots), f.cfg.OriginConcurrency)]
}

// passedOver says whether the peer port at base URL b was set aside for
// anything but being busy or a streamed answer cut short (its own
// source failed it, p2p.HeaderStreamed): no connection (a daemon gone while its status
// still looks fresh, for the status is written hourly at least), bytes
// that failed the check, a stall, a refusal of this node's token.
func (f *Fleet) passedOver(b string) bool {
	if f.fetcher == nil {
		return false
	}
	avoided, why := f.fetcher.Avoided(b)
	return avoided && why != p2p.AvoidBusy && why != p2p.AvoidStreamEnded
}

// clusterPeers reads the statuses: the base URLs of the nodes that hold
// revision of ds Ready (peer.Pick's order; ready of them), then of those
// downloading it (they serve the blobs they are fetching); the names of the nodes
// that want it and have not failed it, this one included; the nodes an
// origin node must not be: those whose status is stale or has no peer
// address, that failed it, or that were handed over once and are gone
// since (a node never seen, or seen without a status, is not passed over:
// its status may not have reached this one yet, while the elected daemon
// saw it live), and those whose peer port was set aside (passedOver);
// whether this node's own status lists it; and the base URL of each node
// with a fresh status.
func (f *Fleet) clusterPeers(ds api.Desire, revision string, now time.Time) (peers, holders, members []string, passed map[string]bool, listed bool, addr map[string]string) {
	f.mu.Lock()
	nodes := f.nodes
	passed = map[string]bool{}
	for n := range f.seen {
		passed[n] = n != f.self
	}
	f.mu.Unlock()
	addr = map[string]string{}
	for _, n := range nodes {
		if b, err := PeerBase(n.Status.PeerAddress); err == nil && now.Sub(n.Status.Heartbeat.Time) <= peerStale {
			addr[n.Name] = b
			delete(passed, n.Name)
		} else if n.Status.Heartbeat.IsZero() {
			delete(passed, n.Name) // created, its status not written yet (or not yet here)
		}
	}
	q := p2p.PickQuery{Self: f.self, Artifact: ds.Name, Revision: revision, Digest: ds.Digest,
		Now: now, MaxAge: peerStale, Max: MaxPeersAsked, Addr: func(n string) (string, bool) { b, ok := addr[n]; return b, ok }}
	peers = p2p.Pick(nodes, q)
	members = []string{f.self}
	var fetching []string
	for _, n := range nodes {
		if n.Name != f.self && addr[n.Name] != "" && p2p.Holds(n.Status.Artifacts, q) {
			holders = append(holders, n.Name)
			continue
		}
		for _, a := range n.Status.Artifacts {
			if a.Name != ds.Name {
				continue
			}
			if n.Name == f.self {
				listed = true
				continue
			}
			if addr[n.Name] == "" {
				continue
			}
			phase := a.Phase
			if a.Next != nil && a.Next.Revision == revision {
				phase = a.Next.Phase
			}
			switch api.Phase(phase) {
			case api.PhasePending:
				members = append(members, n.Name)
			case api.PhaseDownloading:
				members = append(members, n.Name)
				fetching = append(fetching, n.Name)
			case api.PhaseFailed:
				passed[n.Name] = true
			}
		}
	}
	for _, n := range rendezvous(f.self, fetching) {
		if b := addr[n]; b != "" && n != f.self && !slices.Contains(peers, b) && len(peers) < MaxPeersAsked {
			peers = append(peers, b)
		}
	}
	// Only the nodes that could go to the origin are looked up (not every
	// node of the cluster: this runs at each plan of each waiting file).
	for _, n := range append(slices.Clone(members), recordedOrigins(ds)...) {
		if b := addr[n]; b != "" && n != f.self && f.passedOver(b) {
			passed[n] = true
		}
	}
	members = slices.DeleteFunc(members, func(n string) bool { return passed[n] })
	holders = slices.DeleteFunc(holders, func(n string) bool { return f.passedOver(addr[n]) })
	return peers, holders, members, passed, listed, addr
}

// askParents puts this node's parent in the blob's tree (key), its
// parent's and the tree's root (owner) first among the peers pl asks.
// The ask is held at its parent, not answered at once by a holder
// further down: the parent streams the blob as it lands there, or holds
// it. A first node asks as it did (a holder among its peers: at once).
func (f *Fleet) askParents(pl *Plan, key, owner string, members, holders []string, addr map[string]string, now time.Time) {
	parents := treeParents(key, owner, f.self, append(slices.Clone(members), holders...))
	if (len(parents) == 0 || slices.Contains(pl.First, f.self)) && len(holders) > 0 {
		pl.Hold = now // a holder answers at once: a held ask would wait at the peer asked before it
	}
	if len(parents) > 3 {
		parents = append(parents[:2:2], parents[len(parents)-1]) // its parent, the one before it, the root
	}
	for _, n := range parents {
		if b := addr[n]; b != "" && !slices.Contains(pl.Peers, b) {
			pl.Peers = append(pl.Peers, b)
		}
	}
}

// treeChain is the most nodes a blob crosses in a row of its tree,
// one after the other, behind its root.
const treeChain = 32

// treeParents is self's parent in the tree of one blob (key: the
// artifact and the blob), its parent's, and so on up to root (the node
// that fetches the blob from the origin). The tree lays root, then the
// nodes (those that want the revision and those that hold it, ranked by
// the key's hash) out in rows of S = ⌈n/treeChain⌉: the first row is a
// chain from root, and each later node streams from the one a row
// before it. So nearly every node sends each blob on once, as much as it
// receives (only the first row's nodes send it to two, and each blob
// ranks another first row), root's uplink carries each blob once, and a
// blob crosses at most S + treeChain nodes (a chain of n up to 32
// nodes, 64 at 1,000). Every node ranks them alike, and a parent always
// ranks before its child: a node that sees fewer or more nodes than
// another may pick another parent, never one that waits on it. Nil when
// self is root or none.
func treeParents(key, root, self string, nodes []string) []string {
	order := append([]string{root}, rendezvous(key, slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return n == root }))...)
	row := max(1, (len(order)-1+treeChain-1)/treeChain)
	i := slices.Index(order, self)
	var out []string
	for i > 0 {
		if i > row {
			i -= row
		} else {
			i--
		}
		out = append(out, order[i])
	}
	return out
}

// rendezvous orders items by the hash of (key, item) (k8ssync.Rendezvous:
// the elected daemon ranks origin nodes by the same hash).
var rendezvous = k8ssync.Rendezvous

// changes is a channel closed at the next change of the statuses.
func (f *Fleet) changes() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

// wait blocks until next, or until until if that is sooner; when wake
// is set (the round asked nobody: a change may bring a peer), a change
// of the statuses (changed) ends it sooner too. idle runs the wait (the
// pull's slot is free meanwhile).
func (f *Fleet) wait(ctx context.Context, idle func(context.Context, func() error) error, changed <-chan struct{}, wake bool, next, until time.Time) error {
	if idle == nil {
		idle = func(_ context.Context, fn func() error) error { return fn() }
	}
	if until.Before(next) {
		next = until
	}
	if !wake {
		changed = nil // a nil channel never fires
	}
	return idle(ctx, func() error {
		t := time.NewTimer(max(time.Until(next), 0))
		defer t.Stop()
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	})
}

// recordedOrigins is the origin nodes recorded with the desire's
// resolution, at most k8ssync.MaxOriginNodes of them (a longer record is
// not the elected daemon's).
func recordedOrigins(ds api.Desire) []string {
	return ds.OriginNodes[:min(len(ds.OriginNodes), k8ssync.MaxOriginNodes)]
}
