package daemon

import (
	"bytes"
	"context"
	"github.com/modelcache/modelcache/internal/testenv"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil/promlint"

	"github.com/modelcache/modelcache/api"
)

// TestMetricsExposition scrapes a daemon that has done some work and lints
// the exposition with client_golang's promlint and with promtool.
func TestMetricsExposition(t *testing.T) {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "w.bin"), []byte("weights"), 0o644)
	h := start(t, testConfig(t))
	if _, err := h.pull(api.PullRequest{Name: "m", URI: "file://" + src}); err != nil {
		t.Fatal(err)
	}
	h.c.Verify(context.Background())
	resp, err := http.Get("http://" + h.d.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{
		`modelcache_fetch_bytes_total{scheme="file"} 7`,
		`modelcache_artifacts{phase="Ready"} 1`,
		`modelcache_store_bytes 7`,
		`modelcache_verifications_total{result="ok"}`,
		`modelcache_pulls_total{result="ok",scheme="file"} 1`,
		`modelcache_filesystem_free_bytes`,
		`modelcache_api_requests_total{code="200",route="POST /v1/verify"} 1`,
		`modelcache_reserved_bytes 0`,
		`modelcache_pull_stage_seconds_count{stage="hash"} 1`,
		`modelcache_pull_stage_seconds_count{stage="publish"} 1`,
		`modelcache_disk_pressure{cause="watermark"}`,
		`modelcache_artifacts_in_use{kind="lease"} 0`,
		`modelcache_artifacts_pinned 0`,
		`modelcache_watermark_ratio{mark="high"} 0.85`,
		`modelcache_pull_admissions_total{result="admitted"} 1`,
		`modelcache_scrape_collector_success{collector="artifacts"} 1`,
		`modelcache_scrape_collector_success{collector="store"} 1`,
		`modelcache_scrape_collector_success{collector="filesystem"} 1`,
		`modelcache_scrape_collector_success{collector="pressure"} 1`,
		`modelcache_scrape_collector_success{collector="versions"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	problems, err := promlint.New(bytes.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
	promtool := testenv.Require(t, "promtool", "apt-get install prometheus")
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(body)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool check metrics: %v\n%s", err, out)
	}
	resp, err = http.Get("http://" + h.d.MetricsAddr() + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", resp, err)
	}
}

// TestMetricsShowFailingSource: with the index closed under it, the
// collector's index sources fail; the scrape still succeeds, their series
// are left out, and modelcache_scrape_collector_success says which failed.
func TestMetricsShowFailingSource(t *testing.T) {
	h := start(t, testConfig(t))
	h.stop() // Run closes the index on the way out; the root stays
	mfs, err := h.d.metrics.reg.Gather()
	if err != nil {
		t.Fatalf("a failing source failed the scrape: %v", err)
	}
	got := map[string]float64{}
	present := map[string]bool{}
	for _, mf := range mfs {
		present[mf.GetName()] = true
		if mf.GetName() != "modelcache_scrape_collector_success" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "collector" {
					got[l.GetValue()] = m.GetGauge().GetValue()
				}
			}
		}
	}
	want := map[string]float64{"artifacts": 0, "store": 0, "pressure": 0, "versions": 0, "filesystem": 1}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("modelcache_scrape_collector_success: %v, want %v", got, want)
	}
	if present["modelcache_store_bytes"] || !present["modelcache_filesystem_free_bytes"] {
		t.Errorf("series present: store bytes %v (want none: its source failed), free bytes %v (want one)",
			present["modelcache_store_bytes"], present["modelcache_filesystem_free_bytes"])
	}
}
