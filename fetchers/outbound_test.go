package fetchers_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/internal/testenv"
)

func TestIsInternal(t *testing.T) {
	for _, tc := range []struct {
		addr     string
		internal bool
	}{
		{"127.0.0.1", true},
		{"127.8.9.10", true},
		{"::1", true},
		{"169.254.169.254", true}, // the metadata service of most clouds
		{"169.254.0.1", true},
		{"fe80::1", true},
		{"fe80::1%lo", true},
		{"ff02::1", true}, // link-local multicast
		{"0.0.0.0", true},
		{"0.1.2.3", true},
		{"::", true},
		{"::ffff:127.0.0.1", true}, // v4-mapped v6 is judged as v4
		{"::ffff:169.254.169.254", true},
		{"::ffff:0.0.0.0", true},
		{"fd00:ec2::254", true}, // AWS metadata over IPv6
		{"100.100.100.200", true},
		{"8.8.8.8", false},
		{"1.1.1.1", false},
		{"::ffff:8.8.8.8", false},
		{"2001:4860:4860::8888", false},
		{"203.0.113.7", false},
	} {
		if got := fetchers.IsInternal(netip.MustParseAddr(tc.addr)); got != tc.internal {
			t.Errorf("IsInternal(%s) = %v, want %v", tc.addr, got, tc.internal)
		}
	}
	if fetchers.IsInternal(netip.Addr{}) != true {
		t.Error("the zero Addr must count as internal (fail closed)")
	}
	// Every address of this host's interfaces is internal, whatever its range.
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		ip, _ := netip.AddrFromSlice(n.IP)
		if !fetchers.IsInternal(ip) {
			t.Errorf("IsInternal(%s) = false for an address of this host's interfaces", ip)
		}
		if ip.Is4() && !fetchers.IsInternal(netip.AddrFrom16(ip.As16())) {
			t.Errorf("IsInternal(%s) = false for the v4-mapped form of an own address", netip.AddrFrom16(ip.As16()))
		}
	}
}

// remoteIn127 treats 127.0.0.2 and 127.0.0.3 as remote hosts and the rest
// as IsInternal says.
func remoteIn127(ip netip.Addr) bool {
	if ip == netip.MustParseAddr("127.0.0.2") || ip == netip.MustParseAddr("127.0.0.3") {
		return false
	}
	return fetchers.IsInternal(ip)
}

func TestGuardRedirects(t *testing.T) {
	inside := testenv.ServeOn(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "node-internal")
	}))
	outside := testenv.ServeOn(t, "127.0.0.3", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "remote")
	}))
	_, port, _ := net.SplitHostPort(inside.Listener.Addr().String())
	redirector := func(to string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/self" {
				http.Redirect(w, r, "/final", http.StatusFound)
				return
			}
			if r.URL.Path == "/final" {
				io.WriteString(w, "origin")
				return
			}
			http.Redirect(w, r, to, http.StatusFound)
		})
	}
	client := &http.Client{Transport: fetchers.Guard{Internal: remoteIn127}.Transport(nil, nil)}
	get := func(u string) (string, error) {
		resp, err := client.Get(u)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	for _, tc := range []struct {
		name, origin, target string
		want, refused        string // body, or a part of the refusal
	}{
		{"to a loopback literal", "127.0.0.2", inside.URL + "/x", "", "127.0.0.1 is a host-internal address (loopback)"},
		{"to localhost by name", "127.0.0.2", "http://localhost:" + port + "/x", "", "host-internal address"},
		{"to link-local metadata", "127.0.0.2", "http://169.254.169.254/latest/meta-data/", "", "169.254.169.254 is a host-internal address (link-local)"},
		{"to the unspecified address", "127.0.0.2", "http://0.0.0.0:" + port + "/x", "", "(unspecified)"},
		{"to a v4-mapped loopback", "127.0.0.2", "http://[::ffff:127.0.0.1]:" + port + "/x", "", "host-internal address"},
		{"to a remote host", "127.0.0.2", outside.URL + "/x", "remote", ""},
		{"within the origin", "127.0.0.2", "", "origin", ""},
		{"from an origin the user named internal", "127.0.0.1", inside.URL + "/x", "node-internal", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			origin := testenv.ServeOn(t, tc.origin, redirector(tc.target))
			path := "/go"
			if tc.target == "" {
				path = "/self"
			}
			body, err := get(origin.URL + path)
			if tc.refused == "" {
				if err != nil || body != tc.want {
					t.Fatalf("got %q, %v; want %q", body, err, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("followed the redirect to %s and got %q", tc.target, body)
			}
			if !errors.Is(err, fetchers.ErrInternalAddress) || !fetchers.IsPermanent(err) || !strings.Contains(err.Error(), tc.refused) || !strings.Contains(err.Error(), "redirect from "+strings.TrimPrefix(origin.URL, "http://")) {
				t.Fatalf("error %q: want a permanent ErrInternalAddress saying %q and naming the origin", err, tc.refused)
			}
		})
	}
	// A host named directly is reached, internal or not.
	if body, err := get(inside.URL + "/x"); err != nil || body != "node-internal" {
		t.Fatalf("a directly named loopback host: %q, %v", body, err)
	}
}

// TestGuardRedirectToNameResolvingInside: a DNS name is judged by the
// address the dialer connects to, so a name that resolves (or rebinds)
// to an internal address is refused; one that resolves outside is not.
func TestGuardRedirectToNameResolvingInside(t *testing.T) {
	g := fetchers.Guard{Internal: remoteIn127}
	client, inPort, outPort := resolvingInside(t, g)
	for _, tc := range []struct{ target, want, refused string }{
		{"http://rebind.test:" + inPort + "/x", "", "rebind.test resolves to 127.0.0.1, which is a host-internal address (loopback)"},
		{"http://cdn.test:" + outPort + "/x", "remote", ""},
	} {
		origin := testenv.ServeOn(t, "127.0.0.2", http.RedirectHandler(tc.target, http.StatusFound))
		resp, err := client.Get(origin.URL + "/go")
		if tc.refused != "" {
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				t.Fatalf("redirect to %s followed: %q", tc.target, b)
			}
			if !errors.Is(err, fetchers.ErrInternalAddress) || !strings.Contains(err.Error(), tc.refused) {
				t.Fatalf("redirect to %s: %v; want it to say %q", tc.target, err, tc.refused)
			}
			continue
		}
		if err != nil {
			t.Fatalf("redirect to %s: %v", tc.target, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(b) != tc.want {
			t.Fatalf("redirect to %s: %q, want %q", tc.target, b, tc.want)
		}
	}
}

// resolvingInside serves "node-internal" on 127.0.0.1 and "remote" on
// 127.0.0.3 and returns a client guarded by g whose resolver maps
// rebind.test to the first and cdn.test to the second, with their ports.
func resolvingInside(t *testing.T, g fetchers.Guard) (*http.Client, string, string) {
	inside := testenv.ServeOn(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "node-internal") }))
	outside := testenv.ServeOn(t, "127.0.0.3", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "remote") }))
	_, inPort, _ := net.SplitHostPort(inside.Listener.Addr().String())
	_, outPort, _ := net.SplitHostPort(outside.Listener.Addr().String())
	res := fakeDNS(t, map[string]string{"rebind.test.": "127.0.0.1", "cdn.test.": "127.0.0.3"})
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	return &http.Client{Transport: g.Transport(tr, &net.Dialer{Resolver: res})}, inPort, outPort
}

// fakeDNS answers A queries for the names given (fully qualified) and
// nothing else, on a UDP socket on loopback; it returns a resolver that
// asks only it.
func fakeDNS(t *testing.T, names map[string]string) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 512)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			q := buf[:n]
			if len(q) < 12 {
				continue
			}
			// The question: labels, then type and class.
			i, name := 12, ""
			for i < len(q) && q[i] != 0 {
				l := int(q[i])
				if i+1+l > len(q) {
					break
				}
				name += string(q[i+1:i+1+l]) + "."
				i += 1 + l
			}
			if i+5 > len(q) {
				continue
			}
			qtype := int(q[i+1])<<8 | int(q[i+2])
			question := q[12 : i+5]
			ip := net.ParseIP(names[strings.ToLower(name)]).To4()
			resp := append([]byte{q[0], q[1], 0x81, 0x80, 0, 1, 0, 0, 0, 0, 0, 0}, question...)
			if ip == nil {
				resp[3] = 0x83 // NXDOMAIN
			} else if qtype == 1 {
				resp[7] = 1
				resp = append(resp, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4)
				resp = append(resp, ip...)
			}
			pc.WriteTo(resp, from)
		}
	}()
	addr := pc.LocalAddr().String()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", addr)
	}}
}

// TestGuardHandoff: a URL that a source hands over in a body is held to
// the policy of a redirect from the source: an internal literal is refused
// at once, a name that resolves inside when it is dialled; a remote one,
// and any URL on the source's own origin, pass.
func TestGuardHandoff(t *testing.T) {
	g := fetchers.Guard{Internal: remoteIn127}
	client, inPort, outPort := resolvingInside(t, g)
	inside := "http://127.0.0.1:" + inPort
	api, _ := url.Parse("http://127.0.0.2:1/v2/x")
	for _, tc := range []struct{ target, want, refused string }{
		{inside + "/x", "", "127.0.0.1 is a host-internal address (loopback)"},
		{"http://localhost:" + inPort + "/x", "", "localhost is a host-internal address"},
		{"http://rebind.test:" + inPort + "/x", "", "rebind.test resolves to 127.0.0.1"},
		{"http://cdn.test:" + outPort + "/x", "remote", ""},
	} {
		to, _ := url.Parse(tc.target)
		ctx, err := g.Handoff(context.Background(), api, to)
		if err == nil {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, tc.target, nil)
			var resp *http.Response
			if resp, err = client.Do(req); err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if tc.refused != "" || string(b) != tc.want {
					t.Fatalf("%s: got %q; want %q, refused %q", tc.target, b, tc.want, tc.refused)
				}
				continue
			}
		}
		if tc.refused == "" || !errors.Is(err, fetchers.ErrInternalAddress) || !fetchers.IsPermanent(err) || !strings.Contains(err.Error(), tc.refused) {
			t.Fatalf("%s: %v; want refused with %q", tc.target, err, tc.refused)
		}
	}
	// The source's own origin is not a handoff: it may be anywhere.
	self, _ := url.Parse("http://127.0.0.2:1/files/a")
	if ctx, err := g.Handoff(context.Background(), api, self); err != nil || ctx != context.Background() {
		t.Fatalf("a URL on the source's origin: %v", err)
	}
}
