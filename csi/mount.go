package csi

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
	regpb "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// mounter is the kernel's side; sysMounter is the real one.
type mounter interface {
	BindReadOnly(src, target string) error
	Unmount(target string) error
	IsMountPoint(path string) (bool, error)
}

// sysMounter is the kernel's mount API; log takes its one warning.
type sysMounter struct{ log *slog.Logger }

// BindReadOnly bind-mounts src at target read-only, nosuid, nodev.
//
// The bind is made read-only before it is attached (open_tree,
// mount_setattr, move_mount): the copies that mount propagation makes of
// it (kubelet's view of the pods directory, shared Bidirectional from the
// daemon's container) are then read-only too. A bind followed by a
// read-only remount changes only the daemon's own copy, so the host and
// a pod whose volume is not readOnly: true would get a writable view of
// the store. Kernels before 5.12 (no mount_setattr) get the bind and the
// remount, with a warning at the first publish; a failed remount undoes
// the bind.
func (m sysMounter) BindReadOnly(src, target string) error {
	err := bindDetachedReadOnly(src, target)
	if !errors.Is(err, unix.ENOSYS) {
		return err
	}
	oldKernel.Do(func() {
		m.log.Warn("csi: this kernel has no mount_setattr (Linux 5.12+): published volumes are read-only in the daemon's mount namespace only; pods must set readOnly: true on the volume")
	})
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		unix.Unmount(target, unix.MNT_DETACH)
		return fmt.Errorf("remount read-only: %w", err)
	}
	return nil
}

var oldKernel sync.Once

// bindDetachedReadOnly clones src as a detached mount, sets it read-only,
// nosuid, nodev, and only then attaches it at target. ENOSYS: the kernel
// lacks the new mount API.
func bindDetachedReadOnly(src, target string) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		if errors.Is(err, unix.ENOSYS) {
			return err
		}
		return fmt.Errorf("bind %s: %w", src, err)
	}
	defer unix.Close(fd) // an unattached clone goes with its descriptor
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		if errors.Is(err, unix.ENOSYS) {
			return err
		}
		return fmt.Errorf("bind %s read-only: %w", src, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("bind %s at %s: %w", src, target, err)
	}
	return nil
}

// Unmount unmounts target; a busy mount is detached (lazily unmounted),
// as kubelet has stopped the pod's containers by now.
func (sysMounter) Unmount(target string) error {
	err := unix.Unmount(target, 0)
	if errors.Is(err, unix.EBUSY) {
		err = unix.Unmount(target, unix.MNT_DETACH)
	}
	if errors.Is(err, unix.EINVAL) { // not a mount point after all (raced)
		return nil
	}
	return err
}

// IsMountPoint reports whether path is a mount point, from
// /proc/self/mountinfo (a bind mount of a directory on the same
// filesystem has the same device, so stat cannot tell); false when path
// does not exist.
func (sysMounter) IsMountPoint(path string) (bool, error) {
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

// mountInfo is one line of /proc/self/mountinfo: the filesystem's device
// (major:minor), the directory of that filesystem the mount shows (its
// root), and where it is mounted.
type mountInfo struct{ dev, root, point string }

func readMountinfo() ([]mountInfo, error) {
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	return parseMountinfo(raw)
}

func parseMountinfo(raw []byte) ([]mountInfo, error) {
	var out []mountInfo
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 4 {
			out = append(out, mountInfo{dev: f[2], root: unescapeMountinfo(f[3]), point: unescapeMountinfo(f[4])})
		}
	}
	return out, sc.Err()
}

// Bind is a mount under kubelet's pods directory that shows a directory
// of the store (FindBinds).
type Bind struct {
	// Rel is the directory the mount shows, relative to the store root
	// ("models/llama/<revision>").
	Rel string
	// Volume is what kubelet says of the mount: Target, and from
	// vol_data.json beside it and the path, the volume ID and pod UID.
	Volume Volume
}

// FindBinds lists the mounts under podsDir that show a directory under
// root: same filesystem (device) as root, and a mount root under root's
// path within that filesystem (which holds in any mount namespace, so a
// DaemonSet pod sees the host's mounts the same way). It is how the
// daemon finds the volumes it published when its records of them are
// lost. Mounts of deleted directories and of other drivers (vol_data.json
// names another) are left out.
func FindBinds(podsDir, root string) ([]Bind, error) {
	mounts, err := readMountinfo()
	if err != nil {
		return nil, err
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return nil, err
	}
	realPods, err := filepath.EvalSymlinks(podsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return findBinds(mounts, realPods, realRoot), nil
}

func findBinds(mounts []mountInfo, pods, root string) []Bind {
	// The mount root lies on: the last mount (the one on top) at the
	// longest mount point that contains it.
	var on *mountInfo
	for i := range mounts {
		m := &mounts[i]
		if m.point == root || m.point == "/" || strings.HasPrefix(root, m.point+"/") {
			if on == nil || len(m.point) >= len(on.point) {
				on = m
			}
		}
	}
	if on == nil {
		return nil
	}
	rel, _ := filepath.Rel(on.point, root)
	fsRoot := filepath.Join(on.root, rel) // root's path within its filesystem
	var out []Bind
	for _, m := range mounts {
		if m.dev != on.dev || !under(pods, m.point) || strings.HasSuffix(m.root, "//deleted") {
			continue
		}
		r, err := filepath.Rel(fsRoot, m.root)
		if err != nil || r == "." || r == ".." || strings.HasPrefix(r, "../") {
			continue
		}
		v, ok := kubeletVolume(pods, m.point)
		if !ok {
			continue
		}
		out = append(out, Bind{Rel: r, Volume: v})
	}
	return out
}

// kubeletVolume reads what kubelet recorded of the volume mounted at
// target: <pods>/<pod uid>/volumes/kubernetes.io~csi/<volume>/mount, with
// vol_data.json beside it naming the driver and the volume handle. Without
// vol_data.json the handle is kubelet's for an inline volume
// ("csi-" + sha256(pod uid + volume name)). ok is false when vol_data.json
// names another driver.
func kubeletVolume(pods, target string) (Volume, bool) {
	v := Volume{Target: target, ID: "target:" + target}
	rel, _ := filepath.Rel(pods, target)
	parts := strings.Split(rel, "/")
	if len(parts) == 5 && parts[1] == "volumes" && parts[2] == "kubernetes.io~csi" && parts[4] == "mount" {
		v.PodUID = parts[0]
		v.ID = fmt.Sprintf("csi-%x", sha256.Sum256([]byte(parts[0]+parts[3])))
	}
	raw, err := os.ReadFile(filepath.Join(filepath.Dir(target), "vol_data.json"))
	if err != nil {
		return v, true
	}
	var data struct {
		Driver string `json:"driverName"`
		Handle string `json:"volumeHandle"`
	}
	if json.Unmarshal(raw, &data) != nil {
		return v, true
	}
	if data.Driver != "" && data.Driver != DriverName {
		return v, false
	}
	if data.Handle != "" {
		v.ID = data.Handle
	}
	return v, true
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space).
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			ok := true
			for _, d := range s[i+1 : i+4] {
				if d < '0' || d > '7' {
					ok = false
					break
				}
				c = c*8 + byte(d-'0')
			}
			if ok {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// registration answers kubelet's plugin watcher.
type registration struct {
	regpb.UnimplementedRegistrationServer
	endpoint string
	log      *slog.Logger
}

func (r *registration) GetInfo(context.Context, *regpb.InfoRequest) (*regpb.PluginInfo, error) {
	return &regpb.PluginInfo{Type: regpb.CSIPlugin, Name: DriverName, Endpoint: r.endpoint, SupportedVersions: []string{"1.0.0"}}, nil
}

func (r *registration) NotifyRegistrationStatus(_ context.Context, st *regpb.RegistrationStatus) (*regpb.RegistrationStatusResponse, error) {
	if st.GetPluginRegistered() {
		r.log.Info("csi: kubelet registered the driver", "driver", DriverName)
	} else {
		r.log.Error("csi: kubelet refused the driver's registration", "driver", DriverName, "err", st.GetError())
	}
	return &regpb.RegistrationStatusResponse{}, nil
}
