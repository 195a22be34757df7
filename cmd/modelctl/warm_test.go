package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/api"
)

// warm --wait says why the warm ended and exits 0 for resident, budget
// spent and overtaken, 1 for cancelled; a rate-limited warm says to wait
// and try again; warm without a NAME is a usage error.
func TestWarmCommand(t *testing.T) {
	var reply []api.WarmResult // the stream's lines
	var status int
	sock := fakeDaemon(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "POST" || r.URL.Path != "/v1/artifacts/m/warm" {
			t.Errorf("%s %s, want POST /v1/artifacts/m/warm", r.Method, r.URL.Path)
		}
		if status != 0 {
			w.WriteHeader(status)
			json.NewEncoder(w).Encode(api.Error{Code: api.CodeRateLimited, Message: "warm m@r1 for uid:1000: too many warms started by this caller"})
			return
		}
		if r.URL.Query().Get("wait") != "true" {
			json.NewEncoder(w).Encode(api.WarmResult{Name: "m", Revision: "r1", Joined: true})
			return
		}
		for _, l := range reply {
			json.NewEncoder(w).Encode(l)
		}
	})
	running := api.WarmResult{Name: "m", Revision: "r1", WarmedBytes: 1 << 20, TotalBytes: 8 << 20}
	for _, tc := range []struct {
		args   []string
		end    api.WarmResult
		code   int
		stdout string
	}{
		{[]string{"warm", "m"}, api.WarmResult{}, exitOK, "joined the warm that runs already"},
		{[]string{"warm", "m", "--wait"}, api.WarmResult{Name: "m", Revision: "r1", Reason: api.WarmDone, Message: "resident: 8.0 MiB of 8.0 MiB in the page cache"}, exitOK, "m@r1: resident"},
		{[]string{"warm", "--wait", "m"}, api.WarmResult{Name: "m", Revision: "r1", Reason: api.WarmBudget, Message: "budget spent: read 1.0 MiB"}, exitOK, "budget spent"},
		{[]string{"warm", "m", "--wait"}, api.WarmResult{Name: "m", Revision: "r1", Reason: api.WarmCancelled, Message: "cancelled: every hold that asked for it ended"}, exitFailure, "cancelled"},
	} {
		reply = []api.WarmResult{running, tc.end}
		var stdout, stderr bytes.Buffer
		if code := run(append([]string{"modelctl", "--socket", sock}, tc.args...), &stdout, &stderr); code != tc.code || !strings.Contains(stdout.String(), tc.stdout) {
			t.Errorf("%q: exit %d, stdout %q (stderr %q); want exit %d saying %q", tc.args, code, stdout.String(), stderr.String(), tc.code, tc.stdout)
		}
	}
	status = http.StatusTooManyRequests
	var stdout, stderr bytes.Buffer
	if code := run([]string{"modelctl", "--socket", sock, "warm", "m"}, &stdout, &stderr); code != exitFailure || !strings.Contains(stderr.String(), "too many warms") || !strings.Contains(stderr.String(), "run it again") {
		t.Errorf("rate limited: exit %d, stderr %q; want 1 with the reason and the remedy", code, stderr.String())
	}
	stderr.Reset()
	if code := run([]string{"modelctl", "--socket", sock, "warm"}, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "modelctl warm --help") {
		t.Errorf("warm without NAME: exit %d, stderr %q; want 2 and the command's help", code, stderr.String())
	}
}
