package main

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"syscall"

	"github.com/modelcache/modelcache/api"
)

// unreachable says why the socket could not be used and what fixes it:
// a socket this user may not open names its group and mode; a missing
// one says how to start the daemon; one nobody serves says the daemon
// stopped.
func unreachable(ua *api.UnavailableError) string {
	sock := ua.Socket
	switch {
	case errors.Is(ua.Err, syscall.EACCES) || errors.Is(ua.Err, syscall.EPERM):
		return fmt.Sprintf("permission denied opening modelcached's socket %s\n  %s", sock, socketRemedy(sock))
	case errors.Is(ua.Err, syscall.ENOENT):
		return fmt.Sprintf("no modelcached socket at %s\n"+
			"  Is modelcached running? Start it with 'sudo systemctl start modelcached' (the .deb), or 'make run' in a checkout,\n"+
			"  or point --socket / MODELCACHE_SOCKET at the socket it serves.", sock)
	case errors.Is(ua.Err, syscall.ECONNREFUSED):
		return fmt.Sprintf("nothing serves the socket %s (modelcached stopped or crashed?)\n"+
			"  'sudo systemctl status modelcached' and 'journalctl -u modelcached' say why; 'sudo systemctl start modelcached' (or 'make run' in a checkout) starts it.", sock)
	}
	return fmt.Sprintf("%v\n  Is modelcached running? Start it with 'sudo systemctl start modelcached' (the .deb), or 'make run' in a checkout,\n"+
		"  or point --socket / MODELCACHE_SOCKET at the socket it serves.", ua)
}

// socketRemedy looks at the socket and its directory and says which group
// to join or which mode the daemon must set.
func socketRemedy(sock string) string {
	fi, err := os.Stat(sock)
	if err != nil { // the directory on the way is closed to us
		return fmt.Sprintf("a directory on the way to it is closed to you (%v); run as root or ask for access to it.", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "run as root (sudo) or ask for access to it."
	}
	group := strconv.Itoa(int(st.Gid))
	if g, err := user.LookupGroupId(group); err == nil {
		group = g.Name
	}
	owner := strconv.Itoa(int(st.Uid))
	if u, err := user.LookupId(owner); err == nil {
		owner = u.Username
	}
	mode := fi.Mode().Perm()
	s := fmt.Sprintf("The socket is mode %04o, owner %s, group %s.", mode, owner, group)
	if mode&0o060 == 0o060 && st.Gid != 0 {
		s += fmt.Sprintf(" Join group %s to use it (sudo usermod -aG %s $USER, then log in again), or run as root (sudo).", group, group)
	} else {
		s += " Run as root (sudo)."
	}
	return s + " An operator lets every local user read the cache with modelcached --socket-mode 0666 (writes still need the group); see docs/configuration.md (Socket permissions)."
}
