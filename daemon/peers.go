package daemon

import (
	"log/slog"
	"math"
	"net"
	"sync"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// unknownUID counts the connections whose peer credentials could not be
// read (never seen on a unix socket); they share one limit.
const unknownUID = math.MaxUint32

// peerListener bounds what one local user can hold on the API socket: it
// counts the open connections of each peer uid (SO_PEERCRED) and closes a
// connection from a uid already at limit as soon as it is accepted, so no
// descriptor stays with it. Uids for which exempt holds (root, the
// daemon's own) are counted but never limited: they are served however
// many connections a plain user holds. limit 0 means no limit.
//
// Accept returns the listener's errors unchanged, so http.Server backs
// off on temporary ones (EMFILE, ENFILE) instead of spinning or stopping.
// Safe for concurrent use; Close closes the wrapped listener.
type peerListener struct {
	net.Listener
	limit   int
	exempt  func(uid uint32) bool
	open    prometheus.Gauge   // connections open now
	refused prometheus.Counter // connections closed at accept
	log     *slog.Logger

	mu      sync.Mutex
	conns   map[uint32]int       // uid → open connections; no zero entries
	warned  map[uint32]time.Time // uid → last refusal logged
	refusal map[uint32]int       // uid → refusals since that log line
}

func newPeerListener(ln net.Listener, limit int, exempt func(uint32) bool, m *metrics, log *slog.Logger) *peerListener {
	return &peerListener{
		Listener: ln, limit: limit, exempt: exempt, open: m.apiConns, refused: m.apiRefused, log: log,
		conns: map[uint32]int{}, warned: map[uint32]time.Time{}, refusal: map[uint32]int{},
	}
}

// Accept returns the next connection whose uid is under its limit, as a
// *peerConn that carries the peer's credentials.
func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uc, ok := c.(*net.UnixConn)
		if !ok {
			return c, nil // not a unix socket: nothing to count by
		}
		cred := peerCred(uc)
		uid := uint32(unknownUID)
		if cred != nil {
			uid = cred.Uid
		}
		if !l.admit(uid) {
			uc.Close()
			l.refused.Inc()
			continue
		}
		l.open.Inc()
		pc := &peerConn{UnixConn: uc, cred: cred}
		pc.release = func() { l.done(uid) }
		return pc, nil
	}
}

// admit counts a new connection of uid, or says it is over the limit
// (logged at most once a minute per uid, with how many were refused).
func (l *peerListener) admit(uid uint32) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.limit > 0 && l.conns[uid] >= l.limit && !l.exempt(uid) {
		l.refusal[uid]++
		if now := time.Now(); now.Sub(l.warned[uid]) >= time.Minute {
			l.log.Warn("api socket: peer at its connection limit; closing its new connections", "uid", uid, "limit", l.limit, "refused", l.refusal[uid])
			l.warned[uid], l.refusal[uid] = now, 0
		}
		return false
	}
	l.conns[uid]++
	return true
}

func (l *peerListener) done(uid uint32) {
	l.open.Dec()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conns[uid]--; l.conns[uid] <= 0 {
		delete(l.conns, uid)
	}
}

// held is how many connections uid has open (for tests).
func (l *peerListener) held(uid uint32) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.conns[uid]
}

// peerConn is an accepted connection with its peer's credentials (nil
// when unreadable); closing it, once or more, gives its slot back. It
// embeds the *net.UnixConn, so http.Server still finds CloseWrite.
type peerConn struct {
	*net.UnixConn
	cred    *peer
	release func()
	once    sync.Once
}

func (c *peerConn) Close() error {
	err := c.UnixConn.Close()
	c.once.Do(c.release)
	return err
}

// peer is who connected, as the kernel recorded it at connect(2): the
// credentials (SO_PEERCRED) and the supplementary groups (SO_PEERGROUPS).
// Both are read once, at accept, from the socket itself, never from
// /proc/<pid>: a peer whose process exits and whose pid is reused by a
// member of the socket group must not borrow that member's groups.
type peer struct {
	unix.Ucred
	Groups []uint32
}

// inGroup reports whether gid is the peer's primary or a supplementary group.
func (p *peer) inGroup(gid int) bool {
	if int(p.Gid) == gid {
		return true
	}
	for _, g := range p.Groups {
		if int(g) == gid {
			return true
		}
	}
	return false
}

// peerCred reads who connected (nil when it cannot be read).
func peerCred(uc *net.UnixConn) *peer {
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil
	}
	var p *peer
	raw.Control(func(fd uintptr) {
		cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err != nil {
			return
		}
		groups, err := peerGroups(int(fd))
		if err != nil {
			return // no groups known: refuse rather than guess
		}
		p = &peer{Ucred: *cred, Groups: groups}
	})
	return p
}

// peerGroups reads SO_PEERGROUPS (Linux 4.13+), growing the buffer when
// the kernel says it is too small.
func peerGroups(fd int) ([]uint32, error) {
	buf := make([]uint32, 64)
	for {
		n := uint32(len(buf) * 4)
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		switch errno {
		case 0:
			return buf[:n/4], nil
		case unix.ERANGE:
			if int(n/4) <= len(buf) || n/4 > 1<<16 {
				return nil, errno
			}
			buf = make([]uint32, n/4)
		default:
			return nil, errno
		}
	}
}
