package warm

import "github.com/prometheus/client_golang/prometheus"

// Metrics are a Warmer's counters, for the daemon's registry (register
// Collectors()). Create them with NewMetrics; a Warmer without them
// (nil) counts nothing.
type Metrics struct {
	// Bytes read into the page cache by warms.
	Bytes prometheus.Counter
	// Bytes a warm found already resident and skipped.
	ResidentBytes prometheus.Counter
	// Seconds spent warming, summed over warms.
	Seconds prometheus.Counter
	// Warms by outcome: each Reason when a warm ends, and "refused" for a
	// start the rate limit or the budget refused.
	Warms *prometheus.CounterVec
}

// NewMetrics makes the counters; every outcome's series exists from the
// start, at zero.
func NewMetrics() *Metrics {
	m := &Metrics{
		Bytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "modelcache_warm_bytes_total", Help: "Bytes read into the page cache ahead of a consumer by warms.",
		}),
		ResidentBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "modelcache_warm_resident_bytes_total", Help: "Bytes a warm found already in the page cache and skipped.",
		}),
		Seconds: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "modelcache_warm_seconds_total", Help: "Time spent warming, summed over warms.",
		}),
		Warms: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "modelcache_warms_total", Help: "Warms by outcome (done, budget, cancelled, overtaken, failed, refused).",
		}, []string{"outcome"}),
	}
	for _, o := range []string{string(Done), string(BudgetSpent), string(Cancelled), string(Overtaken), string(Failed), outcomeRefused} {
		m.Warms.WithLabelValues(o)
	}
	return m
}

// Collectors are the series to register.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Bytes, m.ResidentBytes, m.Seconds, m.Warms}
}

const outcomeRefused = "refused"

func (m *Metrics) refused() {
	if m != nil {
		m.Warms.WithLabelValues(outcomeRefused).Inc()
	}
}

func (m *Metrics) add(warmed, resident int64) {
	if m != nil {
		m.Bytes.Add(float64(warmed))
		m.ResidentBytes.Add(float64(resident))
	}
}

func (m *Metrics) finish(r Result) {
	if m != nil {
		m.Seconds.Add(r.Elapsed.Seconds())
		m.Warms.WithLabelValues(string(r.Reason)).Inc()
	}
}
