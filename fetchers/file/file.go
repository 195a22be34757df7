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
//   - The source path crosses no symlink (openat2 RESOLVE_NO_SYMLINKS), and
//     the tree is walked and opened relative to one directory handle
//     (RESOLVE_BENEATH): a symlink inside the tree that leads out of it is
//     refused by the kernel, not by a check that a swap can race. Each Open
//     re-opens the source directory and requires the device and inode that
//     Resolve listed, and the file's own, so a directory or a file swapped
//     during the pull fails it with nothing committed.
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
// file.go holds the fetcher; identity.go runs a read with the requester's
// filesystem credentials (fsuid, fsgid, groups) on a thread of its own.
package file

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strconv"
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

// CheckRoots refuses a path outside the configured roots.
func (f *Fetcher) CheckRoots(uri string) error {
	p, err := ParseURI(uri)
	if err != nil {
		return err
	}
	return f.checkRoots(uri, p)
}

func (f *Fetcher) checkRoots(uri, p string) error {
	if err := kernelFS(uri, p); err != nil {
		return err
	}
	for _, d := range f.denied {
		if under(p, d) {
			return deniedError(uri, p, d)
		}
	}
	if len(f.roots) == 0 {
		if f.confined {
			return fmt.Errorf("source %q: %w: a cluster file:// source reads only under directories the node's operator names, and this node names none; set modelcached --file-roots (config file-roots: [DIR]) to the directories that hold models, or use another scheme",
				uri, fetchers.ErrUnauthorized)
		}
		return nil
	}
	for _, r := range f.roots {
		if under(p, r) {
			return nil
		}
	}
	return fmt.Errorf("source %q: %w: %s is outside the directories file:// may read on this node (%s); copy the model under one of them or ask the node's admin to add its directory to --file-roots",
		uri, fetchers.ErrUnauthorized, p, strings.Join(f.roots, ", "))
}

// under reports whether the clean absolute path p is dir or inside it.
func under(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

func deniedError(uri, p, d string) error {
	return fmt.Errorf("source %q: %w: %s is under %s, kubelet's or this daemon's own directory, which file:// never reads whatever --file-roots says; copy the model to a directory of its own", uri, fetchers.ErrUnauthorized, p, d)
}

// deniedIDs are the device and inode of each denied path that exists and
// of the directories and files directly in it (kubelet's pods/, plugins/,
// the store's index.db), looked
// up as the daemon, following symlinks: where a denied path leads, and a
// bind mount of it or of one of those, is refused wherever it shows up.
// A bind mount of something deeper is not recognised; the reading
// identity is what keeps it out (kubelet's per-pod directories are 0750
// root).
func (f *Fetcher) deniedIDs() map[fileID]string {
	if len(f.denied) == 0 {
		return nil
	}
	ids := make(map[fileID]string, len(f.denied))
	for _, d := range f.denied {
		var st unix.Stat_t
		if unix.Stat(d, &st) != nil {
			continue
		}
		ids[idOf(&st)] = d
		if st.Mode&unix.S_IFMT != unix.S_IFDIR {
			continue
		}
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if (e.IsDir() || e.Type().IsRegular()) && unix.Lstat(filepath.Join(d, e.Name()), &st) == nil {
				ids[idOf(&st)] = d
			}
		}
	}
	return ids
}

// deniedAncestor refuses a source whose path passes through a denied
// directory by another name (a bind mount of kubelet's pods directory
// under a root): each directory on the way is compared by identity.
func deniedAncestor(uri, p string, ids map[fileID]string) error {
	if len(ids) == 0 {
		return nil
	}
	for q := p; ; q = filepath.Dir(q) {
		var st unix.Stat_t
		if unix.Lstat(q, &st) == nil {
			if d, ok := ids[idOf(&st)]; ok {
				return deniedError(uri, p, d)
			}
		}
		if q == "/" {
			return nil
		}
	}
}

// kernelMounts are the kernel's views of processes and devices: no model
// lives there, and /proc/self, /proc/thread-self and /proc/<pid> name the
// daemon itself (its memory maps, environment and descriptors), which the
// requester's fsuid does not hide on every kernel.
var kernelMounts = []string{"/proc", "/sys"}

// kernelFS refuses, by path and before anything is opened, a source under
// /proc or /sys.
func kernelFS(uri, p string) error {
	for _, m := range kernelMounts {
		if under(p, m) {
			return fmt.Errorf("source %q: %w: %s is under %s, the kernel's view of processes and devices, which file:// never reads; copy the model to a directory", uri, fetchers.ErrUnauthorized, p, m)
		}
	}
	return nil
}

// kernelFD refuses a directory on procfs or sysfs mounted elsewhere (a
// DaemonSet's /host/proc): the same views kernelFS refuses by path.
func kernelFD(uri, p string, fd int) error {
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return explain(uri, p, err)
	}
	switch fs.Type {
	case unix.PROC_SUPER_MAGIC, unix.SYSFS_MAGIC:
		return fmt.Errorf("source %q: %w: %s is on a procfs or sysfs mount, the kernel's view of processes and devices, which file:// never reads; copy the model to a directory", uri, fetchers.ErrUnauthorized, p)
	}
	return nil
}

// loc is what Resolve tells Open about a file: the directory it is opened
// beneath, its path there, the identities Open must find again, and who
// reads it. Encoded in File.Locator.
type loc struct {
	dir, rel string
	dirID    fileID
	fileID   fileID
	as       *fetchers.Identity
}

type fileID struct{ dev, ino uint64 }

func idOf(st *unix.Stat_t) fileID { return fileID{uint64(st.Dev), st.Ino} }

func (l loc) String() string {
	as := "-"
	if l.as != nil {
		gs := make([]string, len(l.as.Groups))
		for i, g := range l.as.Groups {
			gs[i] = strconv.FormatUint(uint64(g), 10)
		}
		as = fmt.Sprintf("%d:%d:%s", l.as.UID, l.as.GID, strings.Join(gs, ","))
	}
	return strings.Join([]string{l.dir, l.rel, fmt.Sprintf("%d:%d", l.dirID.dev, l.dirID.ino), fmt.Sprintf("%d:%d", l.fileID.dev, l.fileID.ino), as}, "\x00")
}

func parseLoc(s string) (loc, error) {
	parts := strings.Split(s, "\x00")
	bad := fmt.Errorf("file: bad locator %q", s)
	if len(parts) != 5 {
		return loc{}, bad
	}
	l := loc{dir: parts[0], rel: parts[1]}
	for i, dst := range []*fileID{&l.dirID, &l.fileID} {
		if _, err := fmt.Sscanf(parts[2+i], "%d:%d", &dst.dev, &dst.ino); err != nil {
			return loc{}, bad
		}
	}
	if parts[4] != "-" {
		f := strings.SplitN(parts[4], ":", 3)
		if len(f) != 3 {
			return loc{}, bad
		}
		uid, err1 := strconv.ParseUint(f[0], 10, 32)
		gid, err2 := strconv.ParseUint(f[1], 10, 32)
		if err1 != nil || err2 != nil {
			return loc{}, bad
		}
		l.as = &fetchers.Identity{UID: uint32(uid), GID: uint32(gid)}
		for _, g := range strings.Split(f[2], ",") {
			if g == "" {
				continue
			}
			n, err := strconv.ParseUint(g, 10, 32)
			if err != nil {
				return loc{}, bad
			}
			l.as.Groups = append(l.as.Groups, uint32(n))
		}
	}
	return l, nil
}

// openDir opens the directory at the absolute path p, crossing no symlink.
func openDir(p string) (int, error) {
	return openat2(unix.AT_FDCWD, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, unix.RESOLVE_NO_SYMLINKS|unix.RESOLVE_NO_MAGICLINKS)
}

// openBeneath opens rel under dirfd, never leaving it (in-tree symlinks
// are followed, a symlink leading out fails with EXDEV), without blocking
// on a FIFO or taking a terminal.
func openBeneath(dirfd int, rel string, flags int) (int, error) {
	return openat2(dirfd, rel, flags|unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, unix.RESOLVE_BENEATH|unix.RESOLVE_NO_MAGICLINKS)
}

func openat2(dirfd int, p string, flags int, resolve uint64) (int, error) {
	for {
		fd, err := unix.Openat2(dirfd, p, &unix.OpenHow{Flags: uint64(flags), Resolve: resolve})
		if err == unix.EINTR || err == unix.EAGAIN { // EAGAIN: a rename raced the lookup
			continue
		}
		return fd, err
	}
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
	err = asIdentity(src.As, func() error {
		parent, base := filepath.Split(p)
		if base == "" { // the filesystem root
			parent, base = "/", "."
		}
		pfd, err := openDir(filepath.Clean(parent))
		if err != nil {
			return explain(src.URI, parent, err)
		}
		defer unix.Close(pfd)
		if err := kernelFD(src.URI, parent, pfd); err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Fstatat(pfd, base, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return explain(src.URI, p, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			var pst unix.Stat_t
			if err := unix.Fstat(pfd, &pst); err != nil {
				return explain(src.URI, parent, err)
			}
			// Opening proves the requester may read it.
			fd, err := openBeneath(pfd, base, unix.O_NOFOLLOW)
			if err != nil {
				return explain(src.URI, p, err)
			}
			defer unix.Close(fd)
			if err := unix.Fstat(fd, &st); err != nil {
				return explain(src.URI, p, err)
			}
			if st.Mode&unix.S_IFMT != unix.S_IFREG {
				return fmt.Errorf("source %q: %w: %s changed while it was listed", src.URI, fetchers.ErrBadSource, p)
			}
			if d, ok := denied[idOf(&st)]; ok {
				return deniedError(src.URI, p, d)
			}
			if err := kernelFD(src.URI, p, fd); err != nil { // a procfs or sysfs file bind-mounted here
				return err
			}
			l := loc{dir: filepath.Clean(parent), rel: base, dirID: idOf(&pst), fileID: idOf(&st), as: src.As}
			res.Files = []fetchers.File{{Path: base, Size: st.Size, Mode: st.Mode & 0o777, Locator: l.String()}}
			return nil
		case unix.S_IFDIR:
		case unix.S_IFLNK:
			return fmt.Errorf("source %q: %w: %s is a symlink; give the real path (realpath %s)", src.URI, fetchers.ErrBadSource, p, p)
		default:
			return fmt.Errorf("source %q: %w: %s is a %s, not a regular file or directory", src.URI, fetchers.ErrBadSource, p, fetchers.TypeName(fs.FileMode(0)|modeType(st.Mode)))
		}
		rfd, err := openDir(p)
		if err != nil {
			return explain(src.URI, p, err)
		}
		defer unix.Close(rfd)
		var rst unix.Stat_t
		if err := unix.Fstat(rfd, &rst); err != nil {
			return explain(src.URI, p, err)
		}
		if d, ok := denied[idOf(&rst)]; ok {
			return deniedError(src.URI, p, d)
		}
		w := walker{ctx: ctx, uri: src.URI, root: p, rootfd: rfd, rootID: idOf(&rst), as: src.As, denied: denied}
		if err := w.walk(rfd, "", 0); err != nil {
			return err
		}
		res.Files = w.files
		return nil
	})
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	if len(res.Files) == 0 {
		return nil, fetchers.Permanent(fmt.Errorf("source %q: %w: the directory holds no files", src.URI, fetchers.ErrNotFound))
	}
	return res, nil
}

// walker lists a tree through directory handles beneath its root.
type walker struct {
	ctx    context.Context
	uri    string
	root   string
	rootfd int
	rootID fileID
	as     *fetchers.Identity
	denied map[fileID]string
	files  []fetchers.File
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
				return fmt.Errorf("source %q: %w: symlink %s points outside the source tree; copy the file into the tree or point the source at a directory that contains it", w.uri, fetchers.ErrBadSource, short(crel))
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
		if len(w.files) >= maxFiles {
			return fmt.Errorf("source %q: %w: the tree holds more than %d files; point the source at a smaller directory", w.uri, fetchers.ErrBadSource, maxFiles)
		}
		l := loc{dir: w.root, rel: crel, dirID: w.rootID, fileID: idOf(&st), as: w.as}
		w.files = append(w.files, fetchers.File{Path: crel, Size: st.Size, Mode: st.Mode & 0o777, Locator: l.String()})
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

// short keeps a path in an error message readable: its last 200 bytes.
func short(p string) string {
	if len(p) <= 200 {
		return p
	}
	return "…" + p[len(p)-200:]
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
		dfd, err := openDir(l.dir)
		if err != nil {
			return explain(uri, l.dir, err)
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
		fh = os.NewFile(uintptr(fd), filepath.Join(l.dir, l.rel))
		return nil
	})
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	if offset > 0 {
		if _, err := fh.Seek(offset, io.SeekStart); err != nil {
			fh.Close()
			return nil, err
		}
	}
	return fh, nil
}

// modeType turns a stat mode's type bits into an fs.FileMode type.
func modeType(m uint32) fs.FileMode {
	switch m & unix.S_IFMT {
	case unix.S_IFDIR:
		return fs.ModeDir
	case unix.S_IFIFO:
		return fs.ModeNamedPipe
	case unix.S_IFSOCK:
		return fs.ModeSocket
	case unix.S_IFCHR:
		return fs.ModeDevice | fs.ModeCharDevice
	case unix.S_IFBLK:
		return fs.ModeDevice
	case unix.S_IFLNK:
		return fs.ModeSymlink
	}
	return fs.ModeIrregular
}

// missingHint says why a path may be missing for the daemon but not for
// the user: under systemd (INVOCATION_ID set) the packaged unit's
// PrivateTmp=yes gives the daemon a /tmp and /var/tmp of its own.
func missingHint(p string) string {
	for _, tmp := range []string{"/tmp", "/var/tmp"} {
		if under(p, tmp) && os.Getenv("INVOCATION_ID") != "" {
			return "the daemon runs under systemd with PrivateTmp=yes: its " + tmp + " is not the one you see; put the model in another directory, e.g. under /srv"
		}
	}
	return "is the filesystem mounted on this node?"
}

func explain(uri, p string, err error) error {
	var ie *identityError
	switch {
	case errors.As(err, &ie):
		return err
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("source %q: %w: %s does not exist (%s)", uri, fetchers.ErrNotFound, p, missingHint(p))
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("source %q: %w: %s is not readable, or holds what is not readable, by the user this pull reads as; a file:// pull reads only what its requester may read (a socket pull: the peer's uid and groups; a ModelCache or models.d source: modelcached --file-identity)", uri, fetchers.ErrUnauthorized, p)
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("source %q: %w: the path %s crosses a symlink; give the real path (realpath %s)", uri, fetchers.ErrBadSource, p, p)
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("source %q: %w: %s leads outside the source tree", uri, fetchers.ErrBadSource, p)
	case errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("source %q: file:// needs openat2 (Linux 5.6 or newer): %w", uri, err)
	}
	return fmt.Errorf("source %q: %s: %w", uri, p, err)
}
