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

	"golang.org/x/sys/unix"
	regpb "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// mounter is the kernel's side; sysMounter is the real one.
type mounter interface {
	BindReadOnly(src, target string) error
	Unmount(target string) error
	IsMountPoint(path string) (bool, error)
}

type sysMounter struct{}

// BindReadOnly bind-mounts src at target, then remounts the bind
// read-only, nosuid, nodev (a bind takes its flags only on a remount).
// A failed remount undoes the bind.
func (sysMounter) BindReadOnly(src, target string) error {
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		unix.Unmount(target, unix.MNT_DETACH)
		return fmt.Errorf("remount read-only: %w", err)
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
