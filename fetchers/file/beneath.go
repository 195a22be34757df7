package file

import (
	"fmt"
	"io/fs"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/modelcache/modelcache/fetchers"
)

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

// openDir opens the directory at the absolute path p to list it (which
// needs read permission on it), crossing no symlink.
func openDir(p string) (int, error) {
	return openat2(unix.AT_FDCWD, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, unix.RESOLVE_NO_SYMLINKS|unix.RESOLVE_NO_MAGICLINKS)
}

// openPath opens the directory at the absolute path p to open beneath it,
// not to list it (O_PATH): the kernel asks search permission on the
// directories on the way and nothing of p itself, as it does of a plain
// open of a path through p. Crossing no symlink.
func openPath(p string) (int, error) {
	return openat2(unix.AT_FDCWD, p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, unix.RESOLVE_NO_SYMLINKS|unix.RESOLVE_NO_MAGICLINKS)
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
