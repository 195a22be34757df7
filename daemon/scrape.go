package daemon

import (
	"cmp"
	"net/http"
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/modelcache/modelcache/api"
)

var (
	descArtifacts  = prometheus.NewDesc("modelcache_artifacts", "Artifacts by phase.", []string{"phase"}, nil)
	descStoreBytes = prometheus.NewDesc("modelcache_store_bytes", "Bytes of blobs in the store (each shared blob once).", nil, nil)
	descBlobs      = prometheus.NewDesc("modelcache_store_blobs", "Blobs in the store.", nil, nil)
	descFSCap      = prometheus.NewDesc("modelcache_filesystem_capacity_bytes", "Size of the filesystem that holds the store root.", nil, nil)
	descFSFree     = prometheus.NewDesc("modelcache_filesystem_free_bytes", "Bytes available on the filesystem that holds the store root.", nil, nil)
	descInfo       = prometheus.NewDesc("modelcache_build_info", "Build of the running modelcached.", []string{"version"}, nil)
	descReserved   = prometheus.NewDesc("modelcache_reserved_bytes", "Bytes reserved by admitted pulls in flight and not yet written.", nil, nil)
	descPinned     = prometheus.NewDesc("modelcache_artifacts_pinned", "Artifact versions that are pinned.", nil, nil)
	descInUse      = prometheus.NewDesc("modelcache_artifacts_in_use", "Artifact versions in use, by what holds them (lease, process).", []string{"kind"}, nil)
	descPressure   = prometheus.NewDesc("modelcache_disk_pressure", "1 when the store is over its quota or the filesystem above the high watermark.", []string{"cause"}, nil)
	descQuota      = prometheus.NewDesc("modelcache_quota_bytes", "The store's byte quota (0: none).", nil, nil)
	descWatermark  = prometheus.NewDesc("modelcache_watermark_ratio", "Filesystem-use watermarks of the eviction policy.", []string{"mark"}, nil)
	descGPU        = prometheus.NewDesc("modelcache_gpu_info", "One per GPU of this node's inventory (source nvml or simulated).",
		[]string{"index", "name", "uuid", "compute_capability", "architecture", "driver_version", "cuda_driver_version", "source"}, nil)
	descGPUs        = prometheus.NewDesc("modelcache_gpus", "GPUs in this node's inventory, by source (nvml, simulated, none).", []string{"source"}, nil)
	descKernelBytes = prometheus.NewDesc("modelcache_kernelcache_bytes", "Bytes of the current Ready kernel cache versions (shared blobs counted in each).", nil, nil)
	descArtPhase    = prometheus.NewDesc("modelcache_artifact_phase", "1 for each artifact's current phase (Pending, Downloading, Ready, Failed, Incompatible, Evicted), one series per artifact; at most 100 artifacts have series of their own, failing and pulling ones first (modelcache_artifact_series_omitted counts the rest, modelcache_artifacts{phase} counts all).", []string{"artifact", "kind", "phase"}, nil)
	descArtBytes    = prometheus.NewDesc("modelcache_artifact_bytes", "Bytes of the artifact's current version (0 while it has none).", []string{"artifact", "kind"}, nil)
	descArtPullDone = prometheus.NewDesc("modelcache_artifact_pull_done_bytes", "Bytes of the pull in flight that the store holds: fetched, or held already and skipped. Only while a pull runs.", []string{"artifact", "kind"}, nil)
	descArtPullSize = prometheus.NewDesc("modelcache_artifact_pull_size_bytes", "Bytes the pull in flight needs in all (left out while a size is unknown); done/size is its progress.", []string{"artifact", "kind"}, nil)
	descArtFailed   = prometheus.NewDesc("modelcache_artifact_failed", "1 for a Failed artifact, with its reason and whether a retry is scheduled (retry=scheduled) or not (retry=none: it failed for good, until its cause is fixed and it is pulled again).", []string{"artifact", "kind", "reason", "retry"}, nil)
	descArtOmitted  = prometheus.NewDesc("modelcache_artifact_series_omitted", "Artifacts left out of the per-artifact series (modelcache_artifact_*): those beyond the bound of 100.", nil, nil)
	descSourceOK    = prometheus.NewDesc("modelcache_scrape_collector_success", "1 when a source read at scrape time answered, 0 when it failed and its series are left out (artifacts, store, filesystem, pressure, versions).", []string{"collector"}, nil)
)

// stateCollector reads the store and the daemon at scrape time. A failing
// source leaves its metrics out and shows 0 in
// modelcache_scrape_collector_success{collector=…} (node_exporter's
// node_scrape_collector_success); it never fails the scrape.
type stateCollector struct{ d *Daemon }

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descArtifacts, descStoreBytes, descBlobs, descFSCap, descFSFree, descInfo, descReserved, descPinned, descInUse, descPressure, descQuota, descWatermark, descGPU, descGPUs, descKernelBytes, descSourceOK,
		descArtPhase, descArtBytes, descArtPullDone, descArtPullSize, descArtFailed, descArtOmitted} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descInfo, prometheus.GaugeValue, 1, c.d.cfg.Version)
	list, err := viewsOf(c.d).list()
	if err == nil {
		counts := map[api.Phase]int{api.PhasePending: 0, api.PhaseDownloading: 0, api.PhaseReady: 0, api.PhaseFailed: 0, api.PhaseIncompatible: 0, api.PhaseEvicted: 0}
		for _, a := range list {
			counts[a.Phase]++
		}
		for p, n := range counts {
			ch <- prometheus.MustNewConstMetric(descArtifacts, prometheus.GaugeValue, float64(n), string(p))
		}
		perArtifact(ch, list)
	}
	c.answered(ch, "artifacts", err)
	n, count, err := c.d.store.BlobStats() // blob records only: no manifests per scrape
	if err == nil {
		ch <- prometheus.MustNewConstMetric(descStoreBytes, prometheus.GaugeValue, float64(n))
		ch <- prometheus.MustNewConstMetric(descBlobs, prometheus.GaugeValue, float64(count))
	}
	c.answered(ch, "store", err)
	capa, free, err := c.d.store.FSStat()
	if err == nil {
		ch <- prometheus.MustNewConstMetric(descFSCap, prometheus.GaugeValue, float64(capa))
		ch <- prometheus.MustNewConstMetric(descFSFree, prometheus.GaugeValue, float64(free))
	}
	c.answered(ch, "filesystem", err)
	p := c.d.cfg.Capacity
	ch <- prometheus.MustNewConstMetric(descReserved, prometheus.GaugeValue, float64(c.d.space.reserved()))
	ch <- prometheus.MustNewConstMetric(descQuota, prometheus.GaugeValue, float64(p.QuotaBytes))
	ch <- prometheus.MustNewConstMetric(descWatermark, prometheus.GaugeValue, float64(p.HighPercent)/100, "high")
	ch <- prometheus.MustNewConstMetric(descWatermark, prometheus.GaugeValue, float64(p.LowPercent)/100, "low")
	pr, err := c.d.space.evictor.Pressure()
	if err == nil {
		ch <- prometheus.MustNewConstMetric(descPressure, prometheus.GaugeValue, b2f(pr.OverQuota), "quota")
		ch <- prometheus.MustNewConstMetric(descPressure, prometheus.GaugeValue, b2f(pr.AboveHigh), "watermark")
	}
	c.answered(ch, "pressure", err)
	arts, err := c.d.store.ListSummaries()
	if err == nil {
		n, kb := 0, int64(0)
		for _, a := range arts {
			for _, v := range a.Versions {
				if v.Pinned {
					n++
				}
				if v.Kind == api.KindKernelCache && v.Revision == a.Current && v.State == "Ready" {
					kb += v.Bytes
				}
			}
		}
		ch <- prometheus.MustNewConstMetric(descPinned, prometheus.GaugeValue, float64(n))
		ch <- prometheus.MustNewConstMetric(descKernelBytes, prometheus.GaugeValue, float64(kb))
	}
	c.answered(ch, "versions", err)
	inv := c.d.kernels.GPUs()
	ch <- prometheus.MustNewConstMetric(descGPUs, prometheus.GaugeValue, float64(len(inv.Devices)), inv.Source)
	for _, g := range inv.Devices {
		ch <- prometheus.MustNewConstMetric(descGPU, prometheus.GaugeValue, 1, strconv.Itoa(g.Index), g.Name, g.UUID,
			g.ComputeCapability, g.Architecture, inv.DriverVersion, inv.CUDADriverVersion, inv.Source)
	}
	byKind := map[string]int{"lease": 0, "process": 0}
	for _, hs := range c.d.inUse() {
		kinds := map[string]bool{}
		for _, h := range hs {
			kinds[h.Kind] = true
		}
		for k := range kinds {
			byKind[k]++
		}
	}
	for k, n := range byKind {
		ch <- prometheus.MustNewConstMetric(descInUse, prometheus.GaugeValue, float64(n), k)
	}
}

// maxArtifactSeries bounds the artifacts that get series of their own:
// a scrape costs at most this many artifacts' few series, whatever the
// node holds (its names are labels, and every scrape carries them).
const maxArtifactSeries = 100

// seriesRank orders artifacts for the bound: failing ones first (the
// alerts need them), then pulls in flight, then the rest; by name within.
func seriesRank(p api.Phase) int {
	switch p {
	case api.PhaseFailed, api.PhaseIncompatible:
		return 0
	case api.PhaseDownloading:
		return 1
	case api.PhasePending:
		return 2
	}
	return 3
}

// perArtifact sends the per-artifact series of at most maxArtifactSeries
// artifacts (seriesRank's first) and how many were left out.
func perArtifact(ch chan<- prometheus.Metric, list []api.Artifact) {
	list = slices.Clone(list)
	slices.SortFunc(list, func(a, b api.Artifact) int {
		return cmp.Or(cmp.Compare(seriesRank(a.Phase), seriesRank(b.Phase)), cmp.Compare(a.Name, b.Name))
	})
	omitted := max(0, len(list)-maxArtifactSeries)
	list = list[:len(list)-omitted]
	for _, a := range list {
		ch <- prometheus.MustNewConstMetric(descArtPhase, prometheus.GaugeValue, 1, a.Name, a.Kind, string(a.Phase))
		ch <- prometheus.MustNewConstMetric(descArtBytes, prometheus.GaugeValue, float64(a.Bytes), a.Name, a.Kind)
		if pr := a.Progress; pr != nil {
			ch <- prometheus.MustNewConstMetric(descArtPullDone, prometheus.GaugeValue, float64(pr.BytesDone+pr.BytesSkipped), a.Name, a.Kind)
			if pr.BytesTotal >= 0 {
				ch <- prometheus.MustNewConstMetric(descArtPullSize, prometheus.GaugeValue, float64(pr.BytesTotal), a.Name, a.Kind)
			}
		}
		if a.Phase == api.PhaseFailed {
			retry := "none"
			if a.NextRetry != nil {
				retry = "scheduled"
			}
			ch <- prometheus.MustNewConstMetric(descArtFailed, prometheus.GaugeValue, 1, a.Name, a.Kind, a.Reason, retry)
		}
	}
	ch <- prometheus.MustNewConstMetric(descArtOmitted, prometheus.GaugeValue, float64(omitted))
}

// answered reports whether the source name answered this scrape. The
// reason goes to the debug log: the gauge is the signal, and a scrape
// every few seconds would repeat the same warning.
func (c *stateCollector) answered(ch chan<- prometheus.Metric, name string, err error) {
	ok := 1.0
	if err != nil {
		ok = 0
		c.d.log.Debug("metrics source failed; its series are left out of this scrape", "collector", name, "err", err)
	}
	ch <- prometheus.MustNewConstMetric(descSourceOK, prometheus.GaugeValue, ok, name)
}

// metricsHandler serves /metrics and /healthz on the metrics address.
func (d *Daemon) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(d.metrics.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := d.healthy(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	return mux
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
