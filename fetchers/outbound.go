package fetchers

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
	"time"
)

// ErrInternalAddress is wrapped by the error of a request that a redirect
// sent to a host-internal address.
var ErrInternalAddress = errors.New("host-internal address")

// metadataAddrs are cloud metadata services that live outside the
// link-local ranges (AWS over IPv6, Alibaba Cloud); they answer with the
// node's credentials, so they count as host-internal.
var metadataAddrs = map[netip.Addr]bool{
	netip.MustParseAddr("fd00:ec2::254"):   true,
	netip.MustParseAddr("100.100.100.200"): true,
}

// IsInternal reports whether ip belongs to this host or its link rather
// than to a remote server: loopback, link-local (unicast and multicast),
// interface-local multicast, unspecified (0.0.0.0/8, ::), cloud metadata
// services, and every address of this host's own interfaces (read at each
// call: pods and DHCP change them). An IPv4-mapped IPv6 address is judged
// as its IPv4 address; an invalid address counts as internal.
func IsInternal(ip netip.Addr) bool { return internalKind(ip) != "" }

// internalKind names why ip is internal, "" when it is not.
func internalKind(ip netip.Addr) string {
	ip = ip.Unmap().WithZone("")
	switch {
	case !ip.IsValid():
		return "not an address"
	case ip.IsLoopback():
		return "loopback"
	case ip.IsUnspecified() || (ip.Is4() && ip.As4()[0] == 0):
		return "unspecified"
	case ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsInterfaceLocalMulticast():
		return "link-local"
	case metadataAddrs[ip]:
		return "cloud metadata service"
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		var raw net.IP
		switch v := a.(type) {
		case *net.IPNet:
			raw = v.IP
		case *net.IPAddr:
			raw = v.IP
		}
		if own, ok := netip.AddrFromSlice(raw); ok && own.Unmap() == ip {
			return "an address of this host's interfaces"
		}
	}
	return ""
}

// Guard is the outbound policy of every fetcher that speaks HTTP: a host
// the source URI names is reached whatever its address (the user named
// it), but a redirect must not lead to a host-internal address (this
// node's metrics, kubelet or a cloud metadata service would otherwise be
// fetched and committed world-readable). A redirect to the origin's own
// scheme, host and port, or any redirect from an origin that is itself
// internal by its name (an internal address literal, localhost), is left
// alone: it reaches nothing the user could not name.
//
// The check is made twice. Before a redirected request is sent, its host
// is refused when it is an internal address literal or a localhost name.
// A DNS name is checked where the address is finally known: the dialer's
// ControlContext refuses an internal address just before connect(2), so
// a name that resolves (or rebinds) to 127.0.0.1 is caught with no
// window between the check and the use; resolving in CheckRedirect would
// check one answer and connect to another. Through an HTTP proxy the
// proxy resolves names, so only the literal check applies there.
//
// A connection is pooled by host and port: a redirected request may reuse
// one made for a request that named that host directly, which reaches
// nothing a direct pull could not.
//
// The zero value uses IsInternal.
type Guard struct {
	// Internal reports whether an address is host-internal; nil means
	// IsInternal. Tests replace it to treat some loopback addresses as
	// remote.
	Internal func(netip.Addr) bool
}

func (g Guard) internal(ip netip.Addr) bool {
	if g.Internal != nil {
		return g.Internal(ip.Unmap().WithZone(""))
	}
	return IsInternal(ip)
}

// describe names why ip is internal for a message.
func (g Guard) describe(ip netip.Addr) string {
	if k := internalKind(ip); k != "" {
		return k
	}
	return "host-internal"
}

// namedInternal reports whether host (no port) is internal by its name:
// an internal address literal or localhost.
func (g Guard) namedInternal(host string) bool {
	if ip, err := netip.ParseAddr(host); err == nil {
		return g.internal(ip)
	}
	return isLocalhostName(host)
}

func isLocalhostName(host string) bool {
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	return h == "localhost" || strings.HasSuffix(h, ".localhost")
}

// hostPort is u's host and port with the scheme's default port filled in.
func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		switch strings.ToLower(u.Scheme) {
		case "https":
			port = "443"
		default:
			port = "80"
		}
	}
	return strings.ToLower(net.JoinHostPort(u.Hostname(), port))
}

type guardKey struct{}

// guardMark travels in the context of a redirected request that must not
// reach an internal address: host is where it goes (a dial to another
// address, a proxy, is not checked), from and to are for the message.
type guardMark struct {
	host, from, to string
}

// refusal builds the error for a redirect to ip.
func (g Guard) refusal(m *guardMark, subject string, ip netip.Addr) error {
	return Permanent(fmt.Errorf("redirect from %s to %s refused: %s is a %w (%s); the daemon reaches loopback, link-local and this node's own addresses only when the source URI names them",
		m.from, m.to, subject, ErrInternalAddress, g.describe(ip)))
}

// Transport returns rt guarded by g. When rt is an *http.Transport (nil
// means a clone of http.DefaultTransport) it is cloned and dials through
// d (nil: 30s connect timeout, 30s keep-alive) with g's check in
// ControlContext; any other RoundTripper gets only the check of address
// literals and localhost names.
func (g Guard) Transport(rt http.RoundTripper, d *net.Dialer) http.RoundTripper {
	if rt == nil {
		rt = http.DefaultTransport
	}
	if t, ok := rt.(*http.Transport); ok {
		t = t.Clone()
		t.DialContext = g.dialContext(d)
		rt = t
	}
	return &guarded{g: g, rt: rt}
}

// dialContext returns a DialContext that refuses internal addresses for
// connections made for a marked request.
func (g Guard) dialContext(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if d == nil {
		d = &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
	}
	dd := *d
	prevCtx, prev := dd.ControlContext, dd.Control
	dd.Control = nil
	dd.ControlContext = func(ctx context.Context, network, address string, c syscall.RawConn) error {
		if m, _ := ctx.Value(guardKey{}).(*guardMark); m != nil {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return Permanent(fmt.Errorf("redirect from %s to %s refused: cannot read the address %q being dialled: %v", m.from, m.to, address, err))
			}
			if g.internal(ap.Addr()) {
				return g.refusal(m, m.host+" resolves to "+ap.Addr().String()+", which", ap.Addr())
			}
		}
		switch {
		case prevCtx != nil:
			return prevCtx(ctx, network, address, c)
		case prev != nil:
			return prev(network, address, c)
		}
		return nil
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if m, _ := ctx.Value(guardKey{}).(*guardMark); m != nil {
			if h, _, err := net.SplitHostPort(addr); err != nil || !strings.EqualFold(h, m.host) {
				ctx = context.WithValue(ctx, guardKey{}, (*guardMark)(nil)) // a proxy: it resolves the name
			}
		}
		return dd.DialContext(ctx, network, addr)
	}
}

type guarded struct {
	g  Guard
	rt http.RoundTripper
}

// RoundTrip passes a request through unless a redirect made it (an
// http.Client sets Request.Response on those) and it leaves the origin:
// then the first request's credentials are removed (the redirect policy,
// redirect.go) and the Guard's check applies.
func (t *guarded) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Response == nil || req.URL == nil {
		return t.rt.RoundTrip(req)
	}
	origin := req
	for origin.Response != nil && origin.Response.Request != nil && origin.Response.Request != origin {
		origin = origin.Response.Request
	}
	from := origin.URL
	if from != nil {
		req = withoutCredentials(req, from) // the redirect policy (redirect.go)
	}
	if from == nil || t.g.namedInternal(from.Hostname()) || SameOrigin(from, req.URL) {
		return t.rt.RoundTrip(req)
	}
	host := req.URL.Hostname()
	m := &guardMark{host: host, from: from.Host, to: req.URL.Host}
	refuse := func(err error) (*http.Response, error) {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if t.g.internal(ip) {
			return refuse(t.g.refusal(m, ip.String(), ip))
		}
	} else if isLocalhostName(host) {
		return refuse(t.g.refusal(m, host, netip.IPv6Loopback()))
	}
	return t.rt.RoundTrip(req.WithContext(context.WithValue(req.Context(), guardKey{}, m)))
}

// Handoff returns ctx marked so that a request made with it to "to" is
// held to the policy of a redirect from "from": a URL that a source hands
// over in an answer's body (NGC's presigned storage URLs in its URL
// manifest) may lead only where a redirect may. An internal address
// literal or localhost name is refused at once (Permanent,
// ErrInternalAddress); a name is checked when it is dialled, by a
// transport from Transport.
func (g Guard) Handoff(ctx context.Context, from, to *url.URL) (context.Context, error) {
	if g.namedInternal(from.Hostname()) || (strings.EqualFold(from.Scheme, to.Scheme) && hostPort(from) == hostPort(to)) {
		return ctx, nil
	}
	host := to.Hostname()
	m := &guardMark{host: host, from: from.Host, to: to.Host}
	if ip, err := netip.ParseAddr(host); err == nil {
		if g.internal(ip) {
			return nil, g.refusal(m, ip.String(), ip)
		}
	} else if isLocalhostName(host) {
		return nil, g.refusal(m, host, netip.IPv6Loopback())
	}
	return context.WithValue(ctx, guardKey{}, m), nil
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the
// transport.
func (t *guarded) CloseIdleConnections() {
	if c, ok := t.rt.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}
