package daemon

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestDocsNameRoutesAndEvictionReasons: the socket API table of
// docs/consumers.md lists every route the daemon serves, and
// docs/metrics.md names every reason modelcache_evictions_total counts.
func TestDocsNameRoutesAndEvictionReasons(t *testing.T) {
	b, err := os.ReadFile("../docs/consumers.md")
	if err != nil {
		t.Fatal(err)
	}
	table := string(b)
	if i := strings.Index(table, "## Socket API"); i >= 0 {
		table = table[i:]
	}
	rows := regexp.MustCompile("(?m)^\\| `([^|]*)` \\|.*$").FindAllStringSubmatch(table, -1)
	if len(rows) == 0 {
		t.Fatal("docs/consumers.md has no socket API table")
	}
	h := start(t, testConfig(t))
	for _, rt := range h.d.routeTable() {
		method, path, _ := strings.Cut(rt.pattern, " ")
		found := false
		for _, r := range rows {
			if strings.Contains(r[1], method+" ") && routeInCell(r[1], path) {
				found = true
			}
		}
		if !found {
			t.Errorf("docs/consumers.md's socket API table lacks %s", rt.pattern)
		}
	}
	m, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range evictionReasons {
		if !strings.Contains(string(m), "`"+r+"`") {
			t.Errorf("docs/metrics.md does not name modelcache_evictions_total's reason %q", r)
		}
	}
}

// routeInCell: the cell names path in full, or as a suffix after a route
// of the same cell ("`/unpin`", "`…/lease`").
func routeInCell(cell, path string) bool {
	if strings.Contains(cell, path) {
		return true
	}
	last := path[strings.LastIndex(path, "/"):]
	return strings.Contains(cell, "`"+last) || strings.Contains(cell, ", "+last) || strings.Contains(cell, "…"+last)
}
