package modelcache_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencyDirection holds the package graph of the design map:
// cachestore and api import no other package of this module; fetchers
// import neither the store nor the daemon; gpu imports only api; only cmd/ and tests import the daemon.
func TestDependencyDirection(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...").Output()
	if err != nil {
		t.Fatal(err)
	}
	const mod = "github.com/modelcache/modelcache/"
	forbidden := map[string][]string{
		"cachestore": {""}, // nothing of the module
		"api":        {""}, // nothing of the module
		"fetchers":   {"cachestore", "daemon", "api"},
		"gpu":        {"cachestore", "daemon", "fetchers"}, // api only: its types are the wire format
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(f[0], mod)
		for _, imp := range f[1:] {
			if !strings.HasPrefix(imp, mod) {
				continue
			}
			dep := strings.TrimPrefix(imp, mod)
			for prefix, bad := range forbidden {
				if pkg != prefix && !strings.HasPrefix(pkg, prefix+"/") {
					continue
				}
				for _, b := range bad {
					if strings.HasPrefix(dep, b) && !strings.HasPrefix(dep, prefix) {
						t.Errorf("%s imports %s: against the design's dependency direction", pkg, dep)
					}
				}
			}
			if dep == "daemon" && !strings.HasPrefix(pkg, "cmd/") && !strings.HasPrefix(pkg, "daemon") {
				t.Errorf("%s imports the daemon; only cmd/ may", pkg)
			}
		}
	}
}
