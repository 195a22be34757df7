package k8ssync

import (
	"slices"
	"testing"
)

// TestArtifactsUnder: a pod's hostPath holds the artifacts whose trees it
// exposes, public (models/, kernels/) or private (private/…, where the
// store keeps private artifacts); a path outside the trees holds none.
func TestArtifactsUnder(t *testing.T) {
	const root = "/var/lib/modelcache"
	all := func() []string { return []string{"a", "b"} }
	for p, want := range map[string][]string{
		root:                                   {"a", "b"},
		root + "/":                             {"a", "b"},
		root + "/models":                       {"a", "b"},
		root + "/private":                      {"a", "b"},
		root + "/private/models/":              {"a", "b"},
		root + "/models/a/current":             {"a"},
		root + "/private/models/b/r1/sub":      {"b"},
		root + "/private/kernels/k":            {"k"},
		root + "/kernels/k/current":            {"k"},
		root + "/hf/models--x--y":              nil,
		root + "/blobs":                        nil,
		root + "/private/blobs":                nil,
		root + "-other/models/a":               nil,
		"/var/lib/other/private/models/a/curr": nil,
	} {
		if got := artifactsUnder(root, p, all); !slices.Equal(got, want) {
			t.Errorf("artifactsUnder(%q) = %q, want %q", p, got, want)
		}
	}
}
