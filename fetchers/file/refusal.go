package file

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/modelcache/modelcache/fetchers"
)

// permError is a read the kernel refused (EACCES, EPERM) at path p of the
// source uri; withRefusal names the component that refused and who asked.
type permError struct {
	uri, p string
	detail string // set by withRefusal: the component and the identity
}

func (e *permError) Error() string {
	if e.detail != "" {
		return fmt.Sprintf("source %q: %v: %s", e.uri, fetchers.ErrUnauthorized, e.detail)
	}
	return fmt.Sprintf("source %q: %v: %s is not readable, or holds what is not readable, by the user this pull reads as; a file:// pull reads only what its requester may read (a socket pull: the peer's uid and groups; a ModelCache or models.d source: modelcached --file-identity)", e.uri, fetchers.ErrUnauthorized, e.p)
}

func (e *permError) Unwrap() error { return fetchers.ErrUnauthorized }

// withRefusal completes a permission error of a read made as id: it finds,
// as id, the first component of the path that refuses (a directory on the
// way that id may not search, or the file or directory itself that id may
// not read) and says so with its mode and owner and with the identity, so
// that the fix is one chmod or chgrp away.
func withRefusal(err error, id *fetchers.Identity) error {
	var pe *permError
	if !errors.As(err, &pe) || pe.detail != "" {
		return err
	}
	comp, need := filepath.Clean(pe.p), "read"
	asIdentity(id, func() error {
		prefix := "/"
		for _, part := range strings.Split(strings.Trim(filepath.Clean(pe.p), "/"), "/") {
			next := filepath.Join(prefix, part)
			var st unix.Stat_t
			if err := unix.Lstat(next, &st); errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
				comp, need = prefix, "search (x)"
				return nil
			} else if err != nil {
				return nil // something else (it went away): name the path as is
			}
			prefix = next
		}
		if st, err := os.Stat(pe.p); err == nil && st.IsDir() {
			need = "list (r)"
		} else {
			need = "read (r)"
		}
		return nil
	})
	// The path named: the source's, or the entry in its tree that refused.
	target := filepath.Clean(pe.p)
	if src, err := ParseURI(pe.uri); err == nil && len(src) > len(target) {
		target = src
	}
	what := "the path " + comp + modeText(comp)
	if comp != target {
		what = "the directory " + comp + modeText(comp) + " on the way to " + target
	}
	pe.detail = fmt.Sprintf("%s refuses %s, who needs %s permission on it; %s",
		what, identityText(id), need, identityWhy)
	return pe
}

// identityWhy says which identity a file:// read uses.
const identityWhy = "a file:// read is made as its requester: for a models.d or ModelCache source modelcached --file-identity (nobody, uid 65534, unless set), for a socket pull the user who ran modelctl"

// identityText names id: uid and gid with their names, and its groups.
func identityText(id *fetchers.Identity) string {
	if id == nil {
		return fmt.Sprintf("the daemon's own user (uid %d)", os.Geteuid())
	}
	s := "uid " + strconv.Itoa(int(id.UID))
	if u, err := user.LookupId(strconv.Itoa(int(id.UID))); err == nil {
		s += " (" + u.Username + ")"
	}
	s += " gid " + strconv.Itoa(int(id.GID))
	if g, err := user.LookupGroupId(strconv.Itoa(int(id.GID))); err == nil {
		s += " (" + g.Name + ")"
	}
	if len(id.Groups) > 0 {
		var gs []string
		for _, g := range id.Groups {
			gs = append(gs, strconv.Itoa(int(g)))
		}
		s += " groups " + strings.Join(gs, ",")
	}
	return s
}

// modeText is " (drwx------ root:root)" for p as the daemon sees it, or "".
func modeText(p string) string {
	var st unix.Stat_t
	if unix.Lstat(p, &st) != nil {
		return ""
	}
	owner, group := strconv.Itoa(int(st.Uid)), strconv.Itoa(int(st.Gid))
	if u, err := user.LookupId(owner); err == nil {
		owner = u.Username
	}
	if g, err := user.LookupGroupId(group); err == nil {
		group = g.Name
	}
	mode := fs.FileMode(st.Mode & 0o777)
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		mode |= fs.ModeDir
	}
	return fmt.Sprintf(" (%s %s:%s)", mode, owner, group)
}
