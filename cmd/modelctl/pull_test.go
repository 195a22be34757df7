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
		{"dropped", api.Artifact{Name: "typo", Phase: api.PhasePending, Message: "not desired yet"},
			[]string{"pull of typo failed", "Fix the URI and pull again", "--keep keeps the desire"}},
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
