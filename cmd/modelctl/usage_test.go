package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
)

// Usage errors exit 2 with one line per problem, flags with two dashes,
// a suggestion where a name is close, and the help that explains them.
func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"lsit"}, []string{`unknown command "lsit" (did you mean "list"?)`, "Run 'modelctl --help'"}},
		{[]string{"pull", "--nmae", "x", "file:///m"}, []string{"unknown flag --nmae (did you mean --name?)", "Run 'modelctl pull --help'"}},
		{[]string{"pull", "file:///m", "--name", "x", "extra"}, []string{`pull takes one URI; unexpected "extra"`, "modelctl pull --help"}},
		{[]string{"list", "extra"}, []string{`list takes no arguments (got "extra")`, "modelctl list --help"}},
		{[]string{"inspect", "a", "b"}, []string{`unexpected "b"`}},
		{[]string{"wait", "m", "--timeout", "soon"}, []string{`--timeout "soon": want a duration such as 30s, 5m or 1h30m (a bare number is seconds)`, "modelctl wait --help"}},
		{[]string{"--sockt", "/s", "list"}, []string{"unknown flag --sockt (did you mean --socket?)", "Run 'modelctl --help'"}},
		// A global flag's typo after the command is suggested too.
		{[]string{"list", "--otput", "json"}, []string{"unknown flag --otput (did you mean --output?)", "Run 'modelctl --help'"}},
		{[]string{"inspect", "m", "--sokcet=/s"}, []string{"unknown flag --sokcet (did you mean --socket?)"}},
		{[]string{"-o", "xml", "list"}, []string{`-o "xml": want table, wide, json, yaml or name (list)`}},
		{[]string{"-o", "jsn", "list"}, []string{`-o "jsn" (did you mean -o json?)`}},
		{[]string{"inspect", "m", "-o", "name"}, []string{"-o name: only list prints names"}},
		// Every bad flag, not only the first.
		{[]string{"evict", "m", "--revison", "r", "--forse"}, []string{"unknown flag --revison (did you mean --revision?)", "unknown flag --forse (did you mean --force?)"}},
		{[]string{"lease", "m", "--ttl", "x"}, []string{`--ttl "x"`}},
	} {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"modelctl", "--socket", "/nonexistent"}, tc.args...), &stdout, &stderr)
		if code != exitUsage {
			t.Errorf("%q: exit %d, want %d\n%s", tc.args, code, exitUsage, stderr.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr.String(), w) {
				t.Errorf("%q: stderr lacks %q:\n%s", tc.args, w, stderr.String())
			}
		}
		if strings.Contains(stderr.String(), " -nmae") || strings.Contains(stderr.String(), "USAGE") {
			t.Errorf("%q: one dash or the whole help:\n%s", tc.args, stderr.String())
		}
	}
	// A bare number is seconds; help needs no arguments.
	for _, args := range [][]string{{"wait", "--help"}, {"pull", "-h"}, {"--help"}, {"--version"}} {
		var stdout, stderr bytes.Buffer
		if code := run(append([]string{"modelctl"}, args...), &stdout, &stderr); code != exitOK {
			t.Errorf("%q: exit %d\n%s", args, code, stderr.String())
		}
	}
}

// verify that finds damage prints its whole report and exits 1 through
// run (urfave/cli's own exit would skip the flush of stdout).
func TestVerifyReportsDamageThenExits1(t *testing.T) {
	sock := fakeDaemon(t, func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.VerifyResult{BlobsChecked: 3, Corrupt: []string{"sha256:aa"}, Refetching: []string{"m"}, Problems: []string{"tree m: extra file"}})
	})
	for _, args := range [][]string{{"verify"}, {"verify", "--fsck"}} {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"modelctl", "--socket", sock}, args...), &stdout, &stderr)
		if code != exitFailure {
			t.Errorf("%q: exit %d, want 1", args, code)
		}
		if !strings.Contains(stdout.String(), "corrupt: sha256:aa") && !strings.Contains(stdout.String(), "tree m: extra file") {
			t.Errorf("%q: report missing:\n%s", args, stdout.String())
		}
		if stderr.Len() > 0 {
			t.Errorf("%q: stderr %q", args, stderr.String())
		}
	}
}

// wait for a name nothing desires fails at once and says how to wait for
// it anyway.
func TestWaitUnknownNameFailsFast(t *testing.T) {
	sock := fakeDaemon(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
		json.NewEncoder(w).Encode(api.Error{Code: api.CodeNotFound, Message: "artifact nosuch: not in the cache"})
	})
	var stdout, stderr bytes.Buffer
	if code := run([]string{"modelctl", "--socket", sock, "wait", "nosuch", "--timeout", "5"}, &stdout, &stderr); code != exitFailure {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(stderr.String(), "nothing desires it") || !strings.Contains(stderr.String(), "--for-create") {
		t.Errorf("stderr: %s", stderr.String())
	}
}

// A value the daemon refuses (a name, a digest, a URI) is a usage error
// too: exit 2, the daemon's reason and the command's help.
func TestInvalidValuesExit2(t *testing.T) {
	sock := fakeDaemon(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		json.NewEncoder(w).Encode(api.Error{Code: api.CodeInvalid, Message: `name "Bad/Name": invalid name: character '/' not allowed`})
	})
	for _, args := range [][]string{
		{"pull", "--name", "Bad/Name", "file:///m"},
		{"pull", "--name", "m", "--digest", "1234", "file:///m", "--no-wait"},
		{"evict", "Bad/Name"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"modelctl", "--socket", sock}, args...), &stdout, &stderr)
		if code != exitUsage {
			t.Errorf("%q: exit %d, want %d\n%s", args, code, exitUsage, stderr.String())
		}
		for _, w := range []string{"invalid name", "Run 'modelctl " + args[0] + " --help'"} {
			if !strings.Contains(stderr.String(), w) {
				t.Errorf("%q: stderr lacks %q:\n%s", args, w, stderr.String())
			}
		}
	}
}

// lease -- COMMAND that cannot run exits as a shell does: 127 when it is
// not found, 126 when it is found and cannot be executed; a COMMAND that
// runs gives its own exit code.
func TestLeaseCommandThatCannotRun(t *testing.T) {
	sock := fakeDaemon(t, func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.Lease{Name: "m", Revision: "r1", Holder: "h", Expires: time.Now().Add(time.Minute)})
	})
	notExec := filepath.Join(t.TempDir(), "script")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\nexit 0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		cmd  []string
		code int
		want string
	}{
		{[]string{"modelcache-no-such-command-4711"}, 127, "modelcache-no-such-command-4711: command not found"},
		{[]string{filepath.Join(t.TempDir(), "missing")}, 127, "command not found"},
		{[]string{notExec}, 126, "cannot execute: permission denied"},
		{[]string{t.TempDir()}, 126, "cannot execute"},
		{[]string{"sh", "-c", "exit 3"}, 3, ""},
	} {
		var stdout, stderr bytes.Buffer
		code := run(append([]string{"modelctl", "--socket", sock, "lease", "m", "--"}, tc.cmd...), &stdout, &stderr)
		if code != tc.code {
			t.Errorf("%q: exit %d, want %d\n%s", tc.cmd, code, tc.code, stderr.String())
		}
		if !strings.Contains(stderr.String(), tc.want) {
			t.Errorf("%q: stderr lacks %q:\n%s", tc.cmd, tc.want, stderr.String())
		}
	}
}

// kubectl's habits: list -o name prints one name a line, list
// --no-headers leaves out the header row, rm and delete are evict.
func TestKubectlHabits(t *testing.T) {
	var mu sync.Mutex
	var requests []string
	sent := func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), requests...) }
	sock := fakeDaemon(t, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests = append(requests, r.Method+" "+r.URL.Path)
		mu.Unlock()
		switch r.Method {
		case http.MethodDelete:
			json.NewEncoder(w).Encode(api.EvictResult{Name: "m", Revisions: []string{"r1"}})
		default:
			json.NewEncoder(w).Encode([]api.ArtifactRow{{Name: "alpha", Phase: api.PhaseReady}, {Name: "beta", Phase: api.PhaseFailed}})
		}
	})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"list", "-o", "name"}, "alpha\nbeta\n"},
		{[]string{"ls", "--output=name"}, "alpha\nbeta\n"},
		{[]string{"rm", "m"}, "m: evicted 1 revision(s); freed 0 B in 0 blob(s)\n"},
		{[]string{"delete", "m"}, "m: evicted 1 revision(s); freed 0 B in 0 blob(s)\n"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(append([]string{"modelctl", "--socket", sock}, tc.args...), &stdout, &stderr); code != exitOK {
			t.Fatalf("%q: exit %d\n%s", tc.args, code, stderr.String())
		}
		if stdout.String() != tc.want {
			t.Errorf("%q: stdout %q, want %q", tc.args, stdout.String(), tc.want)
		}
	}
	if got, want := sent()[len(sent())-1], "DELETE /v1/artifacts/m"; got != want {
		t.Errorf("delete sent %q, want %q", got, want)
	}
	var with, without bytes.Buffer
	run([]string{"modelctl", "--socket", sock, "list"}, &with, io.Discard)
	if code := run([]string{"modelctl", "--socket", sock, "list", "--no-headers"}, &without, io.Discard); code != exitOK {
		t.Fatalf("list --no-headers: exit %d", code)
	}
	lines := strings.Split(with.String(), "\n")
	if !strings.HasPrefix(lines[0], "NAME") || len(lines) != 4 {
		t.Fatalf("list:\n%s", with.String())
	}
	if strings.Contains(without.String(), "NAME") || !strings.HasPrefix(without.String(), "alpha") || strings.Count(without.String(), "\n") != 2 {
		t.Errorf("list --no-headers:\n%s", without.String())
	}
	// -o name elsewhere is refused before anything is asked of the daemon.
	n := len(sent())
	if code := run([]string{"modelctl", "--socket", sock, "-o", "name", "gc"}, io.Discard, io.Discard); code != exitUsage || len(sent()) != n {
		t.Errorf("gc -o name: exit %d, %d requests", code, len(sent())-n)
	}
}

// TestEvictSeveralAndFailed: evict takes several names and --failed (every
// Failed ad-hoc entry); one refusal does not stop the others and exits 1.
func TestEvictSeveralAndFailed(t *testing.T) {
	var mu sync.Mutex
	var deleted []string
	sock := fakeDaemon(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodDelete {
			json.NewEncoder(w).Encode([]api.ArtifactRow{
				{Name: "ok", Phase: api.PhaseReady, Entry: api.EntryAdHoc},
				{Name: "typo", Phase: api.PhaseFailed, Entry: api.EntryAdHoc},
				{Name: "declared", Phase: api.PhaseFailed, Entry: api.EntryDeclared},
				{Name: "404", Phase: api.PhaseFailed, Entry: api.EntryAdHoc},
				// Its refresh failed; it still serves a version.
				{Name: "serving", Phase: api.PhaseFailed, Entry: api.EntryAdHoc, Revision: "9bd1b1a27357"},
			})
			return
		}
		name := strings.TrimPrefix(r.URL.Path, "/v1/artifacts/")
		mu.Lock()
		deleted = append(deleted, name)
		mu.Unlock()
		if name == "busy" {
			w.WriteHeader(http.StatusConflict)
			json.NewEncoder(w).Encode(api.Error{Code: api.CodeInUse, Message: "artifact busy is in use (lease j)"})
			return
		}
		json.NewEncoder(w).Encode(api.EvictResult{Name: name, Revisions: []string{"r1"}})
	})
	var stdout, stderr bytes.Buffer
	if code := run([]string{"modelctl", "--socket", sock, "evict", "a", "b", "--failed"}, &stdout, &stderr); code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	got := func() string { mu.Lock(); defer mu.Unlock(); return strings.Join(deleted, " ") }
	if got := got(); got != "a b typo 404" {
		t.Errorf("evicted %q, want a b and the Failed ad-hoc entries (not the declared one)", got)
	}
	if n := strings.Count(stdout.String(), "evicted 1 revision(s)"); n != 4 {
		t.Errorf("stdout %q: want four results", stdout.String())
	}
	mu.Lock()
	deleted = nil
	mu.Unlock()
	stdout.Reset()
	stderr.Reset()
	if code := run([]string{"modelctl", "--socket", sock, "evict", "busy", "c"}, &stdout, &stderr); code != exitFailure {
		t.Fatalf("a refused name among several: exit %d, want %d", code, exitFailure)
	}
	if got() != "busy c" || !strings.Contains(stdout.String(), "c: evicted") || !strings.Contains(stderr.String(), "busy is in use") {
		t.Errorf("deleted %q, stdout %q, stderr %q: want c evicted after busy was refused, and why", got(), stdout.String(), stderr.String())
	}
	for _, args := range [][]string{{"evict"}, {"evict", "a", "b", "--revision", "r1"}} {
		if code := run(append([]string{"modelctl", "--socket", sock}, args...), io.Discard, io.Discard); code != exitUsage {
			t.Errorf("%q: exit %d, want %d", args, code, exitUsage)
		}
	}
}
