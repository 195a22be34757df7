// Package fanout is a node's part in fan-out between the daemons of a
// fleet (docs/fan-out.md): the peer port, which
// serves this node's blobs to the daemons it authorizes (Authz), and the
// fetch of a blob of known digest and size from the peers that hold it
// before the origin (Fleet.Fetch), planned from the cluster's
// ModelCacheNode statuses or a static list (Fleet.Plan).
//
// It holds no daemon: what it needs of the rest it is given as small
// values and interfaces — the store's blobs and versions (a
// *cachestore.Store: BlobStore), what the desires say of each artifact
// (Accesses, published by the daemon on each change, so that the peer
// port takes no daemon lock per request), the cluster's statuses
// (Fleet.SetNodes, from k8ssync), and, for each blob, a Transfer: the
// desire as it stands, the partial ingest and the origin, and the pull's
// slot, given back while it waits. A simulation drives Plan and Fetch
// the same way, many Fleets in one process.
//
// Where to find what, by file:
//
//	fleet.go    Fleet: New, the peer port (Serve), the statuses (SetNodes)
//	config.go   Config (the --peer-* flags), its defaults and validation
//	plan.go     where a blob comes from now (Plan): the peers to ask, the
//	            nodes that go to the origin first; the wait for a peer
//	fetch.go    one blob's fetch (Fetch of a Transfer): plan, ask, wait, again
//	authz.go    Authz: which node may have which blob on the peer port; the
//	            blob → artifacts index it reads; Accesses (the desires' say)
//
// Its benchmark, BenchmarkFleetBytes (make bench-fleet), runs the fleet
// simulation of fleetsim_test.go: many Fleets in one process, each with
// its own store, loopback address, link and k8ssync loop, one throttled
// origin, against a real kube-apiserver (fleet_bench_test.go).
//
// Locks: Fleet.mu and Authz.mu guard their own state, are never held
// together, and are taken with no caller's lock held; under them only
// the store's own locks are taken.
package fanout
