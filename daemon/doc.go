// Package daemon is modelcached: it merges desires (the socket API, YAML
// files in the models dir, ModelCache objects from the cluster) into one
// desired set, reconciles it against the store (pull what is present and
// missing, evict what is absent, retry failures with backoff), schedules
// pulls (bounded concurrency, one download per blob however many
// artifacts want it), and serves the socket API, Prometheus metrics and
// systemd notifications.
//
// The daemon is a few components, each owning its state (and, where it
// has one, its lock), wired by New and served by Run (docs/architecture.md
// draws them, with one pull and one fan-out transfer):
//
//	desireSet   the desires by origin (socket, models dir, cluster), merged;
//	            their persistence and the writers' lock
//	sources     fetchers, fetchers made with credentials, the cluster's credentials,
//	            who file:// reads as (package daemon/sources: sources.Set)
//	kernels     the GPU inventory; kernel cache signatures and compatibility
//	            (package daemon/kernels: kernels.Set)
//	space       admission (reservations), eviction passes (capacity.Evictor),
//	            partial downloads reclaimed, the /proc scan
//	leaseSet    modelctl lease
//	csiVolumes  the volumes pods hold (csi.Backend); the desires, views and
//	            wake-ups through volumeHost; the layers kept for capture (keptLayers)
//	treeModes   the version trees' modes as their desires want them (private: 0700)
//	warming     what pods are about to load, read into the page cache ahead
//	            of them (package warm): on publish, lease, wait, modelctl warm
//	views       the read side: list, inspect, status, usage, waits (viewsOf)
//	evictions   how artifacts leave: modelctl evict and gc, absent desires,
//	            ad-hoc entries evicted for space (evictionsOf)
//	modelsDir   the models dir's desires, read and watched
//	clusterNode the daemon as k8ssync sees it (k8ssync.Node)
//	fanout      the peer port, and blobs fetched from peers before the origin
//	            (package daemon/fanout: fanout.Fleet; its authorizer reads the
//	            desires' access, which desireSet publishes, not the daemon lock)
//
// The Daemon itself keeps the artifacts' pull states (pullStates) and the
// pods that hold artifacts (shared: under mu, which the desire set's
// readers take too), runs the reconciler and the pulls, and serves the
// socket.
//
// Dependencies run one way: the components (desireSet, pullStates, space,
// leaseSet, csiVolumes, treeModes, warming, metrics) name no Daemon; what
// they need of the rest they get in New (run.go) as fields: values, the
// functions that take the daemon lock for them (the merged desires, a
// wake-up; csiVolumes gets its set as a volumeHost), or a one-method
// interface (treeModes reads the volumes as volumeHolds). The
// Daemon's own methods, the adapters that hold it (modelsDir, clusterNode,
// the state collector) and run.go sit above them. The views and the
// evictions hold no Daemon either: they share its locked state (shared)
// by pointer and take the rest as fields (viewsOf, evictionsOf).
//
// Where to find what, by file:
//
//	daemon.go      the Daemon value (its fields and lock order), its wake-ups
//	               (notify, Changed, kick), what is in use (inUse), health
//	run.go         New (the components made and wired), Run, the socket
//	config.go      Config, its defaults and its validation (the --config YAML is
//	               read by cmd/modelcached/config.go)
//	server.go      the route table (which routes mutate); the Daemon's own routes:
//	               health, verify, env, gpu, modelctl pull (and the wait for its
//	               pull) and pin, a socket desire's conflicts
//	httpio.go      HTTP plumbing: handler, the status writer, JSON in and out, the
//	               one error→code table (toAPIError)
//	auth.go        how a request is authorised: the peer's credentials, who may mutate,
//	               what a socket desire read back from the index may ask
//	peers.go       connections: per-uid limits, credentials read at accept
//	desires.go     desireSet: the merged set (a model's kernel cache desires
//	               expanded) and its persistence; fingerprints
//	validate.go    a desire's validation, for every origin: its name, sources,
//	               kernel caches, the cap on its URIs (api.MaxURIBytes)
//	modelsdir.go   modelsDir: desires from models.d files (and the watcher)
//	cluster.go     clusterNode: cluster desires, pod holders, views, resolutions
//	reconcile.go   the reconcile loop: which desire needs a pull
//	pullstates.go  pullStates: each artifact's state beyond the index (artState);
//	               how far a pull got (progress); a blob's download in flight (flight)
//	pull.go        one pull as one value (pull): resolve, admit, fetch, commit
//	kernelpull.go  a kernel cache pull's checks before and after its layers (package
//	               kernels): signature, summary label, extracted tree, compatibility
//	download.go    one file's download: single flight per blob, metering, the
//	               budget of files of unknown size
//	xetchunks.go   the store as the hf fetcher's Xet chunk store (xet.ChunkStore), and
//	               the one decision whether a desire's hf:// files come over Xet
//	slot.go        a pull's share of the node's pull slots: held while transferring,
//	               given back while waiting (a retry's backoff, another pull's blob)
//	unpack.go      archive layers (OCI tar layers) checked and unpacked into blobs (unpacker)
//	failure.go     how a pull fails and retries: reasons, permanence, backoff; a
//	               cluster source that changed
//	fanout.go      what a pull gives a blob's fetch through the peers (a
//	               fanout.Transfer: its partial ingest through the pull's sink,
//	               the origin, the retries, the slot given back while it waits)
//	fanout/        package fanout: fan-out between nodes: the peer port
//	               (peer.Server over the store, Authz: which node may have which
//	               blob), where a blob comes from (Plan: the peers to ask, the
//	               nodes that go to the origin first) and its fetch (Fetch)
//	sources/       package sources: which fetcher a desire uses, with which
//	               credentials; credentials files; who file:// reads as
//	kernels/       package kernels: the GPU inventory, signature, compatibility, env
//	admission.go   space: admission of a pull, reservations, eviction passes
//	               (the victims are chosen by capacity.PlanSpace, in capacity/plan.go),
//	               the /proc scan; partial downloads: abandoned, resumable, reclaimed
//	inuse.go       what is in use: leaseSet (modelctl lease), holders by version key
//	tenancy.go     private artifacts: who may mount them, their trees' modes
//	csi.go         csiVolumes: a pod's volume holds one exact revision (and with
//	               kernelCaches: auto its kernel caches, in a composed tree), recorded
//	               in the index (holds/csi:<id>) and under <root>/holds/; volumes no
//	               record names are found again in the mount table at start
//	warming.go     warming: the warm.Warmer, its holds (a volume, a lease, the daemon's
//	               life), the warm route, residency for inspect
//	csistatus.go   what a publish that waits or is refused says: progress, why, what the
//	               pod's namespace may mount instead
//	kernelwait.go  what a model's kernel caches still owe a wait or a kernelCaches: auto
//	               volume, and the GPUs none of them runs on
//	capture.go     where a writable kernel cache volume's compiled kernels are, for
//	               modelctl kernelcache capture (models.d captureKernelCaches): a
//	               published volume, or its kept layer; the capture's end
//	kept.go        keptLayers: writable layers kept at unpublish for a capture after
//	               the pod went, in <root>/kept/; their limits (count, bytes, age)
//	keptcopy.go    a tenant-written upper directory copied by descriptors, following
//	               no link; overlayfs's whiteouts and opaque directories read
//	evict.go       evictions: modelctl evict, absent desires, gc
//	views.go       views: list, inspect, status, usage; wait.go the streams of them
//	redact.go      no credential in a view, the index or the log
//	metrics.go     Prometheus metrics: the daemon's series
//	scrape.go      what a scrape reads of the daemon (stateCollector), the metrics port
package daemon
