package peer

import "github.com/prometheus/client_golang/prometheus"

// Metrics are the collectors of a Server and a Fetcher; the daemon
// registers Collectors() on its registry. A nil *Metrics counts nothing.
type Metrics struct {
	uploads     prometheus.Counter
	uploadBytes prometheus.Counter
	refusals    *prometheus.CounterVec
	fetched     *prometheus.CounterVec
	avoided     *prometheus.CounterVec
	waiting     prometheus.Gauge
}

// Refusal reasons of the server (label reason of
// modelcache_peer_refusals_total).
const (
	RefusedUnauthorized   = "unauthorized"    // no token, or one the Authenticator rejects
	RefusedAuthError      = "auth_error"      // the Authenticator could not decide (API server unreachable)
	RefusedBusy           = "busy"            // MaxUploads transfers already running
	RefusedNotFound       = "not_found"       // no committed blob of that digest
	RefusedForbidden      = "forbidden"       // a blob the Authorizer does not give the caller (answered as not_found)
	RefusedSourceMismatch = "source_mismatch" // a private blob asked for from an address not of the token's pod or node (answered as not_found)
	RefusedAuthzError     = "authz_error"     // the Authorizer could not decide (answered as not_found)
	RefusedBadRequest     = "bad_request"     // a method or path the server does not serve
	RefusedBadRange       = "bad_range"       // a Range the blob cannot satisfy
	RefusedWaitFull       = "wait_full"       // a request that asked to wait (HeaderWait) while WithMaxWaiting were held
)

// NewMetrics makes the collectors, unregistered.
func NewMetrics() *Metrics {
	return &Metrics{
		uploads: prometheus.NewCounter(prometheus.CounterOpts{Name: "modelcache_peer_uploads_total",
			Help: "Blob transfers this daemon served to peers (GET answered 200 or 206)."}),
		uploadBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "modelcache_peer_upload_bytes_total",
			Help: "Bytes of blobs this daemon sent to peers."}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "modelcache_peer_refusals_total",
			Help: "Peer requests this daemon refused, by reason."}, []string{"reason"}),
		fetched: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "modelcache_peer_fetched_bytes_total",
			Help: "Bytes of blobs this daemon received through the peer fetcher, by source (peer, origin)."}, []string{"source"}),
		avoided: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "modelcache_peer_avoided_total",
			Help: "Times this daemon set a peer aside after it failed a transfer, by reason."}, []string{"reason"}),
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{Name: "modelcache_peer_waiting_requests",
			Help: "Peer requests held now for a blob this daemon does not hold yet (X-Modelcache-Wait)."}),
	}
}

// Collectors are what the daemon registers.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.uploads, m.uploadBytes, m.refusals, m.fetched, m.avoided, m.waiting}
}

func (m *Metrics) refused(reason string) {
	if m != nil {
		m.refusals.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) waited(delta float64) {
	if m != nil {
		m.waiting.Add(delta)
	}
}

func (m *Metrics) served(n int64) {
	if m != nil {
		m.uploads.Inc()
		m.uploadBytes.Add(float64(n))
	}
}

func (m *Metrics) received(source string, n int64) {
	if m != nil && n > 0 {
		m.fetched.WithLabelValues(source).Add(float64(n))
	}
}

func (m *Metrics) avoid(reason string) {
	if m != nil {
		m.avoided.WithLabelValues(reason).Inc()
	}
}

// Refusals is the counter of refusals for reason.
func (m *Metrics) Refusals(reason string) prometheus.Counter {
	return m.refusals.WithLabelValues(reason)
}

// Waiting is the gauge of requests held for a blob not here yet.
func (m *Metrics) Waiting() prometheus.Gauge { return m.waiting }

// Uploads is the counter of transfers served.
func (m *Metrics) Uploads() prometheus.Counter { return m.uploads }

// Fetched is the counter of bytes received from source ("peer", "origin").
func (m *Metrics) Fetched(source string) prometheus.Counter { return m.fetched.WithLabelValues(source) }

// Avoided is the counter of peers set aside for reason.
func (m *Metrics) Avoided(reason string) prometheus.Counter { return m.avoided.WithLabelValues(reason) }
