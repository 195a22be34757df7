package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/modelcache/modelcache/api"
)

// The bar fits every width it is given, shows rate and ETA where there
// is room, and keeps the percentage down to a narrow terminal.
func TestStatusLineFitsTheWidth(t *testing.T) {
	now := time.Now()
	a := &api.Artifact{Name: "llama-3-8b", Phase: api.PhaseDownloading, Progress: &api.Progress{
		BytesDone: 3 << 30, BytesTotal: 16 << 30, FilesDone: 2, FilesTotal: 7, BytesPerSecond: 200 << 20, Started: now.Add(-15 * time.Second)}}
	for _, w := range []int{200, 120, 80, 60, 40, 25, 12} {
		line := statusLine(a, w-1, now)
		if n := utf8.RuneCountInString(line); n > w-1 {
			t.Errorf("width %d: %d columns: %q", w, n, line)
		}
		if w >= 60 && (!strings.Contains(line, "200.0 MiB/s") || !strings.Contains(line, "ETA 1m07s")) {
			t.Errorf("width %d: no rate or ETA: %q", w, line)
		}
		if w >= 25 && !strings.Contains(line, "19%") {
			t.Errorf("width %d: no percentage: %q", w, line)
		}
		if w >= 120 && !strings.Contains(line, "3.0 GiB/16.0 GiB 2/7 files") {
			t.Errorf("width %d: no sizes: %q", w, line)
		}
	}
	failing := &api.Artifact{Name: "m", Phase: api.PhasePending, Message: "dial tcp 10.0.0.1:443: connection refused", Attempts: 3}
	next := now.Add(8 * time.Second)
	failing.NextRetry = &next
	if got := statusLine(failing, 0, now); got != "m: Pending — dial tcp 10.0.0.1:443: connection refused (attempt 3; next in 8s)" {
		t.Errorf("a retried pull: %q", got)
	}
}

// A finished pull ends at 100 % with its size and time, once, and the
// progress does not print Ready itself (the command's result line does).
func TestProgressEndsAt100(t *testing.T) {
	line := doneLine("m", 16<<30, time.Now().Add(-80*time.Second), time.Now(), 79)
	if !strings.Contains(line, "=] 100%  16.0 GiB  in 1m20s (204.8 MiB/s)") || utf8.RuneCountInString(line) > 79 {
		t.Errorf("done line %q", line)
	}
	var buf bytes.Buffer
	p := newProgress(&buf) // not a terminal: plain lines
	p.event(api.Event{Artifact: &api.Artifact{Name: "m", Phase: api.PhasePending}})
	p.event(api.Event{Artifact: &api.Artifact{Name: "m", Phase: api.PhaseDownloading, Progress: &api.Progress{BytesDone: 1, BytesTotal: 2}}})
	p.event(api.Event{Artifact: &api.Artifact{Name: "m", Phase: api.PhaseReady}, Done: true})
	p.finish()
	if strings.Contains(buf.String(), "Ready") || !strings.Contains(buf.String(), "50%") {
		t.Errorf("plain progress:\n%s", buf.String())
	}
}

// The amount counts what the percentage counts (cached bytes too); a
// download younger than etaAfter shows no ETA from its first rate.
func TestProgressAmountsAndEarlyETA(t *testing.T) {
	now := time.Now()
	pr := &api.Progress{BytesDone: 100 << 20, BytesSkipped: 500 << 20, BytesTotal: 1000 << 20, FilesDone: 1, FilesTotal: 2, BytesPerSecond: 100 << 10, Started: now.Add(-300 * time.Millisecond)}
	if got := progressText(pr); !strings.Contains(got, "600.0 MiB of 1000.0 MiB (60%)") || !strings.Contains(got, "500.0 MiB of it already cached") {
		t.Errorf("progress text: %q", got)
	}
	a := &api.Artifact{Name: "m", Phase: api.PhaseDownloading, Progress: pr}
	if got := statusLine(a, 0, now); !strings.Contains(got, "ETA --") {
		t.Errorf("a 0.3 s old download: %q; want no ETA yet", got)
	}
	pr.Started = now.Add(-10 * time.Second)
	if got := statusLine(a, 0, now); strings.Contains(got, "ETA --") {
		t.Errorf("a 10 s old download: %q; want an ETA", got)
	}
}
