package fetchers

import (
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// ReadConfigFile reads a small file the node's configuration names (a
// public key, a trusted root, a credentials file): only a regular file, at
// most max bytes, opened without blocking so that a FIFO or a device in
// its place fails at once instead of hanging or filling memory. The
// error names the path and what it is, never the file's content.
func ReadConfigFile(path string, max int64) ([]byte, error) { return ReadRegularFile(path, max, true) }

// ReadRegularFile is ReadConfigFile; with follow false a symlink at path
// is refused too (models.d reads only the files it holds).
func ReadRegularFile(path string, max int64, follow bool) ([]byte, error) {
	flags := unix.O_RDONLY | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC
	if !follow {
		flags |= unix.O_NOFOLLOW
	}
	fd, err := unix.Open(path, flags, 0)
	if err == unix.ELOOP && !follow {
		return nil, fmt.Errorf("%s: %w: a symlink, not a regular file", path, ErrBadSource)
	}
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %w: a %s, not a regular file", path, ErrBadSource, typeName(fi.Mode()))
	}
	if fi.Size() > max {
		return nil, fmt.Errorf("%s: %w: %d bytes, more than the %d allowed", path, ErrBadSource, fi.Size(), max)
	}
	b, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(b)) > max {
		return nil, fmt.Errorf("%s: %w: more than the %d bytes allowed", path, ErrBadSource, max)
	}
	return b, nil
}

// typeName names a file type for an error message.
func typeName(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&os.ModeNamedPipe != 0:
		return "FIFO"
	case m&os.ModeSocket != 0:
		return "socket"
	case m&os.ModeCharDevice != 0:
		return "character device"
	case m&os.ModeDevice != 0:
		return "block device"
	case m&os.ModeSymlink != 0:
		return "symlink"
	}
	return "special file"
}

// TypeName names the type of a file that is not a regular file.
func TypeName(m os.FileMode) string { return typeName(m) }
