package daemon

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcache/modelcache/internal/testenv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"

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
	lintExposition(t, body)
	resp, err = http.Get("http://" + h.d.MetricsAddr() + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("healthz: %v %v", resp, err)
	}
}

// lintExposition lints a /metrics body with client_golang's promlint
// and with promtool check metrics.
func lintExposition(t *testing.T, body []byte) {
	t.Helper()
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
}

// scrape returns the daemon's /metrics body.
func (h *harness) scrape() string {
	h.t.Helper()
	resp, err := http.Get("http://" + h.d.MetricsAddr() + "/metrics")
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// TestMetricsPerArtifact: each artifact has its phase and bytes, a pull
// in flight its progress (done and size), a Failed one its reason and
// whether a retry is scheduled: retry="none" for one that failed for
// good. The exposition lints clean with them.
func TestMetricsPerArtifact(t *testing.T) {
	ok, slow := data(5000, 1), data(4<<20, 2)
	release := make(chan struct{})
	srv := newFileServer(t, map[string][]byte{"ok.bin": ok, "slow.bin": slow})
	srv.hook = func(w http.ResponseWriter, r *http.Request) bool {
		if r.URL.Path != "/slow.bin" || r.Method != http.MethodGet {
			return false
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(slow)))
		w.WriteHeader(http.StatusOK)
		w.Write(slow[:len(slow)/2])
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		return true
	}
	h := start(t, testConfig(t))
	defer close(release)
	if _, err := h.pull(api.PullRequest{Name: "ready", URI: srv.URL + "/ok.bin#sha256=" + sha(ok)}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := h.c.Pull(ctx, api.PullRequest{Name: "gone", URI: srv.URL + "/missing.bin"}, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.Pull(ctx, api.PullRequest{Name: "slow", URI: srv.URL + "/slow.bin#sha256=" + sha(slow)}, false, nil); err != nil {
		t.Fatal(err)
	}
	h.waitPhase("gone", api.PhaseFailed)
	var body string
	testenv.Eventually(t, "the slow pull's progress in the metrics", 30*time.Second, func() error {
		body = h.scrape()
		for _, want := range []string{
			`modelcache_artifact_phase{artifact="ready",kind="model",phase="Ready"} 1`,
			fmt.Sprintf(`modelcache_artifact_bytes{artifact="ready",kind="model"} %d`, len(ok)),
			`modelcache_artifact_phase{artifact="gone",kind="model",phase="Failed"} 1`,
			`modelcache_artifact_phase{artifact="slow",kind="model",phase="Downloading"} 1`,
			`modelcache_artifact_pull_size_bytes{artifact="slow",kind="model"} 4.194304e+06`,
			`modelcache_artifact_series_omitted 0`,
		} {
			if !strings.Contains(body, want) {
				return fmt.Errorf("no %s in\n%s", want, grepLines(body, "modelcache_artifact"))
			}
		}
		m := regexp.MustCompile(`modelcache_artifact_pull_done_bytes\{artifact="slow",kind="model"\} (\S+)`).FindStringSubmatch(body)
		if m == nil || m[1] == "0" {
			return fmt.Errorf("the slow pull's done bytes: %v", m)
		}
		return nil
	})
	if !regexp.MustCompile(`modelcache_artifact_failed\{artifact="gone",kind="model",reason="[A-Za-z]+",retry="none"\} 1`).MatchString(body) {
		t.Errorf("no failed-for-good series of gone with its reason:\n%s", grepLines(body, "modelcache_artifact_failed"))
	}
	if strings.Contains(body, `modelcache_artifact_failed{artifact="ready"`) {
		t.Errorf("a Ready artifact has a failed series")
	}
	lintExposition(t, []byte(body))
}

func grepLines(body, prefix string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestArtifactSeriesBound: over the bound, the per-artifact series keep
// the failing and pulling artifacts and omit the others, counting them.
func TestArtifactSeriesBound(t *testing.T) {
	var list []api.Artifact
	for i := range maxArtifactSeries + 50 {
		list = append(list, api.Artifact{Name: fmt.Sprintf("a%03d", i), Kind: api.KindModel, Phase: api.PhaseReady})
	}
	list = append(list, api.Artifact{Name: "zz-failed", Kind: api.KindModel, Phase: api.PhaseFailed, Reason: api.ReasonAccessDenied},
		api.Artifact{Name: "zz-pulling", Kind: api.KindModel, Phase: api.PhaseDownloading, Progress: &api.Progress{BytesDone: 1, BytesTotal: 2}})
	ch := make(chan prometheus.Metric, 10*len(list))
	perArtifact(ch, list)
	close(ch)
	names := map[string]bool{}
	phases, omitted := 0, -1.0
	for m := range ch {
		var pb dto.Metric
		m.Write(&pb)
		desc := m.Desc().String()
		switch {
		case strings.Contains(desc, `"modelcache_artifact_series_omitted"`):
			omitted = pb.GetGauge().GetValue()
		case strings.Contains(desc, `"modelcache_artifact_phase"`):
			phases++
			for _, l := range pb.GetLabel() {
				if l.GetName() == "artifact" {
					names[l.GetValue()] = true
				}
			}
		}
	}
	if phases != maxArtifactSeries || omitted != 52 {
		t.Fatalf("%d artifacts with series, %v omitted; want %d and 52", phases, omitted, maxArtifactSeries)
	}
	if !names["zz-failed"] || !names["zz-pulling"] || names[fmt.Sprintf("a%03d", maxArtifactSeries+49)] {
		t.Fatalf("the bound kept the wrong artifacts: failed %v, pulling %v", names["zz-failed"], names["zz-pulling"])
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

// TestFetchBytesMoveDuringDownload: modelcache_fetch_bytes_total counts
// bytes while a file downloads, not only when it ends: a source that has
// sent 3 of 4 MiB and stalls has moved the counter past 2 MiB.
func TestFetchBytesMoveDuringDownload(t *testing.T) {
	const size, first = 4 << 20, 3 << 20
	body := data(size, 9)
	release := make(chan struct{})
	var gets atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(size))
		if r.Method == http.MethodHead {
			return
		}
		gets.Add(1)
		w.Write(body[:first])
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		w.Write(body[first:])
	}))
	defer srv.Close()
	cfg := testConfig(t)
	cfg.IdleTimeout = 5 * time.Minute // the stall must not end the stream: the counter moves within it
	h := start(t, cfg)
	done := make(chan error, 1)
	go func() {
		_, err := h.pull(api.PullRequest{Name: "slow", URI: srv.URL + "/w.bin#sha256=" + sha(body)})
		done <- err
	}()
	c := h.d.metrics.fetchedBytes.WithLabelValues("http")
	err := testenv.Poll(30*time.Second, func() error {
		if v := testutil.ToFloat64(c); v < 2<<20 {
			return fmt.Errorf("fetch_bytes_total is %v", v)
		}
		return nil
	})
	if err != nil {
		close(release)
		t.Fatalf("%v with 3 MiB sent and the download stalled; want it past 2 MiB", err)
	}
	if n := gets.Load(); n != 1 {
		t.Fatalf("%d GETs: the counter must move within the one stalled stream", n)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(c); got != size {
		t.Fatalf("fetch_bytes_total %v after the pull, want %d", got, size)
	}
}

// TestDocsNameOnlyRealMetrics: every modelcache_* series that README.md,
// docs/ and deploy/ name is one the daemon describes, and every series the
// daemon describes is named in docs/metrics.md.
func TestDocsNameOnlyRealMetrics(t *testing.T) {
	h := start(t, testConfig(t))
	described := map[string]bool{}
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		for _, c := range h.d.metrics.own {
			c.Describe(ch)
		}
		close(ch)
	}()
	fq := regexp.MustCompile(`fqName: "([^"]+)"`)
	for d := range ch {
		if m := fq.FindStringSubmatch(d.String()); m != nil {
			described[m[1]] = true
		}
	}
	if len(described) < 20 {
		t.Fatalf("the daemon describes %d series: %v", len(described), described)
	}
	named := regexp.MustCompile(`modelcache_[a-z_]*[a-z]`)
	var files []string
	for _, dir := range []string{"../docs", "../deploy"} {
		filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
			if err == nil && !e.IsDir() && (strings.HasSuffix(p, ".md") || strings.HasSuffix(p, ".yaml")) {
				files = append(files, p)
			}
			return nil
		})
	}
	files = append(files, "../README.md")
	inMetrics := ""
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(f) == "metrics.md" {
			inMetrics = string(raw)
		}
		for _, n := range named.FindAllString(string(raw), -1) {
			base := n
			for _, suf := range []string{"_bucket", "_count", "_sum"} {
				if b := strings.TrimSuffix(n, suf); b != n && described[b] {
					base = b
				}
			}
			if !described[base] {
				t.Errorf("%s names %s, which the daemon does not export", f, n)
			}
		}
	}
	for n := range described {
		if !strings.Contains(inMetrics, n) {
			t.Errorf("the daemon exports %s, which docs/metrics.md does not name", n)
		}
	}
}

// TestMetricsListenerOpensBeforeTheSocketAnswers: once the socket
// answers, the metrics listener is open (a client that waits for the
// socket, or a test that then runs the process out of descriptors, never
// sees Run stop for want of it); a metrics address another process holds
// stops Run with an error that names the flag, the address and the fix.
func TestMetricsListenerOpensBeforeTheSocketAnswers(t *testing.T) {
	h := start(t, testConfig(t))
	if h.d.MetricsAddr() == "" {
		t.Fatal("the socket answered before the metrics listener was open")
	}
	h.stop()

	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg := testConfig(t)
	cfg.MetricsAddr = taken.Addr().String()
	d, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = d.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "--metrics-addr "+cfg.MetricsAddr) || !strings.Contains(err.Error(), "pass --metrics-addr to pick another port") {
		t.Fatalf("Run with its metrics address taken: %v; want the flag, the address and the fix named", err)
	}
}
