package warm

import (
	"os"
	"sort"
	"testing"

	"github.com/modelcache/modelcache/internal/testenv"
)

// diskDir is a fresh directory on a disk-backed filesystem (testenv.DiskBase),
// removed when the test ends.
func diskDir(t testing.TB) string {
	t.Helper()
	base, err := testenv.DiskBase("")
	if err != nil {
		t.Fatal(err)
	}
	d, err := os.MkdirTemp(base, "warm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// drop writes back and drops the page cache of every file of the tree,
// and checks that nothing of it is resident.
func drop(t testing.TB, dir string) {
	t.Helper()
	if err := testenv.DropPageCache(dir); err != nil {
		t.Fatal(err)
	}
	if r, total, err := Resident(dir); err != nil || r > total/100 {
		t.Fatalf("after dropping the page cache of %s: %d of %d bytes resident (%v)", dir, r, total, err)
	}
}

func sortedNames(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
