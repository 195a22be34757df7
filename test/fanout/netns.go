package fanout

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/modelcache/modelcache/internal/testenv"
)

// Net is a bridge in the root network namespace with an address of its
// own (Host: where the API server's forwarder and the origin listen) and
// network namespaces hanging off it, each with one veth and one address
// of the bridge's /24. Names carry the test process's pid, so two runs
// never collide and a later run removes what a killed one left.
type Net struct {
	Bridge string
	Host   netip.Addr
	id     string // the links' common part: <pid hex>n<seq>
	nsName string // the namespaces' common part: fanout-<pid>-<seq>-
	prefix netip.Prefix
	n      int // namespaces added
}

var netSeq atomic.Int64

// Stale names: the bridge fo<pid hex>n<seq>, its veths fo<pid hex>n<seq>v<i>,
// the namespaces fanout-<pid>-<seq>-<i>.
var (
	staleBridge = regexp.MustCompile(`^fo([0-9a-f]+)n[0-9]+$`)
	staleNS     = regexp.MustCompile(`^fanout-([0-9]+)-[0-9]+-[0-9]+$`)
)

// NewNet makes the bridge on a free 10.77.X.0/24 and removes it (and
// every namespace added) at cleanup. It needs root and iproute2's ip;
// without them it stops the test as testenv.Missing does.
func NewNet(t testing.TB) *Net {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (network namespaces, a bridge)", "run the tests as root, as CI does")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		testenv.Missing(t, "iproute2's ip", "apt-get install iproute2")
	}
	sweep()
	prefix, err := freeSubnet()
	if err != nil {
		t.Fatal(err)
	}
	seq := netSeq.Add(1)
	n := &Net{id: fmt.Sprintf("%xn%d", os.Getpid(), seq), nsName: fmt.Sprintf("fanout-%d-%d-", os.Getpid(), seq), prefix: prefix}
	n.Bridge = "fo" + n.id
	n.Host = prefix.Addr().Next()
	t.Cleanup(n.remove)
	for _, args := range [][]string{
		{"link", "add", n.Bridge, "type", "bridge"},
		{"addr", "add", netip.PrefixFrom(n.Host, 24).String(), "dev", n.Bridge},
		{"link", "set", n.Bridge, "up"},
	} {
		if err := ip(args...); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// Add makes a namespace with its own loopback and one veth to the
// bridge, the default route through the bridge's address, and returns
// its name (for ip netns exec) and address. It is removed with the Net.
func (n *Net) Add(t testing.TB) (string, netip.Addr) {
	t.Helper()
	i := n.n
	n.n++
	addr := n.Host
	for range i + 1 {
		addr = addr.Next()
	}
	if !n.prefix.Contains(addr) || addr.As4()[3] == 255 {
		t.Fatalf("fanout: %s has no address left for namespace %d", n.prefix, i)
	}
	ns := n.nsName + strconv.Itoa(i)
	host, peer := fmt.Sprintf("fo%sv%d", n.id, i), fmt.Sprintf("fo%sp%d", n.id, i)
	for _, args := range [][]string{
		{"netns", "add", ns},
		{"link", "add", host, "type", "veth", "peer", "name", peer},
		{"link", "set", host, "master", n.Bridge, "up"},
		{"link", "set", peer, "netns", ns},
		{"-n", ns, "link", "set", peer, "name", "eth0"},
		{"-n", ns, "addr", "add", netip.PrefixFrom(addr, 24).String(), "dev", "eth0"},
		{"-n", ns, "link", "set", "eth0", "up"},
		{"-n", ns, "link", "set", "lo", "up"},
		{"-n", ns, "route", "add", "default", "via", n.Host.String()},
	} {
		if err := ip(args...); err != nil {
			t.Fatal(err)
		}
	}
	return ns, addr
}

// remove deletes the namespaces (their veths go with them), any veth an
// Add that failed left behind, and the bridge; what is already gone is
// no error.
func (n *Net) remove() {
	for _, ns := range namespaces() {
		if strings.HasPrefix(ns, n.nsName) {
			ip("netns", "del", ns)
		}
	}
	for i := range n.n {
		ip("link", "del", fmt.Sprintf("fo%sv%d", n.id, i))
	}
	ip("link", "del", n.Bridge)
}

// sweep removes the bridges and namespaces of runs whose process is
// gone (killed before its cleanup ran).
func sweep() {
	for _, ns := range namespaces() {
		if m := staleNS.FindStringSubmatch(ns); m != nil {
			if pid, _ := strconv.Atoi(m[1]); !alive(pid) {
				ip("netns", "del", ns)
			}
		}
	}
	out, _ := exec.Command("ip", "-o", "link", "show", "type", "bridge").Output()
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name := strings.TrimSuffix(f[1], ":")
		if m := staleBridge.FindStringSubmatch(name); m != nil {
			if pid, err := strconv.ParseInt(m[1], 16, 32); err == nil && !alive(int(pid)) {
				ip("link", "del", name)
			}
		}
	}
}

func alive(pid int) bool {
	return pid > 0 && !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// namespaces lists the named network namespaces.
func namespaces() []string {
	out, _ := exec.Command("ip", "netns", "list").Output()
	var names []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names
}

// freeSubnet picks a 10.77.X.0/24 that no interface of the root
// namespace has an address in.
func freeSubnet() (netip.Prefix, error) {
	out, err := exec.Command("ip", "-o", "-4", "addr", "show").Output()
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("ip addr show: %w", err)
	}
	used := map[byte]bool{}
	for _, f := range strings.Fields(string(out)) {
		if p, err := netip.ParsePrefix(f); err == nil && p.Addr().Is4() {
			if a := p.Addr().As4(); a[0] == 10 && a[1] == 77 {
				used[a[2]] = true
			}
		}
	}
	start := rand.IntN(256)
	for k := range 256 {
		x := byte((start + k) % 256)
		if !used[x] {
			return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 77, x, 0}), 24), nil
		}
	}
	return netip.Prefix{}, errors.New("fanout: every 10.77.X.0/24 is in use; remove stale fo* bridges (ip link del)")
}

func ip(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}
