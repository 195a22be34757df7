// Package daemon is modelcached: it merges desires (the socket API, YAML
// files in the models dir, ModelCache objects from the cluster) into one
// desired set, reconciles it against the store (pull what is present and
// missing, evict what is absent, retry failures with backoff), schedules
// pulls (bounded concurrency, one download per blob however many
// artifacts want it), and serves the socket API, Prometheus metrics and
// systemd notifications.
//
// Where to find what, by concern:
//
//	daemon.go      the Daemon value (its fields and lock order), New, Run, the socket
//	config.go      Config, its defaults and its validation (the --config YAML is
//	               read by cmd/modelcached/config.go)
//	server.go      the route table (which routes mutate), HTTP plumbing, the one error→code table
//	auth.go        how a request is authorised: the peer's credentials, who may mutate,
//	               what a desire from each origin may ask (socket, models.d, cluster)
//	peers.go       connections: per-uid limits, credentials read at accept
//	desires.go     desires: the merged set, fingerprints, validation, modelctl pull/pin, persistence
//	limits.go      the cap on a desire's source URIs (api.MaxURIBytes), for every origin
//	modelsdir.go   desires from models.d files (and the watcher)
//	cluster.go     the daemon as k8ssync sees it (cluster desires, pod holders, views)
//	reconcile.go   the reconcile loop: which desire needs a pull, per-artifact state
//	pull.go        one pull as one value (pull): resolve, admit, fetch, commit; single flight per blob
//	slot.go        a pull's share of the node's pull slots: held while transferring,
//	               given back while waiting (a retry's backoff, another pull's blob)
//	unpack.go      archive layers (OCI tar layers) unpacked into blobs
//	failure.go     how a pull fails and retries: reasons, permanence, backoff
//	sources.go     which fetcher a desire uses, with which credentials
//	kernelcache.go kernel caches: expansion, signature, GPU compatibility, env
//	admission.go   capacity: admission of a pull, reservations, eviction passes
//	               (the victims are chosen by capacity.PlanSpace, in capacity/plan.go)
//	inuse.go       what is in use: leases, pod holders, CSI volumes, the /proc scan
//	csi.go         the daemon as the CSI driver sees it (csi.Backend): a pod's volume
//	               holds one exact revision (and with kernelCaches: auto its kernel
//	               caches, in a composed tree), recorded in the index (holds/csi:<id>)
//	               and under <root>/holds/; volumes no record names are found again
//	               in the mount table at start
//	ingests.go     partial downloads: abandoned, resumable, reclaimed
//	evict.go       how artifacts leave: modelctl evict, absent desires, gc
//	views.go       the read views (list, inspect, status, usage); wait.go the streams of them
//	redact.go      no credential in a view, the index or the log
//	metrics.go     Prometheus metrics
package daemon
