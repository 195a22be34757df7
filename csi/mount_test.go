package csi

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/modelcache/modelcache/internal/testenv"
)

// findBinds finds the pods' mounts of the store from the mount table as a
// DaemonSet pod sees it: the store is a hostPath whose mount root is the
// host's path, the pods directory another, and the pods' volumes are
// mounts of the host filesystem whose roots lie under the store's path.
func TestFindBinds(t *testing.T) {
	pods := t.TempDir()
	uid := "7c1d0d8e-1111-4a4a-9f9f-000000000001"
	target := filepath.Join(pods, uid, "volumes", "kubernetes.io~csi", "model", "mount")
	other := filepath.Join(pods, uid, "volumes", "kubernetes.io~csi", "other", "mount")
	bare := filepath.Join(pods, "uid-2", "volumes", "kubernetes.io~csi", "weights", "mount")
	for _, d := range []string{target, other, bare} {
		os.MkdirAll(d, 0o750)
	}
	os.WriteFile(filepath.Join(filepath.Dir(target), "vol_data.json"), []byte(`{"driverName":"csi.modelcache.io","volumeHandle":"csi-abc","specVolID":"model"}`), 0o600)
	os.WriteFile(filepath.Join(filepath.Dir(other), "vol_data.json"), []byte(`{"driverName":"other.example.com","volumeHandle":"x"}`), 0o600)
	mountinfo := fmt.Sprintf(`20 1 0:50 / / rw - overlay overlay rw
30 20 259:1 /var/lib/modelcache /var/lib/modelcache rw - ext4 /dev/nvme0n1p1 rw
31 20 259:1 /var/lib/kubelet/pods %[1]s rw - ext4 /dev/nvme0n1p1 rw
40 31 259:1 /var/lib/modelcache/models/llama/abc123 %[2]s ro,nosuid,nodev - ext4 /dev/nvme0n1p1 rw
41 31 259:1 /var/lib/modelcache/models/llama/abc123 %[3]s ro - ext4 /dev/nvme0n1p1 rw
42 31 259:1 /var/lib/modelcache/holds/ff/tree %[4]s ro - ext4 /dev/nvme0n1p1 rw
43 31 259:1 /var/lib/modelcache/models/old/r1//deleted %[1]s/x ro - ext4 /dev/nvme0n1p1 rw
44 31 259:2 /var/lib/modelcache/models/llama/abc123 %[1]s/y ro - ext4 /dev/sdb rw
45 20 259:1 /var/lib/modelcache/models/llama/abc123 /mnt/elsewhere ro - ext4 /dev/nvme0n1p1 rw
46 31 259:1 /var/lib/modelcachex/models/llama/abc123 %[1]s/z ro - ext4 /dev/nvme0n1p1 rw
`, pods, target, other, bare)
	mounts, err := parseMountinfo([]byte(mountinfo))
	if err != nil {
		t.Fatal(err)
	}
	got := findBinds(mounts, pods, "/var/lib/modelcache")
	want := []Bind{
		{Rel: "models/llama/abc123", Volume: Volume{ID: "csi-abc", Target: target, PodUID: uid}},
		{Rel: "holds/ff/tree", Volume: Volume{ID: fmt.Sprintf("csi-%x", sha256.Sum256([]byte("uid-2weights"))), Target: bare, PodUID: "uid-2"}},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("findBinds:\n got %+v\nwant %+v", got, want)
	}
}

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

	tg, err := openTarget(dir, filepath.Join(daemonView, "vol"))
	must(err)
	defer tg.Close()
	must(tg.bindReadOnly(slog.New(slog.DiscardHandler), src))
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
	if unmounted, err := tg.unmountTop(); err != nil || !unmounted {
		t.Fatalf("unmount: %v, %v", unmounted, err)
	}
	if mounted, err := isMountPoint(filepath.Join(hostView, "vol")); err != nil || mounted {
		t.Errorf("the unmount did not reach the host's copy (mounted %v, %v)", mounted, err)
	}
}

// isMountPoint reports whether path is a mount point, from
// /proc/self/mountinfo (a bind mount of a directory on the same
// filesystem has the same device, so stat cannot tell); false when path
// does not exist. The driver checks targets by descriptor
// (target.mounted); tests look from outside.
func isMountPoint(path string) (bool, error) {
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return false, err
	}
	mounts, err := readMountinfo()
	if err != nil {
		return false, err
	}
	for _, m := range mounts {
		if m.point == real {
			return true, nil
		}
	}
	return false, nil
}
