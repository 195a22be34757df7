package csi

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/modelcache/modelcache/internal/testenv"
)

// TestBindReadOnlyPropagates: a published volume is read-only in every
// copy that mount propagation makes of it, not only in the daemon's own
// mount namespace. In a cluster the daemon's pods directory is shared
// (Bidirectional) with the host's; kubelet binds the host's copy into the
// pod's container, which writes into the store when that copy is
// writable and the pod did not set readOnly: true.
func TestBindReadOnlyPropagates(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (to bind-mount CSI volumes)", "run the tests as root, as CI does")
	}
	dir := t.TempDir()
	src, daemonView, hostView := filepath.Join(dir, "src"), filepath.Join(dir, "daemon"), filepath.Join(dir, "host")
	for _, d := range []string{src, daemonView, hostView} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(src, "w.bin"), []byte("weights"), 0o644); err != nil {
		t.Fatal(err)
	}
	// daemonView and hostView are one shared peer group, as the daemon's
	// Bidirectional mount of the pods directory and the host's.
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(unix.Mount("tmpfs", daemonView, "tmpfs", 0, "size=1m"))
	t.Cleanup(func() { unix.Unmount(daemonView, unix.MNT_DETACH) })
	must(unix.Mount("", daemonView, "", unix.MS_SHARED, ""))
	must(unix.Mount(daemonView, hostView, "", unix.MS_BIND, ""))
	t.Cleanup(func() { unix.Unmount(hostView, unix.MNT_DETACH) })
	must(os.Mkdir(filepath.Join(daemonView, "vol"), 0o750))

	m := sysMounter{}
	must(m.BindReadOnly(src, filepath.Join(daemonView, "vol")))
	t.Cleanup(func() { unix.Unmount(filepath.Join(daemonView, "vol"), unix.MNT_DETACH) })
	for _, view := range []string{daemonView, hostView} {
		got, err := os.ReadFile(filepath.Join(view, "vol", "w.bin"))
		if err != nil || string(got) != "weights" {
			t.Fatalf("%s: the published tree reads %q, %v", view, got, err)
		}
		err = os.WriteFile(filepath.Join(view, "vol", "new"), nil, 0o644)
		if !errors.Is(err, unix.EROFS) {
			t.Errorf("%s: a write into the published volume gave %v, want EROFS (the store would be writable from a pod)", view, err)
		}
		var st unix.Statfs_t
		must(unix.Statfs(filepath.Join(view, "vol"), &st))
		if st.Flags&unix.ST_NOSUID == 0 || st.Flags&unix.ST_NODEV == 0 {
			t.Errorf("%s: mount flags %#x, want nosuid and nodev", view, st.Flags)
		}
	}
	must(m.Unmount(filepath.Join(daemonView, "vol")))
	if mounted, err := m.IsMountPoint(filepath.Join(hostView, "vol")); err != nil || mounted {
		t.Errorf("the unmount did not reach the host's copy (mounted %v, %v)", mounted, err)
	}
}
