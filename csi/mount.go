package csi

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// The kernel's side of publish and unpublish works on descriptors, never
// on the target's path after it is resolved once (openTarget): a
// directory of the path swapped for a symlink during a call cannot move
// a mount, an unmount or an rmdir elsewhere.

// target is a publish or unpublish target resolved once: its parent
// directory, opened beneath kubelet's pods directory following no
// symlink (openDirBeneath), and its name in that parent. mkdir, the
// mount-point check, the mount, the unmount and the rmdir all go through
// the parent's descriptor. Close it when done.
type target struct {
	path      string
	parent    int    // O_PATH descriptor of the parent directory
	name      string // the target's name in parent
	parentMnt uint64 // the mount ID of parent
}

// openTarget resolves the parent of path (clean, absolute, strictly under
// pods) beneath pods. Errors are the kernel's: ENOENT (a directory of the
// path is missing), ELOOP or ENOTDIR (a symlink or a file on the way),
// EXDEV (it leads out).
func openTarget(pods, path string) (*target, error) {
	rel, err := filepath.Rel(pods, filepath.Dir(path))
	if err != nil {
		return nil, err
	}
	root, err := unix.Open(pods, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0) // the pods directory itself may be a symlink: it is configuration
	if err != nil {
		return nil, &podsDirError{err}
	}
	defer unix.Close(root)
	parent, err := openDirBeneath(root, rel)
	if err != nil {
		return nil, err
	}
	mnt, err := mountID(parent)
	if err != nil {
		unix.Close(parent)
		return nil, err
	}
	return &target{path: path, parent: parent, name: filepath.Base(path), parentMnt: mnt}, nil
}

func (t *target) Close() { unix.Close(t.parent) }

// podsDirError: the pods directory itself cannot be opened.
type podsDirError struct{ err error }

func (e *podsDirError) Error() string { return "pods directory: " + e.err.Error() }
func (e *podsDirError) Unwrap() error { return e.err }

// keyedMutex is a mutex per key, made at first use and dropped when no
// caller holds or waits for it. The zero value is ready.
type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*keyedEntry
}

type keyedEntry struct {
	sync.Mutex
	refs int // callers holding or waiting
}

// lock locks key and returns its unlock.
func (k *keyedMutex) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*keyedEntry{}
	}
	e := k.m[key]
	if e == nil {
		e = &keyedEntry{}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	e.Lock()
	return func() {
		e.Unlock()
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}

// top opens the target beneath its parent (no symlink), which lands on
// the mount on top of it when there is one; mounted says whether there
// is: the descriptor is on another mount than the parent. ENOENT when
// the target does not exist.
func (t *target) top() (fd int, mounted bool, err error) {
	fd, err = openDirBeneath(t.parent, t.name)
	if err != nil {
		return -1, false, err
	}
	mnt, err := mountID(fd)
	if err != nil {
		unix.Close(fd)
		return -1, false, err
	}
	return fd, mnt != t.parentMnt, nil
}

// mounted says whether something is mounted on the target (false when
// it does not exist).
func (t *target) mounted() (bool, error) {
	fd, mounted, err := t.top()
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	unix.Close(fd)
	return mounted, nil
}

// mkdir creates the target directory in its parent; created is false
// when it was there already.
func (t *target) mkdir() (created bool, err error) {
	err = unix.Mkdirat(t.parent, t.name, 0o750)
	if errors.Is(err, unix.EEXIST) {
		return false, nil
	}
	return err == nil, err
}

// rmdir removes the target directory from its parent; gone already is
// no error.
func (t *target) rmdir() error {
	err := unix.Unlinkat(t.parent, t.name, unix.AT_REMOVEDIR)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

// errMounted: the target has a mount on it already.
var errMounted = errors.New("something is mounted there already")

// bindReadOnly bind-mounts src at the target read-only, nosuid, nodev,
// unless something is mounted there (errMounted): the check and the
// mount use one descriptor of the target, so nothing is stacked on a
// mount the check saw. Callers serialise bindReadOnly calls (Driver's
// mountMu), so no other publish mounts between the check and the mount.
//
// The bind is made read-only before it is attached (open_tree,
// mount_setattr, move_mount): the copies that mount propagation makes of
// it (kubelet's view of the pods directory, shared Bidirectional from the
// daemon's container) are then read-only too. A bind followed by a
// read-only remount changes only the daemon's own copy, so the host and
// a pod whose volume is not readOnly: true would get a writable view of
// the store. Kernels before 5.12 (no mount_setattr) get the bind and the
// remount, with a warning (log) at the first publish; a failed remount
// undoes the bind.
func (t *target) bindReadOnly(log *slog.Logger, src string) error {
	fd, mounted, err := t.top()
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if mounted {
		return errMounted
	}
	err = bindDetachedReadOnly(src, fd)
	if !errors.Is(err, unix.ENOSYS) {
		return err
	}
	oldKernel.Do(func() {
		log.Warn("csi: this kernel has no mount_setattr (Linux 5.12+): published volumes are read-only in the daemon's mount namespace only; pods must set readOnly: true on the volume")
	})
	// mount(2) follows the descriptor's magic link to the directory it
	// holds; the remount goes to the new mount, found the same way.
	if err := unix.Mount(src, procFD(fd), "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	top, mounted, err := t.top()
	if err == nil && !mounted {
		unix.Close(top)
		err = errors.New("the bind is not on the target")
	}
	if err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	defer unix.Close(top)
	if err := unix.Mount("", procFD(top), "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		unix.Unmount(procFD(top), unix.MNT_DETACH)
		return fmt.Errorf("remount read-only: %w", err)
	}
	return nil
}

var oldKernel sync.Once

// bindDetachedReadOnly clones src as a detached mount, sets it read-only,
// nosuid, nodev, and only then attaches it at dst, a descriptor of the
// target directory. ENOSYS: the kernel lacks the new mount API.
func bindDetachedReadOnly(src string, dst int) error {
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
	if err := unix.MoveMount(fd, "", dst, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
		return fmt.Errorf("bind %s: %w", src, err)
	}
	return nil
}

// unmountTop unmounts the mount on top of the target; false when there
// is none.
//
// Which mount goes is decided by a descriptor, not by a path: top opens
// the target beneath its parent and lands on the mount on top of it, and
// its mount ID shows it is a mount and not the parent's directory. The
// unmount then names that descriptor through /proc/self/fd/N: the kernel
// follows the magic link to exactly the mount the descriptor holds and
// looks up no name after it, so no directory swapped for a symlink since
// can send the unmount elsewhere. (Unmounting the path, even one
// beneath the parent's descriptor, would look the name up again: between
// the check and the unmount another mount could be renamed into that
// place, and would be the one unmounted.) The price: a descriptor on a
// mount keeps it busy, so a plain umount of it fails with EBUSY; the
// unmount is lazy (MNT_DETACH), which is what a busy volume got before,
// and kubelet calls NodeUnpublishVolume only once the pod's containers
// are gone. A lazy unmount propagates to the mount's peers (kubelet's
// view of the pods directory) like a plain one.
func (t *target) unmountTop() (bool, error) {
	fd, mounted, err := t.top()
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	if !mounted {
		return false, nil
	}
	if err := unix.Unmount(procFD(fd), unix.MNT_DETACH); err != nil {
		return false, fmt.Errorf("unmount: %w", err)
	}
	return true, nil
}

func procFD(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// openDirBeneath opens the directory rel (relative, clean, no "..")
// beneath dirfd as an O_PATH descriptor, following no symlink on the way
// (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS; ELOOP at a symlink).
// Mounts on the way are crossed. Kernels before 5.6 (no openat2) get the
// same walk one component at a time, each opened O_NOFOLLOW|O_DIRECTORY.
func openDirBeneath(dirfd int, rel string) (int, error) {
	how := unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, rel, &how)
		if errors.Is(err, unix.ENOSYS) {
			return walkDirBeneath(dirfd, rel)
		}
		// EAGAIN: a rename elsewhere raced the resolution; try again.
		if (errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR)) && i < 16 {
			continue
		}
		return fd, err
	}
}

// walkDirBeneath is openDirBeneath without openat2.
func walkDirBeneath(dirfd int, rel string) (int, error) {
	fd := dirfd
	for _, name := range strings.Split(rel, "/") {
		if name == "" || name == ".." {
			if fd != dirfd {
				unix.Close(fd)
			}
			return -1, unix.EXDEV
		}
		next, err := unix.Openat(fd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if fd != dirfd {
			unix.Close(fd)
		}
		if err != nil {
			return -1, err
		}
		fd = next
	}
	return fd, nil
}

// mountID is the ID of the mount fd is on (statx STATX_MNT_ID, Linux
// 5.8; before it, /proc/self/fdinfo).
func mountID(fd int) (uint64, error) {
	var st unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &st); err != nil {
		return 0, err
	}
	if st.Mask&unix.STATX_MNT_ID != 0 {
		return st.Mnt_id, nil
	}
	raw, err := os.ReadFile("/proc/self/fdinfo/" + strconv.Itoa(fd))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, "mnt_id:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("fd %d: no mount ID in /proc/self/fdinfo", fd)
}
