package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
)

// TestHolderTextIsOneForm: list's IN USE column and inspect's "In use by"
// write a holder the same way ("pod ns/name", as a ModelCacheNode's
// inUseBy does), not "pod:ns/name" in one and "pod ns/name" in the other.
func TestHolderTextIsOneForm(t *testing.T) {
	now := time.Now()
	hs := []api.Holder{{Kind: "pod", ID: "ml/server-0", Revision: "r1"}, {Kind: "lease", ID: "batch-9", Revision: "r1"}}
	done := time.Date(2026, 11, 23, 10, 0, 30, 0, time.UTC)
	a := &api.Artifact{Name: "m", Phase: api.PhaseReady, Revision: "r1", InUse: hs, LastPull: &api.PullStats{Seconds: 30, At: done}}
	var list, inspect bytes.Buffer
	listTable(&list, []api.ArtifactRow{a.Row()}, now, false, false)
	describe(&inspect, a, now)
	for _, c := range []struct{ what, out, want string }{
		{"list", list.String(), "pod ml/server-0 (+1)"},
		{"inspect", inspect.String(), "pod ml/server-0, lease batch-9"},
		{"inspect", inspect.String(), "started 2026-11-23T10:00:00Z, completed 2026-11-23T10:00:30Z"},
	} {
		if !strings.Contains(c.out, c.want) {
			t.Errorf("%s does not show %q:\n%s", c.what, c.want, c.out)
		}
		if strings.Contains(c.out, "pod:") {
			t.Errorf("%s writes a holder as pod:…:\n%s", c.what, c.out)
		}
	}
	if got := hs[0].String(); got != "pod ml/server-0" {
		t.Errorf("Holder.String() = %q", got)
	}
}
