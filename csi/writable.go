package csi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A writable kernel cache (volumeAttributes.kernelCacheWritable): the
// volume is an overlayfs whose lower layer is the held tree (the model,
// and its kernel caches with kernelCaches: auto) and whose upper layer is
// the volume's own, on a tmpfs of the size asked for, in
// Config.WritableDir. What the pod's frameworks compile (Triton writes
// every new kernel into TRITON_CACHE_DIR) lands in that layer, bounded:
// a full layer is ENOSPC in the pod, never the node's disk. Overlayfs
// writes only to its upper layer (a change to a file of the tree copies
// it up first), so the store's bytes cannot change through the volume;
// the tree's files are read-only hardlinks of the store's blobs besides.
// The layer goes at unpublish, unless the Backend keeps a copy of it
// first (LayerKeeper: the daemon does for a model that allows capture).

// Default and largest size of a writable layer.
const (
	DefaultWritableSize = 1 << 30
	MaxWritableSize     = 64 << 30
)

// AttrKernelCacheWritable asks for a writable kernel cache: "true" (of
// DefaultWritableSize) or a size (512Mi, 2Gi).
const AttrKernelCacheWritable = "kernelCacheWritable"

// parseWritable reads the attribute: 0 when absent.
func parseWritable(s string) (int64, error) {
	switch s {
	case "", "false":
		return 0, nil
	case "true":
		return DefaultWritableSize, nil
	}
	num, mult := s, int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40}} {
		if n, ok := strings.CutSuffix(s, u.suffix); ok {
			num, mult = n, u.m
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n <= 0 || n > MaxWritableSize/mult {
		return 0, fmt.Errorf("volumeAttributes.%s %q: use \"true\" (%d MiB) or a size up to 64Gi such as 512Mi or 2Gi", AttrKernelCacheWritable, s, DefaultWritableSize>>20)
	}
	return n * mult, nil
}

// layerDir is the directory of volume id's writable layer (a tmpfs with
// upper/ and work/ in it).
func (d *Driver) layerDir(id string) string {
	sum := sha256.Sum256([]byte(id))
	return filepath.Join(d.cfg.WritableDir, hex.EncodeToString(sum[:12]))
}

// LayerDir is where volume id's writable layer lies (its upper directory
// is upper/ in it), for capture; "" when the driver has no writable dir.
func (d *Driver) LayerDir(id string) string { return d.layerDir(id) }

// mountWritable makes the volume's writable layer and mounts the overlay
// of tree and that layer at the target; on failure nothing is left.
func (d *Driver) mountWritable(t *target, tree string, v Volume) (err error) {
	if strings.ContainsAny(tree, ",:\\") {
		return fmt.Errorf("tree %s: overlayfs cannot take a path with ',', ':' or '\\' (the store root's path)", tree)
	}
	dir := d.layerDir(v.ID)
	if err := d.removeLayer(v.ID); err != nil { // left by a publish that failed half-way
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,mode=0700", v.Writable)); err != nil {
		os.Remove(dir)
		return fmt.Errorf("the writable layer's tmpfs: %w", err)
	}
	defer func() {
		if err != nil {
			d.removeLayer(v.ID)
		}
	}()
	upper, work := filepath.Join(dir, "upper"), filepath.Join(dir, "work")
	if err := os.Mkdir(upper, 0o755); err != nil {
		return err
	}
	if err := os.Mkdir(work, 0o700); err != nil {
		return err
	}
	created, err := t.mkdir()
	if err != nil {
		return err
	}
	d.mountMu.Lock()
	err = t.overlay(tree, upper, work)
	d.mountMu.Unlock()
	if err != nil && created {
		t.rmdir()
	}
	return err
}

// keepLayer hands volume id's writable layer, if it has one, to the
// Backend to keep (LayerKeeper) before it goes.
func (d *Driver) keepLayer(ctx context.Context, id string) {
	k, ok := d.backend.(LayerKeeper)
	if !ok || d.cfg.WritableDir == "" {
		return
	}
	upper := filepath.Join(d.layerDir(id), "upper")
	if fi, err := os.Lstat(upper); err != nil || !fi.IsDir() {
		return
	}
	if err := k.KeepLayer(ctx, id, upper); err != nil {
		d.log.Error("csi: keeping the writable layer of a volume for capture; it goes with the volume", "volume", id, "err", err)
	}
}

// removeLayer unmounts and removes volume id's writable layer; none is
// no error.
func (d *Driver) removeLayer(id string) error {
	if d.cfg.WritableDir == "" {
		return nil
	}
	dir := d.layerDir(id)
	if _, err := os.Lstat(dir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	for i := 0; i < 4; i++ { // a tmpfs mounted twice by a crash between mount and record comes off whole
		if err := unix.Unmount(dir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
			if errors.Is(err, unix.EINVAL) { // not a mount point: done
				break
			}
			return fmt.Errorf("unmounting the writable layer %s: %w", dir, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("removing the writable layer %s: %w", dir, err)
	}
	return nil
}

// overlay mounts an overlayfs of lower (read-only) and upper at the
// target, nosuid and nodev, by descriptors as bindReadOnly does: built
// detached (fsopen, fsconfig, fsmount) and attached with move_mount to
// the descriptor the mount-point check opened.
func (t *target) overlay(lower, upper, work string) error {
	fd, mounted, err := t.top()
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if mounted {
		return errMounted
	}
	fs, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if errors.Is(err, unix.ENOSYS) {
		opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
		if err := unix.Mount("overlay", procFD(fd), "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return fmt.Errorf("overlay of %s: %w", lower, err)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("overlay: %w", err)
	}
	defer unix.Close(fs)
	for _, kv := range [][2]string{{"lowerdir", lower}, {"upperdir", upper}, {"workdir", work}} {
		if err := unix.FsconfigSetString(fs, kv[0], kv[1]); err != nil {
			return fmt.Errorf("overlay %s=%s: %w", kv[0], kv[1], err)
		}
	}
	if err := unix.FsconfigCreate(fs); err != nil {
		return fmt.Errorf("overlay of %s: %w", lower, err)
	}
	mfd, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return fmt.Errorf("overlay of %s: %w", lower, err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", fd, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("overlay of %s: %w", lower, err)
	}
	return nil
}

// removeStaleLayers removes the writable layers of volumes no longer
// mounted (their pod went while the daemon was down, or the node
// rebooted: then they are empty directories), all but keep's.
func (d *Driver) removeStaleLayers(keep map[string]bool) {
	es, err := os.ReadDir(d.cfg.WritableDir)
	if err != nil {
		return
	}
	for _, e := range es {
		if keep[e.Name()] || !e.IsDir() {
			continue
		}
		dir := filepath.Join(d.cfg.WritableDir, e.Name())
		for unix.Unmount(dir, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW) == nil {
		}
		if err := os.RemoveAll(dir); err != nil {
			d.log.Warn("csi: removing a stale writable layer", "dir", dir, "err", err)
			continue
		}
		d.log.Info("csi: removed the writable layer of a volume no longer mounted", "dir", dir)
	}
}
