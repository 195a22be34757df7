package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
)

// TestInspectShowsBytesFromPeers: inspect says how much of the last pull
// came from peers, and which files from which peers; a pull without
// peers says nothing of them.
func TestInspectShowsBytesFromPeers(t *testing.T) {
	now := time.Now()
	a := &api.Artifact{Name: "m", Phase: api.PhaseReady, Revision: "r1", LastPull: &api.PullStats{Seconds: 3, At: now, BytesFetched: 3 << 20,
		BytesFromPeers: 2 << 20, FilesFromPeers: map[string][]string{"b.safetensors": {"http://10.0.0.8:7435"}, "a.safetensors": {"http://10.0.0.7:7435", "http://10.0.0.9:7435"}}}}
	var out bytes.Buffer
	describe(&out, a, now)
	s := out.String()
	for _, want := range []string{"From peers:", "2.0 MiB of 3.0 MiB", "a.safetensors:", "http://10.0.0.7:7435, http://10.0.0.9:7435", "b.safetensors:"} {
		if !strings.Contains(s, want) {
			t.Errorf("inspect lacks %q:\n%s", want, s)
		}
	}
	if strings.Index(s, "a.safetensors") > strings.Index(s, "b.safetensors") {
		t.Errorf("files not in order:\n%s", s)
	}
	a.LastPull.BytesFromPeers, a.LastPull.FilesFromPeers = 0, nil
	out.Reset()
	describe(&out, a, now)
	if strings.Contains(out.String(), "peers") {
		t.Errorf("a pull without peers mentions them:\n%s", out.String())
	}
}
