package packaging

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/daemon"
	"github.com/modelcache/modelcache/internal/testenv"
)

// TestAlertRules runs promtool check rules and the rules' unit tests.
func TestAlertRules(t *testing.T) {
	promtool := testenv.Require(t, "promtool", "apt-get install prometheus")
	dir := filepath.Join("..", "..", "deploy", "monitoring")
	for _, args := range [][]string{{"check", "rules", "alerts.yaml"}, {"test", "rules", "alerts_test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("promtool %v: %v\n%s", args, err, out)
		}
	}
}

var metricName = regexp.MustCompile(`\bmodelcache_[a-z_]+`)

// TestDashboardAndAlertsUseExportedMetrics: every modelcache_* name in
// the dashboard and the alerts is one a running daemon exports.
func TestDashboardAndAlertsUseExportedMetrics(t *testing.T) {
	dir := t.TempDir()
	cfg := daemon.DefaultConfig()
	cfg.Root, cfg.Socket, cfg.MetricsAddr, cfg.ModelsDir, cfg.SocketGroup = filepath.Join(dir, "root"), filepath.Join(dir, "s.sock"), "127.0.0.1:0", "", ""
	cfg.GPUInventory = filepath.Join(dir, "gpus.json") // so modelcache_gpu_info has a series
	os.WriteFile(cfg.GPUInventory, []byte(`{"devices":[{"name":"H100","uuid":"GPU-x","computeCapability":"9.0"}]}`), 0o644)
	d, err := daemon.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	c := &api.Client{Socket: cfg.Socket}
	// One API request: modelcache_api_requests_total.
	testenv.Eventually(t, "daemon healthy", 5*time.Second, func() error { return c.Health(ctx) })
	// An artifact that failed for good: the per-artifact failed series
	// (ModelcacheArtifactFailed) exists only while one does.
	gone := httptest.NewServer(http.NotFoundHandler())
	defer gone.Close()
	if _, err := c.Pull(ctx, api.PullRequest{Name: "gone", URI: gone.URL + "/w.bin"}, false, nil); err != nil {
		t.Fatal(err)
	}
	var body []byte
	testenv.Eventually(t, "/metrics with a failed artifact", 30*time.Second, func() error {
		addr := d.MetricsAddr()
		if addr == "" {
			return errors.New("no metrics address yet")
		}
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return err
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if !strings.Contains(string(body), `modelcache_artifact_failed{artifact="gone"`) {
			return errors.New("no modelcache_artifact_failed series of the failed artifact yet")
		}
		return nil
	})
	exported := map[string]bool{}
	for _, l := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(l, "# TYPE "); ok {
			f := strings.Fields(rest)
			exported[f[0]] = true
			if f[1] == "histogram" {
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					exported[f[0]+s] = true
				}
			}
		}
	}
	dash, err := os.ReadFile(filepath.Join("..", "..", "deploy", "monitoring", "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var parsed map[string]any
	if err := json.Unmarshal(dash, &parsed); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	alerts, _ := os.ReadFile(filepath.Join("..", "..", "deploy", "monitoring", "alerts.yaml"))
	var unknown []string
	for _, src := range [][]byte{dash, alerts} {
		for _, m := range metricName.FindAllString(string(src), -1) {
			if !exported[m] {
				unknown = append(unknown, m)
			}
		}
	}
	sort.Strings(unknown)
	if len(unknown) > 0 {
		t.Fatalf("the dashboard or the alerts use metrics the daemon does not export: %v", unknown)
	}
}
