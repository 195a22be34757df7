package daemon

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// How a writable layer's upper directory, written by a tenant's pod, is
// copied into a kept layer: walked by descriptors (openat with O_NOFOLLOW,
// fstatat with AT_SYMLINK_NOFOLLOW), so no link is followed and nothing
// outside the upper directory is read. Only directories and regular files
// are copied, each regular file as a file of its own (a hard link is two
// files, each counted), read through a descriptor checked to be a regular
// file, its apparent size counted against the budget before a byte is
// copied (a sparse file of 60 GiB on a 1 GiB tmpfs is 60 GiB). Links,
// devices, pipes and sockets are not copied: their paths are recorded as
// refused, and a capture of a directory holding one is refused as it would
// have been while the pod ran. Overlayfs's own marks are read as the
// overlay meant them: a whiteout (a character device 0/0) hides the file
// of the lower layer, an opaque directory (trusted.overlay.opaque=y) all
// of the lower layer's entries beneath it.

// Bounds of one kept layer's walk, whatever its budget in bytes.
const (
	keptMaxEntries = 200_000
	keptMaxDepth   = 64
)

// errKeptTooLarge: the upper directory is past the kept layers' bounds.
var errKeptTooLarge = errors.New("larger than a kept layer may be")

// upperCopy is what copyUpper found and copied.
type upperCopy struct {
	bytes   int64
	files   int
	entries int
	newest  time.Time       // the newest ctime of a regular file (the pod cannot set a ctime)
	hidden  map[string]bool // paths whose lower entries the upper hides: whiteouts, opaque directories, refused entries
	refused []string        // "path (what it was)"
}

// copyUpper copies the directories and regular files of upper into dst (a
// new directory), up to budget bytes.
func copyUpper(upper, dst string, budget int64) (*upperCopy, error) {
	fd, err := unix.Open(upper, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("the upper directory %s: %w", upper, err)
	}
	defer unix.Close(fd)
	if err := os.Mkdir(dst, 0o755); err != nil {
		return nil, err
	}
	c := &upperCopy{hidden: map[string]bool{}}
	return c, c.dir(fd, "", dst, budget, 0)
}

// dir copies the directory open at fd (rel to the upper directory) into dst.
func (c *upperCopy) dir(fd int, rel, dst string, budget int64, depth int) error {
	if depth > keptMaxDepth {
		return fmt.Errorf("%s: deeper than %d directories: %w", rel, keptMaxDepth, errKeptTooLarge)
	}
	names, err := readDirNames(fd)
	if err != nil {
		return fmt.Errorf("reading %s: %w", rel, err)
	}
	for _, name := range names {
		if c.entries++; c.entries > keptMaxEntries {
			return fmt.Errorf("more than %d entries: %w", keptMaxEntries, errKeptTooLarge)
		}
		p := path.Join(rel, name)
		var st unix.Stat_t
		if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			if err := c.subdir(fd, name, p, filepath.Join(dst, name), budget, depth); err != nil {
				return err
			}
		case unix.S_IFREG:
			if c.bytes+st.Size > budget {
				return fmt.Errorf("%s brings it past %d bytes: %w", p, budget, errKeptTooLarge)
			}
			if err := c.file(fd, name, p, filepath.Join(dst, name)); err != nil {
				return err
			}
		case unix.S_IFCHR:
			if st.Rdev == 0 { // overlayfs's whiteout: the lower file was removed
				c.hidden[p] = true
				continue
			}
			c.refuse(p, "a character device")
		case unix.S_IFLNK:
			c.refuse(p, "a symbolic link")
		case unix.S_IFBLK:
			c.refuse(p, "a block device")
		case unix.S_IFIFO:
			c.refuse(p, "a named pipe")
		default:
			c.refuse(p, "a socket")
		}
	}
	return nil
}

func (c *upperCopy) refuse(p, what string) {
	c.hidden[p] = true
	c.refused = append(c.refused, p+" ("+what+")")
}

func (c *upperCopy) subdir(parent int, name, rel, dst string, budget int64, depth int) error {
	fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	defer unix.Close(fd)
	buf := make([]byte, 8)
	if n, err := unix.Fgetxattr(fd, "trusted.overlay.opaque", buf); err == nil && string(buf[:n]) == "y" {
		c.hidden[rel] = true // the pod removed the lower directory and made it again
	}
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	return c.dir(fd, rel, dst, budget, depth+1)
}

// file copies one regular file, opened beneath its parent's descriptor
// and checked again through the descriptor it reads.
func (c *upperCopy) file(parent int, name, rel, dst string) error {
	fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	src := os.NewFile(uintptr(fd), rel)
	defer src.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		c.refuse(rel, "not a regular file when opened")
		return nil
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o644)
	if err != nil {
		return err
	}
	n, err := io.Copy(out, io.LimitReader(src, st.Size))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("copying %s: %w", rel, err)
	}
	c.bytes += n
	c.files++
	if ct := time.Unix(st.Ctim.Unix()); ct.After(c.newest) {
		c.newest = ct
	}
	return nil
}

// readDirNames lists the directory open at fd (without closing fd).
func readDirNames(fd int) ([]string, error) {
	dup, err := unix.Dup(fd)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(dup), "")
	defer f.Close()
	return f.Readdirnames(-1)
}

// hides says whether an entry of the upper hides p of the lower layer: p
// itself or a directory above it.
func (c *upperCopy) hides(p string) bool {
	for q := p; q != "." && q != "/" && q != ""; q = path.Dir(q) {
		if c.hidden[q] {
			return true
		}
	}
	return false
}

// linkLower adds the files of a lower tree (the store's tree of a kernel
// cache the volume was given, trusted) under dst/dir, as hardlinks of the
// store's read-only files, where the upper neither hides nor replaces
// them: what the pod started from. It returns their bytes.
func (c *upperCopy) linkLower(lower, dst, dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(lower, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(lower, p)
		if rel == "." {
			return nil
		}
		mp := path.Join(dir, filepath.ToSlash(rel))
		if c.hides(mp) {
			if e.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if !e.Type().IsRegular() {
			return nil
		}
		to := filepath.Join(dst, filepath.FromSlash(mp))
		if _, err := os.Lstat(to); err == nil { // the pod's copy of it (copied up)
			return nil
		}
		if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
			return nil // the pod put a file where the directory was: the file wins
		}
		if err := os.Link(p, to); err != nil {
			return fmt.Errorf("linking %s: %w", mp, err)
		}
		if fi, err := e.Info(); err == nil {
			total += fi.Size()
		}
		return nil
	})
	return total, err
}
