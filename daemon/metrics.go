package daemon

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/modelcache/modelcache/daemon/capacity"
	p2p "github.com/modelcache/modelcache/peer"
)

// metrics live on the daemon's own registry; nothing is global.
type metrics struct {
	reg           *prometheus.Registry
	own           []prometheus.Collector // the modelcache_* series, for TestDocsNameOnlyRealMetrics
	fetchedBytes  *prometheus.CounterVec
	fetchErrors   *prometheus.CounterVec
	fetchDuration *prometheus.HistogramVec
	pullStages    *prometheus.HistogramVec
	pulls         *prometheus.CounterVec
	verifications *prometheus.CounterVec
	evictions     *prometheus.CounterVec
	apiRequests   *prometheus.CounterVec
	freedBytes    prometheus.Counter
	admissions    *prometheus.CounterVec
	signatures    *prometheus.CounterVec
	compatChecks  *prometheus.CounterVec
	apiConns      prometheus.Gauge
	apiRefused    prometheus.Counter
	peer          *p2p.Metrics // the peer port's and the peer fetcher's (package fanout)
}

// newMetrics makes the daemon's series and registers them with state,
// the collector that reads the daemon at scrape time.
// evictionReasons are the reason labels of modelcache_evictions_total
// (docs/metrics.md names each: TestDocsNameRoutesAndEvictionReasons).
var evictionReasons = []string{capacity.ReasonSpace, capacity.ReasonAge, capacity.ReasonAbsent, capacity.ReasonManual, capacity.ReasonAdmission}

func newMetrics(state prometheus.Collector) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		fetchedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "modelcache_fetch_bytes_total", Help: "Bytes received from sources, by URI scheme.",
		}, []string{"scheme"}),
		fetchErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "modelcache_fetch_errors_total", Help: "Failed fetch attempts (each retry counts), by URI scheme.",
		}, []string{"scheme"}),
		fetchDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "modelcache_fetch_duration_seconds", Help: "Time to fetch and verify one file, by URI scheme.",
			Buckets: prometheus.ExponentialBuckets(0.01, 4, 10),
		}, []string{"scheme"}),
		pullStages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "modelcache_pull_stage_seconds",
			Help:    "Time spent in each stage of a pull, one observation per file downloaded (resolve and publish: per pull). Stages: resolve (a kernel cache's signature check included), read (waiting on the source), buffer_wait (the reader waiting for hashing or the disk), hash, write, fsync, commit (verify, rename, record of one blob), archive_check (an archive layer read through once for its limits and hostile entries), unpack (its members read, written and committed), publish (the version's tree and index transaction). hash and write run beside read, so the sums overlap.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 11),
		}, []string{"stage"}),
		pulls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "modelcache_pulls_total", Help: "Finished pulls of artifact versions, by scheme and result (ok, failed).",
		}, []string{"scheme", "result"}),
		verifications: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "modelcache_verifications_total", Help: "Blob verifications, at ingest and by scrub, by result (ok, mismatch, corrupt, missing).",
		}, []string{"result"}),
		evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "modelcache_evictions_total", Help: "Artifact versions evicted, by reason (space, age, absent, manual, admission).",
		}, []string{"reason"}),
		apiRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "modelcache_api_requests_total", Help: "Socket API requests, by route and HTTP status code.",
		}, []string{"route", "code"}),
		freedBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "modelcache_eviction_freed_bytes_total", Help: "Bytes of blobs freed by the GC after evictions.",
		}),
		admissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "modelcache_pull_admissions_total", Help: "Capacity admission decisions for pulls, by result (admitted, evicted_first, rejected).",
		}, []string{"result"}),
		signatures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "modelcache_signature_verifications_total", Help: "Kernel cache signature checks, by result (verified, unsigned, invalid, error, skipped).",
		}, []string{"result"}),
		compatChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "modelcache_kernelcache_compat_checks_total", Help: "Kernel cache compatibility checks against this node's GPUs, by result (compatible, incompatible).",
		}, []string{"result"}),
		apiConns: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "modelcache_api_connections", Help: "Connections open on the API socket.",
		}),
		apiRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "modelcache_api_connections_refused_total", Help: "API socket connections closed at accept because their peer uid held its limit (--max-connections-per-uid).",
		}),
		peer: p2p.NewMetrics(),
	}
	// Every known label value starts at zero, so rates and alerts see the
	// series before the first event.
	for _, sc := range []string{"file", "http", "https", "hf", "s3", "oci", "ngc"} {
		m.fetchedBytes.WithLabelValues(sc)
		m.fetchErrors.WithLabelValues(sc)
		m.fetchDuration.WithLabelValues(sc)
		for _, r := range []string{"ok", "failed", "incompatible"} {
			m.pulls.WithLabelValues(sc, r)
		}
	}
	for _, st := range pullStages {
		m.pullStages.WithLabelValues(st)
	}
	for _, r := range []string{"ok", "mismatch", "corrupt", "missing"} {
		m.verifications.WithLabelValues(r)
	}
	for _, r := range evictionReasons {
		m.evictions.WithLabelValues(r)
	}
	for _, r := range []string{"admitted", "evicted_first", "rejected"} {
		m.admissions.WithLabelValues(r)
	}
	for _, r := range []string{"verified", "unsigned", "invalid", "error", "skipped"} {
		m.signatures.WithLabelValues(r)
	}
	for _, r := range []string{"compatible", "incompatible"} {
		m.compatChecks.WithLabelValues(r)
	}
	m.own = []prometheus.Collector{m.fetchedBytes, m.fetchErrors, m.fetchDuration, m.pullStages, m.pulls, m.verifications, m.evictions, m.apiRequests, m.freedBytes, m.admissions, m.signatures, m.compatChecks, m.apiConns, m.apiRefused,
		state}
	m.own = append(m.own, m.peer.Collectors()...)
	for _, src := range []string{"peer", "origin"} {
		m.peer.Fetched(src)
	}
	m.reg.MustRegister(m.own...)
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// pullStages are the stage label values of modelcache_pull_stage_seconds.
var pullStages = []string{"resolve", "read", "buffer_wait", "hash", "write", "fsync", "commit", "archive_check", "unpack", "publish"}

// register adds a component's modelcache_* series (warming's).
func (m *metrics) register(cs ...prometheus.Collector) {
	m.own = append(m.own, cs...)
	m.reg.MustRegister(cs...)
}
