package daemon

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/fetchers"
)

// remoteLoopback treats 127.0.0.2 as a remote host (every test server
// lives on loopback) and everything else as fetchers.IsInternal says.
func remoteLoopback(ip netip.Addr) bool {
	return ip != netip.MustParseAddr("127.0.0.2") && fetchers.IsInternal(ip)
}

// serveOn starts h on ip:0.
func serveOn(t *testing.T, ip string, h http.Handler) *httptest.Server {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Skipf("cannot listen on %s: %v", ip, err)
	}
	s := httptest.NewUnstartedServer(h)
	s.Listener.Close()
	s.Listener = ln
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// TestRedirectToMetricsRefused: a "remote" origin that redirects to the
// daemon's own metrics port (by address or as localhost) fails the pull
// with the reason, and nothing is committed.
func TestRedirectToMetricsRefused(t *testing.T) {
	cfg := testConfig(t)
	cfg.InternalAddress = remoteLoopback
	cfg.RetryInitial, cfg.RetryMax = time.Hour, time.Hour // the Failed state stays to be read
	h := start(t, cfg)
	_, port, _ := net.SplitHostPort(h.d.MetricsAddr())
	var originAsked sync.Map
	for _, tc := range []struct{ name, target string }{
		{"by-address", "http://127.0.0.1:" + port + "/metrics"},
		{"by-name", "http://localhost:" + port + "/metrics"},
	} {
		name, target := tc.name, tc.target
		origin := serveOn(t, "127.0.0.2", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			originAsked.Store(r.Method, true)
			http.Redirect(w, r, target, http.StatusFound)
		}))
		_, err := h.pull(api.PullRequest{Name: name, URI: origin.URL + "/w.bin"})
		if err == nil {
			t.Fatalf("redirect to %s: the pull succeeded; want it refused", target)
		}
		if !errors.Is(err, api.ErrFailed) || !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "host-internal address") {
			t.Fatalf("redirect to %s: %v; want Failed saying the redirect to a host-internal address was refused", target, err)
		}
		t.Logf("redirect to %s: %v", target, err)
		a, _ := h.c.Get(context.Background(), name)
		if a == nil || a.Phase != api.PhaseFailed || !strings.Contains(a.Message, "host-internal address") {
			t.Fatalf("artifact %+v: want Failed with the reason", a)
		}
		if _, err := h.d.Store().Get(name); !errors.Is(err, cachestore.ErrNotFound) {
			t.Fatalf("redirect to %s: the store has %s (%v); want nothing committed", target, name, err)
		}
		if _, err := os.Lstat(filepath.Join(h.cfg.Root, "models", name)); err == nil {
			t.Fatalf("redirect to %s: a tree appeared", target)
		}
	}
	if _, ok := originAsked.Load(http.MethodHead); !ok {
		t.Fatal("the origin was never asked; the test proves nothing")
	}
	// The same metrics port named directly is reached: the user named it.
	a, err := h.pull(api.PullRequest{Name: "direct", URI: "http://" + h.d.MetricsAddr() + "/metrics"})
	if err != nil || a.Phase != api.PhaseReady {
		t.Fatalf("a loopback URI named directly: %+v %v", a, err)
	}
}
