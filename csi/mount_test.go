package csi

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"testing"
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
