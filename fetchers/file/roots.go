package file

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/modelcache/modelcache/fetchers"
)

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
