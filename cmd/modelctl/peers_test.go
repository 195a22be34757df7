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

// TestInspectFilesNameTheirPeers: the current version's file list says
// which peers sent each file's bytes (kept in the manifest: it outlives
// the last pull's stats), and nothing for a file the origin sent.
func TestInspectFilesNameTheirPeers(t *testing.T) {
	now := time.Now()
	a := &api.Artifact{Name: "m", Phase: api.PhaseReady, Revision: "r1", Versions: []api.Version{{Revision: "r1", State: "ready", Created: now,
		Files: []api.File{{Path: "config.json", Size: 10, Digest: "sha256:aa"}, {Path: "w.safetensors", Size: 1 << 20, Digest: "sha256:bb", Peers: []string{"http://10.0.0.7:7435", "http://10.0.0.9:7435"}}}}}}
	var out bytes.Buffer
	describe(&out, a, now)
	for _, line := range strings.Split(out.String(), "\n") {
		switch {
		case strings.Contains(line, "w.safetensors") && !strings.Contains(line, "(from peers: http://10.0.0.7:7435, http://10.0.0.9:7435)"):
			t.Errorf("the shard's line does not name its peers: %q", line)
		case strings.Contains(line, "config.json") && strings.Contains(line, "peers"):
			t.Errorf("a file the origin sent names peers: %q", line)
		}
	}
	if !strings.Contains(out.String(), "w.safetensors") {
		t.Errorf("no file list:\n%s", out.String())
	}
}
