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
	Until  time.Time // when this node goes to the origin whatever happens
}

// Plan says where the blobs of ds at revision (the pull's resolution:
// the cluster's) come from for a pull that started at started. In a
// static fleet: every peer (one that lacks a blob answers 404), then the
// origin. In a cluster: the peers that hold its revision Ready, then
// those fetching it; the origin for the blobs this node owns among the
// first nodes (rendezvous hashing of (artifact, blob)), or for every blob
// once Wait has passed. The first nodes are the origin nodes the cluster
// recorded (ds.OriginNodes) less those passed over (clusterPeers);
// when it recorded none, or none is left, the first OriginConcurrency of
// the nodes that want it (rendezvous hashing of (artifact, node): every
// node ranks them alike), and then only once this node's own status has
// listed it for Settle (so that the statuses of the nodes that wanted it
// at about the same moment have landed too).
func (f *Fleet) Plan(ds api.Desire, revision, digest string, started, now time.Time) Plan {
	pl := Plan{Until: started.Add(f.cfg.Wait)}
	if !f.cluster {
		pl.Peers, pl.Origin = rendezvous(f.self, f.static), true
		return pl
	}
	var members []string
	var passed map[string]bool
	var listed bool
	pl.Peers, members, passed, listed = f.clusterPeers(ds, revision, now)
	for _, n := range recordedOrigins(ds) {
		if !passed[n] && !slices.Contains(pl.First, n) {
			pl.First = append(pl.First, n)
		}
	}
	settled := len(pl.First) > 0
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
	owner := rendezvous(ds.Name+"\x00"+digest, pl.First)
	pl.Origin = (settled && len(owner) > 0 && owner[0] == f.self) || !now.Before(pl.Until)
	return pl
}

// clusterPeers reads the statuses: the base URLs of the nodes that hold
// revision of ds Ready (peer.Pick's order), then of those downloading it
// (they serve the blobs they have committed); the names of the nodes
// that want it and have not failed it, this one included; the nodes an
// origin node must not be: those whose status is stale or has no peer
// address, that failed it, or that were handed over once and are gone
// since (a node never seen, or seen without a status, is not passed over:
// its status may not have reached this one yet, while the elected daemon
// saw it live), and those whose peer port took no connection when this
// node last asked it (set aside for "network": a daemon gone while its
// status still looks fresh, for the status is written hourly at least);
// and whether this node's own status lists it. The recorded origin nodes
// are asked with the peers (a 404 costs one request a poll) so that a
// gone one is found.
func (f *Fleet) clusterPeers(ds api.Desire, revision string, now time.Time) (peers, members []string, passed map[string]bool, listed bool) {
	f.mu.Lock()
	nodes := f.nodes
	passed = map[string]bool{}
	for n := range f.seen {
		passed[n] = n != f.self
	}
	f.mu.Unlock()
	addr := map[string]string{}
	for _, n := range nodes {
		if b, err := PeerBase(n.Status.PeerAddress); err == nil && now.Sub(n.Status.Heartbeat.Time) <= peerStale {
			addr[n.Name] = b
			delete(passed, n.Name)
		} else if n.Status.Heartbeat.IsZero() {
			delete(passed, n.Name) // created, its status not written yet (or not yet here)
		}
	}
	peers = p2p.Pick(nodes, p2p.PickQuery{Self: f.self, Artifact: ds.Name, Revision: revision, Digest: ds.Digest,
		Now: now, MaxAge: peerStale, Max: MaxPeersAsked, Addr: func(n string) (string, bool) { b, ok := addr[n]; return b, ok }})
	members = []string{f.self}
	var fetching []string
	for _, n := range nodes {
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
	for _, n := range append(rendezvous(f.self, fetching), recordedOrigins(ds)...) {
		if b := addr[n]; b != "" && n != f.self && !slices.Contains(peers, b) && len(peers) < MaxPeersAsked {
			peers = append(peers, b)
		}
	}
	// Only the nodes that could go to the origin are looked up (not every
	// node of the cluster: this runs at each poll of each waiting file).
	for _, n := range append(slices.Clone(members), recordedOrigins(ds)...) {
		if b := addr[n]; b != "" && f.fetcher != nil && n != f.self {
			if avoided, why := f.fetcher.Avoided(b); avoided && why == p2p.AvoidNetwork {
				passed[n] = true
			}
		}
	}
	members = slices.DeleteFunc(members, func(n string) bool { return passed[n] })
	return peers, members, passed, listed
}

// rendezvous orders items by the hash of (key, item) (k8ssync.Rendezvous:
// the elected daemon ranks origin nodes by the same hash).
var rendezvous = k8ssync.Rendezvous

// wait blocks until the statuses change, Poll passes, or until; idle
// runs the wait (the pull's slot is free meanwhile).
func (f *Fleet) wait(ctx context.Context, idle func(context.Context, func() error) error, until time.Time) error {
	f.mu.Lock()
	changed := f.changed
	f.mu.Unlock()
	if idle == nil {
		idle = func(_ context.Context, fn func() error) error { return fn() }
	}
	return idle(ctx, func() error {
		t := time.NewTimer(min(f.cfg.Poll, max(time.Until(until), 0)))
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
