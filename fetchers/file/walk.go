package file

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/modelcache/modelcache/fetchers"
)

// walker lists a tree through directory handles beneath its root.
type walker struct {
	ctx    context.Context
	uri    string
	root   string
	rootfd int
	rootID fileID
	as     *fetchers.Identity
	denied map[fileID]string
	// blobs: the source is in a hub cache snapshot whose links into
	// blobs/ are followed (nil otherwise).
	blobs *hfBlobs
	files []fetchers.File
}

// deniedInTree: the tree holds a denied directory (the source is a
// parent of it, or a bind mount of it lies inside).
func (w *walker) deniedInTree(rel, d string) error {
	return fmt.Errorf("source %q: %w: the tree holds %s (at %s), kubelet's or this daemon's own directory, which file:// never reads whatever --file-roots says; point the source at a directory of models", w.uri, fetchers.ErrUnauthorized, d, w.at(rel))
}

// at is what an error says of the entry rel of the tree: the source path
// and the first component beyond it, never what lies deeper (a refused
// or unreadable directory's contents are not the requester's to learn).
func (w *walker) at(rel string) string {
	first, _, _ := strings.Cut(rel, "/")
	return filepath.Join(w.root, short(first))
}

// Bounds of a tree walk: a tree deeper or larger than this is refused
// (a hostile tree must not cost the daemon descriptors or memory).
const (
	maxDepth = 64
	maxFiles = 100_000
)

// walk lists the directory rel (open as dirfd, which the caller closes).
// Entries are read and stat'ed first and dirfd is not used while the
// subdirectories are walked (they are opened beneath the root), so a walk
// holds two descriptors whatever the depth.
func (w *walker) walk(dirfd int, rel string, depth int) error {
	if err := w.ctx.Err(); err != nil {
		return err
	}
	if depth > maxDepth {
		return fmt.Errorf("source %q: %w: the tree is deeper than %d directories (at %s); point the source at a shallower directory", w.uri, fetchers.ErrBadSource, maxDepth, short(rel))
	}
	if err := kernelFD(w.uri, w.at(rel), dirfd); err != nil { // a procfs or sysfs mounted inside the tree
		return err
	}
	// ReadDir on a duplicate: the os.File owns and closes it.
	dup, err := unix.Dup(dirfd)
	if err != nil {
		return err
	}
	d := os.NewFile(uintptr(dup), filepath.Join(w.root, rel))
	ents, err := d.ReadDir(-1)
	d.Close()
	if err != nil {
		return explain(w.uri, w.at(rel), err)
	}
	var dirs []string
	for _, e := range ents {
		name := e.Name()
		crel := path.Join(rel, name)
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return explain(w.uri, w.at(crel), err)
		}
		if d, ok := w.denied[idOf(&st)]; ok {
			return w.deniedInTree(crel, d)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			dirs = append(dirs, crel)
			continue
		case unix.S_IFLNK:
			// Follow it only inside the tree: the kernel refuses an escape.
			// Its target is not printed: it is the link's content.
			fd, err := openat2(w.rootfd, crel, unix.O_PATH|unix.O_CLOEXEC, unix.RESOLVE_BENEATH|unix.RESOLVE_NO_MAGICLINKS)
			if errors.Is(err, unix.EXDEV) {
				bn, bst, ok, err := w.blobs.blob(dirfd, filepath.Join(w.root, rel), name)
				if err != nil {
					return explain(w.uri, w.at(crel), err)
				}
				if !ok {
					return outsideError(w.uri, crel, w.blobs)
				}
				if d, ok := w.denied[idOf(&bst)]; ok {
					return w.deniedInTree(crel, d)
				}
				if bst.Mode&unix.S_IFMT != unix.S_IFREG {
					return fmt.Errorf("source %q: %w: symlink %s leads to a %s in %s, not a regular file", w.uri, fetchers.ErrBadSource, short(crel), fetchers.TypeName(modeType(bst.Mode)), w.blobs.path)
				}
				if err := w.add(crel, &bst, loc{dir: w.blobs.path, rel: bn, dirID: w.blobs.id, fileID: idOf(&bst), as: w.as}); err != nil {
					return err
				}
				continue
			}
			if err != nil {
				return explain(w.uri, w.at(crel), err)
			}
			err = unix.Fstat(fd, &st)
			unix.Close(fd)
			if err != nil {
				return explain(w.uri, w.at(crel), err)
			}
			if d, ok := w.denied[idOf(&st)]; ok {
				return w.deniedInTree(crel, d)
			}
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				return fmt.Errorf("source %q: %w: symlink %s points to a directory; directory symlinks are not followed", w.uri, fetchers.ErrBadSource, short(crel))
			}
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return fmt.Errorf("source %q: %w: %s is a %s, not a regular file; remove it from the tree or exclude it (--exclude)", w.uri, fetchers.ErrBadSource, crel, fetchers.TypeName(modeType(st.Mode)))
		}
		if err := w.add(crel, &st, loc{dir: w.root, rel: crel, dirID: w.rootID, fileID: idOf(&st), as: w.as}); err != nil {
			return err
		}
	}
	for _, crel := range dirs {
		fd, err := openBeneath(w.rootfd, crel, unix.O_DIRECTORY|unix.O_NOFOLLOW)
		if err != nil {
			return explain(w.uri, w.at(crel), err)
		}
		err = w.walk(fd, crel, depth+1)
		unix.Close(fd)
		if err != nil {
			return err
		}
	}
	return nil
}

// add lists the regular file st at crel, read through l.
func (w *walker) add(crel string, st *unix.Stat_t, l loc) error {
	if len(w.files) >= maxFiles {
		return fmt.Errorf("source %q: %w: the tree holds more than %d files; point the source at a smaller directory", w.uri, fetchers.ErrBadSource, maxFiles)
	}
	w.files = append(w.files, fetchers.File{Path: crel, Size: st.Size, Mode: st.Mode & 0o777, Locator: l.String(), Validator: validator(st)})
	return nil
}

// short keeps a path in an error message readable: its last 200 bytes.
func short(p string) string {
	if len(p) <= 200 {
		return p
	}
	return "…" + p[len(p)-200:]
}
