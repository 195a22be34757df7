package warm

import (
	"errors"
	"fmt"
	"os"
	"path"
	"sort"

	"golang.org/x/sys/unix"
)

// file is one regular file of a tree: its path relative to the tree's
// root (slash-separated, as a loader names it) and its size.
type file struct {
	rel  string
	size int64
}

// openTree opens the directory dir (the caller's path: a symlink on the
// way to it, such as models/<name>/current, is followed) for the walks
// and opens beneath it.
func openTree(dir string) (int, error) {
	if dir == "" {
		return -1, fmt.Errorf("warm: an empty directory: name the committed tree (models/<name>/<revision>)")
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("warm: tree %s: %w", dir, err)
	}
	return fd, nil
}

// openBeneath opens rel under dirfd, never leaving it: a symlink inside
// the tree that stays inside is followed, one that leads out fails with
// EXDEV (openat2 RESOLVE_BENEATH). It does not block on a FIFO or take a
// terminal.
func openBeneath(dirfd int, rel string, flags int) (int, error) {
	if flags&unix.O_PATH == 0 { // openat2 refuses these beside O_PATH
		flags |= unix.O_NONBLOCK | unix.O_NOCTTY
	}
	how := unix.OpenHow{
		Flags:   uint64(flags | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	}
	for {
		fd, err := unix.Openat2(dirfd, rel, &how)
		if errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN) { // EAGAIN: a rename raced the lookup
			continue
		}
		if errors.Is(err, unix.ENOSYS) {
			return -1, fmt.Errorf("%s: warming needs openat2 (Linux 5.6 or newer): %w", rel, err)
		}
		return fd, err
	}
}

// openFile opens the regular file rel beneath dirfd for reading, with
// the kernel's readahead off (FADV_RANDOM). A symlink that leads out of
// the tree is ErrEscape; anything but a regular file is refused.
func openFile(dirfd int, root, rel string) (*os.File, int64, error) {
	fd, err := openBeneath(dirfd, rel, unix.O_RDONLY)
	if err != nil {
		return nil, 0, beneathError(root, rel, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("warm: %s in %s: %w", rel, root, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return nil, 0, fmt.Errorf("warm: %s in %s is not a regular file", rel, root)
	}
	// No readahead: what the package reads is then exactly what it
	// brings in (the budget, the overtaking check and the yield to other
	// I/O count on it). A sequential read here would also leave the
	// kernel's readahead marks behind, and a later read that hits one
	// reads ahead whatever this descriptor says.
	if err := unix.Fadvise(fd, 0, 0, unix.FADV_RANDOM); err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("warm: %s in %s: fadvise: %w", rel, root, err)
	}
	return f, st.Size, nil
}

func beneathError(root, rel string, err error) error {
	if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ELOOP) {
		return fmt.Errorf("warm: %s in %s: %w (a committed tree holds files and in-tree links only; warm the tree under models/, not a view of symlinks)", rel, root, ErrEscape)
	}
	return fmt.Errorf("warm: %s in %s: %w", rel, root, err)
}

// walkTree lists the regular files beneath dirfd in path order. A
// directory is entered only by its real name (a symlink to a directory is
// not followed: what it holds is listed under its real path); a symlink
// to a file is followed if it stays beneath the root, and is ErrEscape if
// it leads out. A file reached twice (links to one inode) is listed once:
// under its first path that is not a symlink, else its first symlink.
func walkTree(dirfd int, root string) ([]file, error) {
	type entry struct {
		file
		id   [2]uint64
		link bool
	}
	var all []entry
	var walk func(rel string) error
	walk = func(rel string) error {
		name := rel
		if name == "" {
			name = "."
		}
		fd, err := openBeneath(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW)
		if err != nil {
			return beneathError(root, name, err)
		}
		d := os.NewFile(uintptr(fd), name)
		entries, err := d.ReadDir(-1)
		d.Close()
		if err != nil {
			return fmt.Errorf("warm: list %s in %s: %w", name, root, err)
		}
		sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
		for _, e := range entries {
			p := path.Join(rel, e.Name())
			switch t := e.Type(); {
			case t.IsDir():
				if err := walk(p); err != nil {
					return err
				}
				continue
			case t.IsRegular(), t&os.ModeSymlink != 0:
			default:
				continue // devices, FIFOs, sockets: nothing a loader reads
			}
			fd, err := openBeneath(dirfd, p, unix.O_PATH)
			if err != nil {
				return beneathError(root, p, err)
			}
			var st unix.Stat_t
			err = unix.Fstat(fd, &st)
			unix.Close(fd)
			if err != nil {
				return fmt.Errorf("warm: %s in %s: %w", p, root, err)
			}
			if st.Mode&unix.S_IFMT != unix.S_IFREG {
				continue // a symlink to an in-tree directory: listed by its real path
			}
			all = append(all, entry{file: file{rel: p, size: st.Size}, id: [2]uint64{st.Dev, st.Ino}, link: e.Type()&os.ModeSymlink != 0})
		}
		return nil
	}
	if err := walk(""); err != nil {
		return nil, err
	}
	chosen := map[[2]uint64]int{}
	for i, e := range all {
		if j, ok := chosen[e.id]; !ok || (all[j].link && !e.link) {
			chosen[e.id] = i
		}
	}
	var files []file
	for i, e := range all {
		if chosen[e.id] == i {
			files = append(files, e.file)
		}
	}
	return files, nil
}
