package main

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
)

// A failed pull says that the desire stays, whether the daemon retries it,
// and how to drop it.
func TestPullFailureSaysTheDesireStays(t *testing.T) {
	next := time.Now().Add(time.Minute)
	for _, tc := range []struct {
		name string
		art  api.Artifact
		want []string
	}{
		{"permanent", api.Artifact{Name: "typo", Phase: api.PhaseFailed, Reason: api.ReasonSourceNotFound},
			[]string{"pull of typo failed", "desire for typo stays", "does not retry it (SourceNotFound)", "modelctl evict typo"}},
		{"retried", api.Artifact{Name: "typo", Phase: api.PhaseFailed, Reason: api.ReasonPullFailed, NextRetry: &next},
			[]string{"desire for typo stays", "retries it with backoff", "modelctl evict typo"}},
		// A new name whose first pull failed for good: the daemon kept nothing.
		{"dropped", api.Artifact{Name: "typo", Phase: api.PhasePending, Message: "not desired yet", Reason: api.ReasonSourceNotFound},
			[]string{"pull of typo failed", "Fix the URI (or create what it names), and pull again", "--keep keeps the desire"}},
		// The remedy follows the failure's kind and the desire's origin.
		{"access", api.Artifact{Name: "typo", Phase: api.PhaseFailed, Reason: api.ReasonAccessDenied, Desire: &api.Desire{Origin: "file:/etc/modelcached/models.d/typo.yaml"}},
			[]string{"credentials are the daemon's, not modelctl's", "then 'modelctl retry typo'", "removing it from /etc/modelcached/models.d/typo.yaml"}},
		{"capacity", api.Artifact{Name: "typo", Phase: api.PhaseFailed, Reason: api.ReasonInsufficientCapacity, NextRetry: &next},
			[]string{"Make room", "'modelctl retry typo' tries now"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := fakeDaemon(t, func(w http.ResponseWriter, r *http.Request) {
				json.NewEncoder(w).Encode(api.Event{Artifact: &tc.art, Error: &api.Error{Code: api.CodeFailed, Message: "pull of typo failed: https://h/x: not found (HTTP 404); check the URL"}})
			})
			var stdout, stderr bytes.Buffer
			code := run([]string{"modelctl", "--socket", sock, "pull", "--name", "typo", "https://h/x"}, &stdout, &stderr)
			if code == exitOK {
				t.Fatal("a failed pull exited 0")
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
			if tc.art.Reason != api.ReasonSourceNotFound && strings.Contains(stderr.String(), "Fix the URI") {
				t.Errorf("a %s failure is told to fix the URI:\n%s", tc.art.Reason, stderr.String())
			}
			if tc.art.Phase != api.PhaseFailed && strings.Contains(stderr.String(), "stays") {
				t.Errorf("nothing was kept, yet stderr says the desire stays:\n%s", stderr.String())
			}
		})
	}
}

// fakeDaemon serves h on a unix socket in a temp dir and returns its path.
func fakeDaemon(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// TestPulledText: a pull says when nothing changed, and what it evicted.
func TestPulledText(t *testing.T) {
	var b strings.Builder
	pulledText(&b, &api.Artifact{Name: "m", Path: "/c/models/m/current", Revision: "0123456789abcdef", Bytes: 1 << 20,
		LastPull: &api.PullStats{Unchanged: true}})
	if !strings.Contains(b.String(), "m: already Ready at /c/models/m/current") || !strings.Contains(b.String(), "nothing was read") {
		t.Fatalf("unchanged: %q", b.String())
	}
	b.Reset()
	pulledText(&b, &api.Artifact{Name: "w40", Path: "/c/models/w40/current", Revision: "aaaaaaaaaaaaaaaa", Bytes: 40 << 20,
		LastPull: &api.PullStats{Evicted: []api.EvictedVersion{{Name: "big2", Revision: "bbbbbbbbbbbbbbbb", Bytes: 2 << 30}}}})
	if !strings.Contains(b.String(), "w40: Ready at") || !strings.Contains(b.String(), "evicted 2.0 GiB of ad-hoc entries: big2@bbbbbbbbbbbb (2.0 GiB)") {
		t.Fatalf("evicted: %q", b.String())
	}
}

// TestStatusShowsTheCapacityPolicy: status's table says the policy in
// force (packaging/deb/config.yaml sends operators there) and the
// daemon's own credentials by name.
func TestStatusShowsTheCapacityPolicy(t *testing.T) {
	sock := fakeDaemon(t, func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.Status{Version: "v", QuotaBytes: 500 << 30, HighWatermark: 85, LowWatermark: 80, Credentials: []string{"HF_TOKEN"}, Phases: map[api.Phase]int{}})
	})
	var stdout, stderr bytes.Buffer
	if code := run([]string{"modelctl", "--socket", sock, "status"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("status: exit %d\n%s", code, stderr.String())
	}
	for _, want := range []string{"capacity: quota 500.0 GiB, watermarks 85% (eviction starts) and 80% (it stops)", "credentials of the daemon's own: HF_TOKEN"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, stdout.String())
		}
	}
}
