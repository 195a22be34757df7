package warm

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

var pageSize = int64(os.Getpagesize())

// mincoreWindow bounds one mincore call (and its vector: one byte a
// page, 256 KiB for 1 GiB of file with 4 KiB pages).
const mincoreWindow = 1 << 30

// mapping is a read-only shared mapping of a whole file, for mincore
// only: nothing reads through it, so it faults in no page and takes no
// memory beyond its page tables' reservation.
type mapping struct {
	mem  []byte
	size int64
	vec  []byte
}

// mapFile maps f (of size bytes). A file of size zero gets an empty
// mapping. Close unmaps.
func mapFile(f *os.File, size int64) (*mapping, error) {
	m := &mapping{size: size}
	if size == 0 {
		return m, nil
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("warm: map %s: %w", f.Name(), err)
	}
	m.mem = mem
	return m, nil
}

func (m *mapping) Close() error {
	if m.mem == nil {
		return nil
	}
	err := unix.Munmap(m.mem)
	m.mem = nil
	return err
}

// resident is how many bytes of [off, off+n) are in the page cache
// (whole pages, the last one clipped to the file's end).
func (m *mapping) resident(off, n int64) (int64, error) {
	if off < 0 || n <= 0 || off >= m.size {
		return 0, nil
	}
	end := min(off+n, m.size)
	var total int64
	for start := off &^ (pageSize - 1); start < end; start += mincoreWindow {
		stop := min(start+mincoreWindow, end)
		pages := (stop - start + pageSize - 1) / pageSize
		if int64(cap(m.vec)) < pages {
			m.vec = make([]byte, pages)
		}
		vec := m.vec[:pages]
		length := stop - start
		if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m.mem[start])), uintptr(length), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
			return 0, fmt.Errorf("warm: mincore: %w", e)
		}
		for i, v := range vec {
			if v&1 == 0 {
				continue
			}
			p := start + int64(i)*pageSize
			total += min(p+pageSize, end) - max(p, off)
		}
	}
	return total, nil
}

// Resident reports how many bytes of the files of the tree dir are in
// the page cache, and their total size (mincore over a read-only mapping
// of each file; nothing is read). It walks the tree as Plan does: a
// symlink that leads out of dir is ErrEscape, a file linked twice counts
// once. The figure is a snapshot: the kernel may drop or read pages while
// it is taken.
func Resident(dir string) (resident, total int64, err error) {
	dirfd, err := openTree(dir)
	if err != nil {
		return 0, 0, err
	}
	defer unix.Close(dirfd)
	files, err := walkTree(dirfd, dir)
	if err != nil {
		return 0, 0, err
	}
	for _, fl := range files {
		r, size, err := residentFile(dirfd, dir, fl.rel)
		if err != nil {
			return 0, 0, err
		}
		resident += r
		total += size
	}
	return resident, total, nil
}

func residentFile(dirfd int, root, rel string) (int64, int64, error) {
	f, size, err := openFile(dirfd, root, rel)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	m, err := mapFile(f, size)
	if err != nil {
		return 0, 0, err
	}
	defer m.Close()
	r, err := m.resident(0, size)
	if err != nil {
		return 0, 0, fmt.Errorf("%s in %s: %w", rel, root, err)
	}
	return r, size, nil
}
