package csi

import (
	"bufio"
	"bytes"
	"context"
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
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 4 && unescapeMountinfo(f[4]) == real {
			return true, nil
		}
	}
	return false, sc.Err()
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
