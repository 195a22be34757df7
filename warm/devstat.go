package warm

import (
	"bytes"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// devCounter reads how many bytes a block device has read and written
// since boot.
type devCounter func() (uint64, error)

// deviceOf is the I/O counter of the block device holding the tree open
// at dirfd: /sys/dev/block/MAJ:MIN/stat (a partition, a dm or md device
// each have one). nil when there is none to read (a filesystem on no
// single block device: overlayfs, NFS, tmpfs).
func deviceOf(dirfd int) devCounter {
	var st unix.Stat_t
	if unix.Fstat(dirfd, &st) != nil {
		return nil
	}
	p := fmt.Sprintf("/sys/dev/block/%d:%d/stat", unix.Major(st.Dev), unix.Minor(st.Dev))
	read := func() (uint64, error) {
		raw, err := os.ReadFile(p)
		if err != nil {
			return 0, err
		}
		return parseDevStat(raw)
	}
	if _, err := read(); err != nil {
		return nil
	}
	return read
}

// parseDevStat reads sectors read (the third field) and written (the
// seventh) from a block device's stat file (Documentation/block/stat.rst;
// sectors of 512 bytes whatever the device's own), in bytes.
func parseDevStat(raw []byte) (uint64, error) {
	f := bytes.Fields(raw)
	if len(f) < 7 {
		return 0, fmt.Errorf("a block device stat of %d fields, want 7 or more", len(f))
	}
	r, err1 := strconv.ParseUint(string(f[2]), 10, 64)
	w, err2 := strconv.ParseUint(string(f[6]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("a block device stat that is not numbers: %q", raw)
	}
	return (r + w) * 512, nil
}

// others tells the I/O on a device that is not the warm's: the device's
// bytes since the last look, less the bytes the warm read from it.
type others struct {
	dev  devCounter
	last uint64
	ours uint64
}

// since is the other processes' bytes on the device since the last call
// (the first call sets the mark and says 0). A counter that cannot be
// read says 0: warming then relies on its I/O priority alone.
func (o *others) since() uint64 {
	n, err := o.dev()
	if err != nil {
		return 0
	}
	prev, ours := o.last, o.ours
	o.last, o.ours = n, 0
	if prev == 0 || n < prev+ours {
		return 0
	}
	return n - prev - ours
}
