package file

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"

	"github.com/modelcache/modelcache/fetchers"
)

func explain(uri, p string, err error) error {
	var ie *identityError
	switch {
	case errors.As(err, &ie):
		return err
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("source %q: %w: %s does not exist (%s)", uri, fetchers.ErrNotFound, p, missingHint(p))
	case errors.Is(err, fs.ErrPermission):
		return &permError{uri: uri, p: p} // withRefusal names the component and the identity
	case errors.Is(err, unix.ELOOP):
		return fmt.Errorf("source %q: %w: the path %s crosses a symlink; give the real path (realpath %s)", uri, fetchers.ErrBadSource, p, p)
	case errors.Is(err, unix.EXDEV):
		return fmt.Errorf("source %q: %w: %s leads outside the source tree", uri, fetchers.ErrBadSource, p)
	case errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("source %q: file:// needs openat2 (Linux 5.6 or newer): %w", uri, err)
	}
	return fmt.Errorf("source %q: %s: %w", uri, p, err)
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
