package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/internal/testenv"
)

// remoteLoopback treats 127.0.0.2 as a remote host (every test server
// lives on loopback) and everything else as fetchers.IsInternal says.
func remoteLoopback(ip netip.Addr) bool {
	return ip != netip.MustParseAddr("127.0.0.2") && fetchers.IsInternal(ip)
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
		origin := testenv.ServeOn(t, "127.0.0.2", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
		if _, err := lstatTree(h.cfg.Root, name); err == nil {
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

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestCredentialsInURIRedacted pulls with a URI carrying user:pass@ and
// secret query parameters (the server accepts them), fails a second pull
// with such a URI, and sends an invalid one: no secret appears in list,
// inspect, status, wait events, API errors, the log, /metrics or the
// version the store keeps, while the fetch itself used them.
func TestCredentialsInURIRedacted(t *testing.T) {
	const user, pass, tok, sig = "alice", "PASSW0RD", "SECRET1", "SECRET2"
	w := data(4096, 9)
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	var sawCreds sync.Map
	srv.hook = func(rw http.ResponseWriter, r *http.Request) bool {
		u, p, _ := r.BasicAuth()
		if u == user && p == pass && r.URL.Query().Get("token") == tok && r.URL.Query().Get("X-Amz-Signature") == sig {
			sawCreds.Store(r.Method, true)
		}
		return false
	}
	logs := &syncBuffer{}
	cfg := testConfig(t)
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	h := start(t, cfg)
	host := strings.TrimPrefix(srv.URL, "http://")
	uri := func(file string) string {
		return "http://" + user + ":" + pass + "@" + host + "/" + file + "?token=" + tok + "&X-Amz-Signature=" + sig + "&part=1"
	}
	var events []api.Event
	a, err := h.c.Pull(context.Background(), api.PullRequest{Name: "good", URI: uri("w.bin")}, true, func(ev api.Event) { events = append(events, ev) })
	if err != nil || a.Phase != api.PhaseReady || h.read("good", "w.bin") != string(w) {
		t.Fatalf("pull: %+v %v", a, err)
	}
	if _, ok := sawCreds.Load(http.MethodGet); !ok {
		t.Fatal("the server never saw the URI's credentials: the fetch must still use them")
	}
	_, badErr := h.c.Pull(context.Background(), api.PullRequest{Name: "bad", URI: uri("missing.bin"), Keep: true}, true, func(ev api.Event) { events = append(events, ev) })
	if badErr == nil {
		t.Fatal("pull of a missing file succeeded")
	}
	_, invalidErr := h.c.Pull(context.Background(), api.PullRequest{Name: "invalid", URI: "ftp://" + user + ":" + pass + "@" + host + "/w.bin?token=" + tok}, false, nil)
	if invalidErr == nil {
		t.Fatal("an ftp:// pull was accepted")
	}

	// Every output, raw as it crosses the socket or the metrics port.
	sock := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", h.cfg.Socket)
	}}}
	get := func(c *http.Client, u string) string {
		resp, err := c.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	outputs := map[string]string{
		"list":           get(sock, "http://d/v1/artifacts"),
		"inspect good":   get(sock, "http://d/v1/artifacts/good"),
		"inspect bad":    get(sock, "http://d/v1/artifacts/bad"),
		"status":         get(sock, "http://d/v1/status"),
		"wait bad":       get(sock, "http://d/v1/artifacts/bad/wait?timeout=1s"),
		"metrics":        get(http.DefaultClient, "http://"+h.d.MetricsAddr()+"/metrics"),
		"pull error":     badErr.Error(),
		"api error":      invalidErr.Error(),
		"daemon log":     "",
		"stored version": "",
	}
	for _, ev := range events {
		if ev.Artifact != nil {
			outputs["pull events"] += ev.Artifact.URI + " " + ev.Artifact.Message + "\n"
		}
		if ev.Error != nil {
			outputs["pull events"] += ev.Error.Message + "\n"
		}
	}
	stored, err := h.d.Store().Get("good")
	if err != nil || len(stored.Versions) == 0 {
		t.Fatalf("store: %+v %v", stored, err)
	}
	outputs["stored version"] = stored.Versions[0].Source + " " + stored.Versions[0].Message
	h.stop()
	outputs["daemon log"] = logs.String()
	for what, out := range outputs {
		for _, s := range []string{pass, tok, sig} {
			if strings.Contains(out, s) {
				t.Errorf("%s shows the secret %q:\n%s", what, s, out)
			}
		}
	}
	// What is shown still names the source.
	for _, what := range []string{"list", "inspect good", "stored version"} {
		if !strings.Contains(outputs[what], "http://REDACTED@"+host+"/w.bin?token=REDACTED\u0026X-Amz-Signature=REDACTED\u0026part=1") &&
			!strings.Contains(outputs[what], `http://REDACTED@`+host+`/w.bin?token=REDACTED\u0026X-Amz-Signature=REDACTED\u0026part=1`) {
			t.Errorf("%s does not show the redacted source:\n%s", what, outputs[what])
		}
	}
	if !strings.Contains(outputs["inspect bad"], "not found") || !strings.Contains(outputs["daemon log"], "pull failed") {
		t.Errorf("the failure is not explained:\n%s\n%s", outputs["inspect bad"], outputs["daemon log"])
	}

	// The index holds the desires redacted: the secret lived in memory
	// only. After a restart the Ready model still serves (its spec did not
	// change), and a desire that must fetch again says its credentials
	// were not kept and how to give them.
	h2 := start(t, cfg)
	raw, err := h2.d.Store().Records().Desires()
	if err != nil || len(raw) < 2 {
		t.Fatalf("desires after restart: %v %v", raw, err)
	}
	for name, b := range raw {
		for _, s := range []string{pass, tok, sig} {
			if strings.Contains(string(b), s) {
				t.Errorf("the index stores the desire %s with the secret %q: %s", name, s, b)
			}
		}
	}
	if a, err := h2.c.Get(context.Background(), "good"); err != nil || a.Phase != api.PhaseReady {
		t.Fatalf("after a restart the model with credentials in its URI: %+v %v", a, err)
	}
	testenv.Eventually(t, "a desire whose credentials were not kept says so", 30*time.Second, func() error {
		a, err := h2.c.Get(context.Background(), "bad")
		if err == nil && !strings.Contains(a.Message, "not kept across the daemon's restart") {
			return fmt.Errorf("%+v", a)
		}
		return err
	})
}

// TestIngestRefHoldsNoSecret: the ref written beside a partial download
// names its source without the URI's credentials, and two URIs that differ
// only in them stay two refs.
func TestIngestRefHoldsNoSecret(t *testing.T) {
	a := ingestSource("https://h/w.bin?token=SECRET-A")
	b := ingestSource("https://h/w.bin?token=SECRET-B")
	if strings.Contains(a+b, "SECRET") || a == b {
		t.Fatalf("ingest sources %q and %q", a, b)
	}
	if plain := "https://h/w.bin"; ingestSource(plain) != plain {
		t.Fatalf("a URI without credentials changed: %q", ingestSource(plain))
	}
}
