package daemon

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/csi"
	"github.com/modelcache/modelcache/daemon/capacity"
	"github.com/modelcache/modelcache/daemon/fanout"
	"github.com/modelcache/modelcache/daemon/kernels"
	"github.com/modelcache/modelcache/daemon/sources"
	"github.com/modelcache/modelcache/fetchers"
)

// Daemon is one modelcached. Create it with New, run it with Run.
//
// Locks, in the order they are taken (a lock is never taken while one
// after it in this list is held):
//
//	space.capMu → space.evictMu → desires.writeMu → mu → leaf locks;  space.scanRun → space.scanMu
//
// The leaf locks (sources.Set.mu, leaseSet.mu, csiVolumes.mu, warming.mu,
// space.scanMu, fanout.Fleet.mu) guard their component's own state and are
// never held together or while another lock is taken. treeModes.mu and
// fanout.Authz.mu are taken with no other lock held; under them only the
// store's own locks are. The peer port takes no daemon lock: it reads the
// desires' access from desireSet.access, which publish replaces under mu.
//
// mu, the daemon lock (shared.mu: the views and the evictions share it
// by pointer; the components take it only inside the functions New gives
// them, such as the merged desires or a wake-up), guards the in-memory
// state that API reads join (desires, artifact states, pod holders,
// flights) and is held only for memory: no index write (an fsync), tree
// removal or eviction runs under it. Writers of desires take
// desires.writeMu first, write the index, then take mu to change memory.
// The store and the capacity package take their own locks below all of
// these.
type Daemon struct {
	// Set once in New, read without a lock.
	cfg     Config
	log     *slog.Logger
	store   *cachestore.Store
	records *cachestore.Records
	sources *sources.Set // fetchers, credentials, who file:// reads as (package sources)
	metrics *metrics
	limiter *rate.Limiter // --bandwidth-limit, nil when unlimited
	started time.Time
	gid     int              // the socket group's, -1 when none
	backoff fetchers.Backoff // of each request of a pull
	leases  *leaseSet        // modelctl lease (inuse.go)
	modes   *treeModes       // the version trees' modes, as their desires want them (tenancy.go)
	csi     *csiVolumes      // the volumes pods hold (csi.go)
	warming *warming         // reads what pods are about to load into the page cache (warming.go)
	kernels *kernels.Set     // GPUs, kernel cache signatures and compatibility (package kernels)
	space   *space           // admission, eviction passes, the /proc scan (admission.go)
	fanout  *fanout.Fleet    // the peer port and fetches from peers; nil when off (package fanout)
	pullSem chan struct{}    // the node's pull slots (slot.go)
	wake    chan struct{}    // kicks the reconciler
	pulls   sync.WaitGroup   // pulls in flight; Run waits for them

	// desires: the socket's, the models dir's and the cluster's
	// (desires.go); its maps are read under mu.
	desires *desireSet
	shared  // mu, the daemon lock, and the state under it

	metricsAddr atomic.Value                 // string: where /metrics listens once Run serves
	peers       atomic.Pointer[peerListener] // the API socket's, once Run serves
}

// shared is the state that API reads join, under mu, the daemon lock:
// the Daemon embeds it, and the views and the evictions share it by
// pointer.
type shared struct {
	mu sync.Mutex
	// podHolders are running pods that mount artifacts; podNames maps the
	// UIDs of the pods on this node to "namespace/name".
	podHolders map[string][]api.Holder
	podNames   map[string]string
	fileErrors []string
	arts       pullStates                  // what is known of each artifact beyond the index (pullstates.go)
	flights    map[string]*flight          // one download per blob (download.go)
	changed    chan struct{}               // closed and replaced on every state change
	evicted    map[string]api.EvictionNote // ad-hoc entries evicted to make room (evict.go)
}

// MetricsAddr is the address /metrics listens on, "" before Run serves it.
func (d *Daemon) MetricsAddr() string {
	s, _ := d.metricsAddr.Load().(string)
	return s
}

// Store is the daemon's store (for tests and tools in this module).
func (d *Daemon) Store() *cachestore.Store { return d.store }

func (d *Daemon) healthy() error {
	return d.store.Check()
}

// Changed returns a channel closed at the next change of any artifact.
func (d *Daemon) Changed() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.changed
}

// notify wakes every waiter; called with mu held.
func (s *shared) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// kick asks the reconciler for a pass now.
func (d *Daemon) kick() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// inUse merges live leases and the last /proc scan, by version key.
func (d *Daemon) inUse() map[string][]api.Holder {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.inUseLocked()
}

// inUseLocked is inUse with d.mu held (d.mu before scanMu, never after).
func (d *Daemon) inUseLocked() map[string][]api.Holder {
	out := map[string][]api.Holder{}
	d.leases.uses(out)
	d.podUses(out)
	d.csi.uses(out, d.podNames)
	d.space.scanned(out)
	return out
}

// podUses adds pod holders to an in-use map (name@rev keys); a pod holds
// the version that is current (what its mount resolves to). Called with
// d.mu held.
func (d *Daemon) podUses(out map[string][]api.Holder) {
	for name, hs := range d.podHolders {
		a, err := d.store.Summary(name)
		if err != nil || a.Current == "" {
			continue
		}
		for _, h := range hs {
			k := capacity.Key(name, a.Current)
			out[k] = appendHolder(out[k], api.Holder{Kind: h.Kind, ID: h.ID, Revision: a.Current})
		}
	}
}

// CSIBackend is what csi.New needs of the daemon (Run uses it; tests too).
func (d *Daemon) CSIBackend() csi.Backend { return d.csi }
