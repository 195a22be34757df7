// Package file fetches from file:///abs/path: one file, or a directory
// tree on a local or network filesystem (a model already on NFS or a PVC
// is used without a download).
//
// The daemon is root and what it commits is world-readable, so a file://
// pull is a privilege boundary. Three rules hold it:
//
//   - Every open happens with the requester's credentials (Source.As): a
//     socket peer reads only what its own uid and groups may read, by the
//     kernel's own checks (modes, ACLs, LSMs), however much the daemon may.
//     It asks what the kernel asks of a plain open: search on each
//     directory of the path, read on the file, and read on a directory
//     only where the pull lists it (a 0711 parent refuses nothing). A
//     refusal names the component that refused, the permission it lacks
//     and the identity the read used.
//   - The source path crosses no symlink (openat2 RESOLVE_NO_SYMLINKS), and
//     the tree is walked and opened relative to one directory handle
//     (RESOLVE_BENEATH): a symlink inside the tree that leads out of it is
//     refused by the kernel, not by a check that a swap can race. Each Open
//     re-opens the source directory and requires the device and inode that
//     Resolve listed, and the file's own, so a directory or a file swapped
//     during the pull fails it with nothing committed. One exception: a
//     source in a Hugging Face hub cache snapshot follows the links that
//     lead to a file directly in its repository's blobs/ (hfcache.go),
//     opened beneath that directory as the requester.
//   - Only regular files are opened, with O_NONBLOCK: a FIFO, a socket or a
//     device is refused by name instead of blocking or streaming forever.
//
// With roots configured (WithRoots) file:// reads only under them, whoever
// asks; a Confined fetcher (a ModelCache's source, which no one on the node
// vouches for) reads nothing until roots are configured. Directories
// named WithDenied (kubelet's, the daemon's own state) are never read,
// whatever the roots: by path, and by device and inode (a bind mount or a
// symlink of one is refused too).
//
// An error names the path the source gave and, inside a tree, at most
// the entry it failed on; it never prints a symlink's target (the
// content of a link is content like any other).
//
// Where to find what:
//
//	file.go      Fetcher, its options, ParseURI, Resolve and Open
//	roots.go     the roots and denied directories (by path, device and
//	             inode) and the kernel's views (procfs, sysfs) never read
//	beneath.go   a file's location (directory, name, device and inode) and
//	             the opens beneath a directory through no symlink (openat2)
//	walk.go      the walk of a source tree: depth and entry caps, denied
//	             directories inside it, only regular files
//	refusal.go   a read the kernel refused: which component of the path
//	             refused, the permission it lacked and the identity that asked
//	hfcache.go   a hub cache snapshot: its links into blobs/ followed
//	errors.go    explain: an open's error as the source's, naming the path
//	             and the remedy
//	identity.go  a read with the requester's filesystem credentials (fsuid,
//	             fsgid, groups) on a thread of its own
package file

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/modelcache/modelcache/fetchers"
)

// Fetcher implements fetchers.Fetcher for file:// URIs. The zero value
// reads any path the requester may read.
type Fetcher struct {
	roots  []string
	denied []string
	// confined: without roots nothing is read (Confined).
	confined bool
	// walks bounds the tree walks at once (a socket peer can ask for many).
	walks chan struct{}
}

// Option configures a Fetcher.
type Option func(*Fetcher)

// WithRoots limits file:// to paths under these absolute directories,
// whoever asks (default: none, any path the requester may read).
func WithRoots(roots ...string) Option {
	return func(f *Fetcher) {
		for _, r := range roots {
			f.roots = append(f.roots, filepath.Clean(r))
		}
	}
}

// WithDenied names directories (or files) file:// never reads, whoever
// asks and whatever the roots, even a root that contains them: kubelet's
// directory (every pod's projected tokens and Secrets) and the daemon's
// own state. A source under one, a tree that holds one, and a path that
// is one by device and inode (a bind mount, a symlinked kubelet dir) are
// refused. Default: none.
func WithDenied(dirs ...string) Option {
	return func(f *Fetcher) {
		for _, d := range dirs {
			if d = filepath.Clean(d); filepath.IsAbs(d) && d != "/" {
				f.denied = append(f.denied, d)
			}
		}
	}
}

// Confined returns a fetcher like f for sources no one on the node
// vouches for (a ModelCache's): it reads only under f's roots, and
// nothing while none are configured. It shares f's bound on walks.
func (f *Fetcher) Confined() *Fetcher {
	c := *f
	c.confined = true
	return &c
}

// New returns a file fetcher.
func New(opts ...Option) *Fetcher {
	f := &Fetcher{walks: make(chan struct{}, 4)}
	for _, o := range opts {
		o(f)
	}
	return f
}

// ParseURI returns the absolute local path of a file:// URI.
func ParseURI(uri string) (string, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", fmt.Errorf("source %q: %w: %v", uri, fetchers.ErrBadSource, err)
	}
	if u.Scheme != "file" {
		return "", fmt.Errorf("source %q: %w: not a file:// URI", uri, fetchers.ErrBadSource)
	}
	if u.Host != "" && u.Host != "localhost" {
		return "", fmt.Errorf("source %q: %w: host %q; write file:///abs/path (three slashes)", uri, fetchers.ErrBadSource, u.Host)
	}
	p := u.Path
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("source %q: %w: the path must be absolute: file:///abs/path", uri, fetchers.ErrBadSource)
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." {
			return "", fmt.Errorf("source %q: %w: '..' in the path; give the real absolute path", uri, fetchers.ErrBadSource)
		}
	}
	return filepath.Clean(p), nil
}

// Resolve lists the file or the tree, reading as the requester. The
// revision is left empty: the store names it by the manifest digest, so
// changed content is a new revision.
func (f *Fetcher) Resolve(ctx context.Context, src fetchers.Source) (*fetchers.Resolved, error) {
	p, err := ParseURI(src.URI)
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	if err := f.checkRoots(src.URI, p); err != nil {
		return nil, fetchers.Permanent(err)
	}
	if f.walks != nil {
		select {
		case f.walks <- struct{}{}:
			defer func() { <-f.walks }()
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	denied := f.deniedIDs()
	if err := deniedAncestor(src.URI, p, denied); err != nil {
		return nil, fetchers.Permanent(err)
	}
	res := &fetchers.Resolved{URI: src.URI}
	ls := listing{f: f, ctx: ctx, uri: src.URI, p: p, as: src.As, denied: denied}
	err = asIdentity(src.As, func() (err error) {
		res.Files, err = ls.list()
		return err
	})
	if err != nil {
		return nil, fetchers.Permanent(withRefusal(err, src.As))
	}
	if len(res.Files) == 0 {
		return nil, fetchers.Permanent(fmt.Errorf("source %q: %w: the directory holds no files", src.URI, fetchers.ErrNotFound))
	}
	return res, nil
}

// listing is one Resolve's listing of the source path p, run as its
// requester (inside asIdentity).
type listing struct {
	f      *Fetcher
	ctx    context.Context
	uri, p string
	as     *fetchers.Identity
	denied map[fileID]string
}

// list lists p: a regular file, a hub cache snapshot's link to a blob, or
// a directory tree.
func (ls listing) list() ([]fetchers.File, error) {
	parent, base := filepath.Split(ls.p)
	if base == "" { // the filesystem root
		parent, base = "/", "."
	}
	parent = filepath.Clean(parent)
	// The parent is not listed: opening it O_PATH asks what the kernel
	// asks of a path through it (search, not read).
	pfd, err := openPath(parent)
	if err != nil {
		return nil, explain(ls.uri, ls.p, err)
	}
	defer unix.Close(pfd)
	if err := kernelFD(ls.uri, parent, pfd); err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, explain(ls.uri, ls.p, err)
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return ls.file(pfd, parent, base)
	case unix.S_IFDIR:
		return ls.tree()
	case unix.S_IFLNK:
		return ls.snapshotFile(pfd, parent, base)
	}
	return nil, fmt.Errorf("source %q: %w: %s is a %s, not a regular file or directory", ls.uri, fetchers.ErrBadSource, ls.p, fetchers.TypeName(fs.FileMode(0)|modeType(st.Mode)))
}

// file lists the regular file base of the directory pfd (at parent).
func (ls listing) file(pfd int, parent, base string) ([]fetchers.File, error) {
	var pst, st unix.Stat_t
	if err := unix.Fstat(pfd, &pst); err != nil {
		return nil, explain(ls.uri, parent, err)
	}
	// Opening proves the requester may read it.
	fd, err := openBeneath(pfd, base, unix.O_NOFOLLOW)
	if err != nil {
		return nil, explain(ls.uri, ls.p, err)
	}
	defer unix.Close(fd)
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, explain(ls.uri, ls.p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("source %q: %w: %s changed while it was listed", ls.uri, fetchers.ErrBadSource, ls.p)
	}
	if d, ok := ls.denied[idOf(&st)]; ok {
		return nil, deniedError(ls.uri, ls.p, d)
	}
	if err := kernelFD(ls.uri, ls.p, fd); err != nil { // a procfs or sysfs file bind-mounted here
		return nil, err
	}
	l := loc{dir: parent, rel: base, dirID: idOf(&pst), fileID: idOf(&st), as: ls.as}
	return []fetchers.File{{Path: base, Size: st.Size, Mode: st.Mode & 0o777, Locator: l.String(), Validator: validator(&st)}}, nil
}

// snapshotFile lists the symlink base of the directory pfd (at parent)
// where it is a file of a hub cache snapshot: a link into its blobs/.
// Any other symlink is refused.
func (ls listing) snapshotFile(pfd int, parent, base string) ([]fetchers.File, error) {
	blobs, err := ls.f.openHFBlobs(ls.uri, ls.p, ls.denied)
	if err != nil {
		return nil, err
	}
	defer blobs.close()
	bn, bst, ok, err := blobs.blob(pfd, parent, base)
	if err != nil {
		return nil, explain(ls.uri, ls.p, err)
	}
	if !ok || bst.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("source %q: %w: %s is a symlink; give the real path (realpath %s)", ls.uri, fetchers.ErrBadSource, ls.p, ls.p)
	}
	if d, ok := ls.denied[idOf(&bst)]; ok {
		return nil, deniedError(ls.uri, ls.p, d)
	}
	l := loc{dir: blobs.path, rel: bn, dirID: blobs.id, fileID: idOf(&bst), as: ls.as}
	return []fetchers.File{{Path: base, Size: bst.Size, Mode: bst.Mode & 0o777, Locator: l.String(), Validator: validator(&bst)}}, nil
}

// tree lists the directory p, which the requester must be able to list.
func (ls listing) tree() ([]fetchers.File, error) {
	rfd, err := openDir(ls.p)
	if err != nil {
		return nil, explain(ls.uri, ls.p, err)
	}
	defer unix.Close(rfd)
	var rst unix.Stat_t
	if err := unix.Fstat(rfd, &rst); err != nil {
		return nil, explain(ls.uri, ls.p, err)
	}
	if d, ok := ls.denied[idOf(&rst)]; ok {
		return nil, deniedError(ls.uri, ls.p, d)
	}
	blobs, err := ls.f.openHFBlobs(ls.uri, ls.p, ls.denied)
	if err != nil {
		return nil, err
	}
	defer blobs.close()
	w := walker{ctx: ls.ctx, uri: ls.uri, root: ls.p, rootfd: rfd, rootID: idOf(&rst), as: ls.as, denied: ls.denied, blobs: blobs}
	if err := w.walk(rfd, "", 0); err != nil {
		return nil, err
	}
	return w.files, nil
}

// Open re-opens the source directory as the requester, checks that it is
// still the one Resolve listed, opens the file beneath it (a regular file,
// the same one) and seeks to offset.
func (f *Fetcher) Open(ctx context.Context, file fetchers.File, offset int64) (io.ReadCloser, error) {
	l, err := parseLoc(file.Locator)
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	uri := "file://" + filepath.Join(l.dir, l.rel)
	if err := f.checkRoots(uri, l.dir); err != nil {
		return nil, fetchers.Permanent(err)
	}
	var fh *os.File
	err = asIdentity(l.as, func() error {
		dfd, err := openPath(l.dir)
		if err != nil {
			return explain(uri, filepath.Join(l.dir, l.rel), err)
		}
		defer unix.Close(dfd)
		var st unix.Stat_t
		if err := unix.Fstat(dfd, &st); err != nil {
			return err
		}
		if idOf(&st) != l.dirID {
			return fmt.Errorf("source %q: %w: the directory %s was replaced during the pull (it is not the one listed when the pull began); nothing was committed, pull again once it stays put", uri, fetchers.ErrBadSource, l.dir)
		}
		fd, err := openBeneath(dfd, l.rel, 0)
		if errors.Is(err, unix.EXDEV) {
			return fmt.Errorf("source %q: %w: %s now leads outside the source tree; nothing was committed", uri, fetchers.ErrBadSource, l.rel)
		}
		if err != nil {
			return explain(uri, filepath.Join(l.dir, l.rel), err)
		}
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return err
		}
		if err := kernelFD(uri, filepath.Join(l.dir, l.rel), fd); err != nil { // a procfs or sysfs file bind-mounted in the tree
			unix.Close(fd)
			return err
		}
		if st.Mode&unix.S_IFMT != unix.S_IFREG || idOf(&st) != l.fileID {
			unix.Close(fd)
			return fmt.Errorf("source %q: %w: %s was replaced during the pull (it is not the file listed when the pull began); nothing was committed, pull again once it stays put", uri, fetchers.ErrBadSource, filepath.Join(l.dir, l.rel))
		}
		if offset > 0 && file.Validator != "" && validator(&st) != file.Validator {
			unix.Close(fd)
			return fmt.Errorf("source %q: %s changed since it was listed: %w", uri, filepath.Join(l.dir, l.rel), fetchers.ErrCannotResume)
		}
		fh = os.NewFile(uintptr(fd), filepath.Join(l.dir, l.rel))
		return nil
	})
	if err != nil {
		return nil, fetchers.Permanent(withRefusal(err, l.as))
	}
	if offset > 0 {
		if _, err := fh.Seek(offset, io.SeekStart); err != nil {
			fh.Close()
			return nil, err
		}
	}
	return fh, nil
}

// validator names the version of a file as stat sees it (device, inode,
// size, modification and change times, as git's index does): a pull that
// sees it again reuses the blob it committed instead of reading the file,
// and partial data of one version is never continued with another.
func validator(st *unix.Stat_t) string {
	return fmt.Sprintf("dev=%d,ino=%d,size=%d,mtime=%d.%09d,ctime=%d.%09d", st.Dev, st.Ino, st.Size, st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
}
