package file

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"

	"github.com/modelcache/modelcache/fetchers"
)

// identityError: the daemon cannot take on the requester's identity.
type identityError struct{ err error }

func (e *identityError) Error() string { return e.err.Error() }
func (e *identityError) Unwrap() error { return e.err }

// asIdentity runs fn with the filesystem credentials of id: its uid as
// fsuid, its gid as fsgid and its groups, so that every open in fn is
// checked by the kernel as that user's (modes, ACLs, LSMs; a non-zero
// fsuid also drops CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the
// thread). The change is confined to one OS thread that fn runs on and
// that is thrown away afterwards: the goroutine ends locked to it, so the
// Go runtime never runs anything else there.
//
// A nil id, root when the daemon is root, or the daemon's own uid need no
// change: fn runs as the daemon.
func asIdentity(id *fetchers.Identity, fn func() error) error {
	euid := os.Geteuid()
	if id == nil || int(id.UID) == euid || (id.UID == 0 && euid == 0) {
		return fn()
	}
	if id.UID == 0 { // root asked; a non-root daemon reads as itself, with less
		return fn()
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		errc <- func() error {
			groups := make([]int, 0, len(id.Groups)+1)
			groups = append(groups, int(id.GID))
			for _, g := range id.Groups {
				groups = append(groups, int(g))
			}
			if err := unix.Setgroups(groups); err != nil {
				return cannotAct(id, err)
			}
			if err := setfs(unix.SetfsgidRetGid, int(id.GID)); err != nil {
				return cannotAct(id, err)
			}
			if err := setfs(unix.SetfsuidRetUid, int(id.UID)); err != nil {
				return cannotAct(id, err)
			}
			return fn()
		}()
	}()
	return <-errc
}

// setfs sets an fsuid or fsgid and checks that it took: the syscalls
// return the previous value, not an error, when they are refused.
func setfs(set func(int) (int, error), v int) error {
	if _, err := set(v); err != nil {
		return err
	}
	if cur, _ := set(v); cur != v {
		return unix.EPERM
	}
	return nil
}

func cannotAct(id *fetchers.Identity, err error) error {
	return &identityError{fmt.Errorf("%w: the daemon cannot read as uid %d to check what that user may read (%v: it needs CAP_SETUID and CAP_SETGID); ask root to pull it, or run modelcached as root",
		fetchers.ErrUnauthorized, id.UID, err)}
}
