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
