package warm

import (
	"fmt"
	"os"
	"sort"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/modelcache/modelcache/internal/testenv"
)

// diskDir is a fresh directory on a disk-backed filesystem (diskBase),
// removed when the test ends.
func diskDir(t testing.TB) string {
	t.Helper()
	base, err := diskBase("")
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

// diskBase is prefer if it is not empty, which must then be on a
// disk-backed filesystem, else the first of TMPDIR and /var/tmp that is:
// the page cache of tmpfs cannot be dropped.
func diskBase(prefer string) (string, error) {
	onDisk := func(dir string) bool {
		var st unix.Statfs_t
		return unix.Statfs(dir, &st) == nil && st.Type != unix.TMPFS_MAGIC && st.Type != unix.RAMFS_MAGIC
	}
	if prefer != "" {
		if !onDisk(prefer) {
			return "", fmt.Errorf("%s is not a directory on a disk-backed filesystem (tmpfs and ramfs keep their pages); name one that is", prefer)
		}
		return prefer, nil
	}
	for _, base := range []string{os.TempDir(), "/var/tmp"} {
		if onDisk(base) {
			return base, nil
		}
	}
	return "", fmt.Errorf("neither %s nor /var/tmp is on a disk-backed filesystem; set TMPDIR to one", os.TempDir())
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
