package daemon

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/internal/testenv"
)

const (
	// heldConns is how many connections the plain user of
	// TestSocketPeerConnectionLimit opens and holds.
	heldConns = 20000
	// daemonFDs is the daemon's descriptor budget in that test: below
	// heldConns, as a node's LimitNOFILE is below what a user can open
	// given time (the issue was found with a limit of 20000).
	daemonFDs = 16384
)

// TestSocketPeerConnectionLimit: a plain local user (uid 65534) opens
// 20,000 connections, makes a request on each and holds them all, more
// than the daemon has descriptors. The daemon keeps at most the per-uid
// limit of them, counts the rest as refused, and root's status answers
// (and is right) while the user holds them; once the user goes, its
// count returns to zero.
func TestSocketPeerConnectionLimit(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (to run a peer as uid 65534 with setpriv)", "run the tests as root, as CI does")
	}
	setpriv := testenv.Require(t, "setpriv", "apt-get install util-linux")

	// A directory uid 65534 can reach: the socket and a copy of this test
	// binary (go test builds it in a directory only root may enter).
	dir, err := os.MkdirTemp("", "modelcache-peers")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "daemon.test")
	if err := copyExecutable(bin); err != nil {
		t.Fatal(err)
	}

	// The daemon (this process) gets daemonFDs descriptors. The user's
	// processes inherit the hard limit, raised above heldConns where this
	// process may (CAP_SYS_RESOURCE), and raise their soft limit to it;
	// where it may not, the user splits its connections over processes.
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig) })
	lim := syscall.Rlimit{Cur: daemonFDs, Max: max(orig.Max, heldConns+256)}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		lim.Max = orig.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatalf("RLIMIT_NOFILE %+v: %v", lim, err)
		}
	}
	perProc := int(lim.Max) - 256 // what one process may hold, its own descriptors aside
	procs := (heldConns + perProc - 1) / perProc

	cfg := testConfig(t)
	cfg.Socket = filepath.Join(dir, "s.sock")
	h := start(t, cfg)

	type peer struct {
		cmd    *exec.Cmd
		stdin  io.Closer
		stderr *strings.Builder
		report chan string
		exited bool
	}
	t0 := time.Now()
	var peers []*peer
	for i := 0; i < procs; i++ {
		share := heldConns / procs
		if i < heldConns%procs {
			share++
		}
		p := &peer{stderr: &strings.Builder{}, report: make(chan string, 1)}
		p.cmd = exec.Command(setpriv, fmt.Sprintf("--reuid=%d", nobody), fmt.Sprintf("--regid=%d", nobody), "--clear-groups",
			bin, "-test.run=^TestHelperHoldConnections$")
		p.cmd.Env = append(os.Environ(), "MODELCACHE_HOLD_SOCKET="+cfg.Socket, "MODELCACHE_HOLD_CONNS="+strconv.Itoa(share))
		p.cmd.Stderr = p.stderr
		stdin, err := p.cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		stdout, err := p.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		p.stdin = stdin
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if !p.exited {
				p.stdin.Close()
				p.cmd.Process.Kill()
				p.cmd.Wait()
			}
		})
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				if strings.HasPrefix(sc.Text(), "held ") {
					p.report <- sc.Text()
					io.Copy(io.Discard, stdout)
					return
				}
			}
			close(p.report)
		}()
		peers = append(peers, p)
	}
	held := 0
	for i, p := range peers {
		var line string
		select {
		case l, ok := <-p.report:
			if !ok {
				p.cmd.Wait()
				p.exited = true
				t.Fatalf("peer process %d ended without a report:\n%s", i, p.stderr.String())
			}
			line = l
		case <-time.After(5 * time.Minute):
			t.Fatalf("peer process %d did not finish opening connections in 5m:\n%s", i, p.stderr.String())
		}
		var n, uid int
		fmt.Sscanf(line, "held %d uid %d", &n, &uid)
		if uid != nobody {
			t.Fatalf("peer process %d ran as uid %d, want %d", i, uid, nobody)
		}
		held += n
		t.Logf("peer process %d: %s", i, line)
	}
	opened := time.Since(t0)
	if held != heldConns {
		t.Fatalf("uid %d held %d connections, want %d", nobody, held, heldConns)
	}

	// Root, on a fresh connection, while the user holds them all.
	root := &api.Client{Socket: cfg.Socket}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ts := time.Now()
	st, err := root.Status(ctx)
	lat := time.Since(ts)
	if err != nil {
		t.Fatalf("root's status while uid %d holds %d connections: %v", nobody, held, err)
	}
	if st.Socket != cfg.Socket || st.Root != h.d.Store().Root() || st.Version != cfg.Version {
		t.Fatalf("root's status is wrong: %+v", st)
	}
	limit := cfg.MaxConnectionsPerUID
	pl := h.d.peers.Load()
	if n := pl.held(nobody); n > limit {
		t.Fatalf("the daemon holds %d connections of uid %d, limit %d", n, nobody, limit)
	}
	// A peer's connect returns once the kernel queues the connection; the
	// daemon accepts (and refuses) the queue's last ones later, as fast as
	// a loaded machine lets it: wait while the count grows.
	var refused int
	testenv.EventuallyProgressing(t, fmt.Sprintf("%d connections refused", heldConns-limit), time.Minute, func() (int64, error) {
		if refused = int(series(h.d, "modelcache_api_connections_refused_total", nil)); refused < heldConns-limit {
			return int64(refused), fmt.Errorf("modelcache_api_connections_refused_total = %d", refused)
		}
		return int64(refused), nil
	})
	t.Logf("uid %d opened and held %d connections (%d processes, hard RLIMIT_NOFILE %d) in %s; the daemon (%d descriptors) kept %d, refused %d; root's status answered in %s",
		nobody, held, procs, lim.Max, opened.Round(time.Millisecond), lim.Cur, pl.held(nobody), refused, lat.Round(time.Microsecond))

	// The user goes: every slot is given back.
	for _, p := range peers {
		p.stdin.Close()
		p.cmd.Wait()
		p.exited = true
	}
	testenv.Eventually(t, fmt.Sprintf("uid %d gives its slots back once it exited", nobody), 30*time.Second, func() error {
		if n := pl.held(nobody); n != 0 {
			return fmt.Errorf("still holds %d", n)
		}
		return nil
	})
}

// TestHelperHoldConnections is not a test of its own: TestSocketPeerConnectionLimit
// runs this binary as uid 65534 to play a local user that opens
// $MODELCACHE_HOLD_CONNS connections to $MODELCACHE_HOLD_SOCKET, sends a
// request on each without reading the answer, prints "held N uid U" and
// holds them until its stdin closes.
func TestHelperHoldConnections(t *testing.T) {
	sock := os.Getenv("MODELCACHE_HOLD_SOCKET")
	if sock == "" {
		t.Skip("the peer process of TestSocketPeerConnectionLimit")
	}
	n, _ := strconv.Atoi(os.Getenv("MODELCACHE_HOLD_CONNS"))
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	lim.Cur = lim.Max
	syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	req := []byte("GET /v1/health HTTP/1.1\r\nHost: modelcached\r\n\r\n")
	conns := make([]net.Conn, 0, n)
	var failing time.Time
	var lastErr error
	retries := 0
	for len(conns) < n {
		c, err := net.Dial("unix", sock)
		if err != nil {
			// EAGAIN: the listen backlog is full (the daemon is behind, or
			// accepts nothing any more); retry, and give up after a minute
			// of that (a loaded machine may keep the daemon behind for
			// seconds; one that accepts nothing for a minute is stuck).
			lastErr = err
			retries++
			if failing.IsZero() {
				failing = time.Now()
			} else if time.Since(failing) > time.Minute {
				break
			}
			time.Sleep(time.Millisecond)
			continue
		}
		failing = time.Time{}
		c.Write(req) // fails where the daemon closed it already: over the limit
		conns = append(conns, c)
	}
	fmt.Printf("held %d uid %d (dials retried: %d, last error: %v)\n", len(conns), os.Getuid(), retries, lastErr)
	io.Copy(io.Discard, os.Stdin)
}

// copyExecutable copies this test binary to dst, mode 0755.
func copyExecutable(dst string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	in, err := os.Open(self)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// rawRequest sends req on a new connection and returns the connection,
// its reader and the response (headers read, body not).
func rawRequest(t *testing.T, sock, req string) (net.Conn, *bufio.Reader, *http.Response) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c, br, resp
}

// waitClosed reads c until the daemon closes it, failing after 30s.
func waitClosed(t *testing.T, c net.Conn, br io.Reader, what string) time.Duration {
	t.Helper()
	t0 := time.Now()
	c.SetReadDeadline(t0.Add(30 * time.Second))
	if _, err := io.Copy(io.Discard, br); err != nil {
		t.Fatalf("%s: %v, want the daemon to close the connection", what, err)
	}
	return time.Since(t0)
}

// TestSocketIdleAndSlowConnectionsClosed: a connection idle after its
// request, one that never finishes its headers and one that never
// finishes its body are each closed after their timeout.
func TestSocketIdleAndSlowConnectionsClosed(t *testing.T) {
	cfg := testConfig(t)
	cfg.SocketIdleTimeout = 200 * time.Millisecond
	cfg.SocketReadTimeout = 200 * time.Millisecond
	h := start(t, cfg)

	c, br, resp := rawRequest(t, cfg.Socket, "GET /v1/health HTTP/1.1\r\nHost: modelcached\r\n\r\n")
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("health: %s", resp.Status)
	}
	t.Logf("idle connection closed after %s", waitClosed(t, c, br, "an idle connection after one request").Round(time.Millisecond))

	for _, tc := range []struct{ name, req string }{
		{"headers", "GET /v1/status HTTP/1.1\r\nHost: model"},
		{"body", "POST /v1/verify HTTP/1.1\r\nHost: modelcached\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"names\":"},
	} {
		c, err := net.Dial("unix", cfg.Socket)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, tc.req)
		t.Logf("a connection that stops in its %s closed after %s", tc.name, waitClosed(t, c, c, "a request that stops in its "+tc.name).Round(time.Millisecond))
	}
	if n := series(h.d, "modelcache_api_connections_refused_total", nil); n != 0 {
		t.Fatalf("root's connections were refused: %v", n)
	}
}

// TestSocketStreamOutlivesTimeoutsEndsWithClient: a /wait stream of a
// pending artifact and a pull?wait=true stream of a download that makes
// no progress keep receiving lines for many times every socket timeout,
// and end (the handler returns) once the client closes the connection.
func TestSocketStreamOutlivesTimeoutsEndsWithClient(t *testing.T) {
	gate := make(chan struct{})
	w := data(1<<20, 7)
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	srv.hook = func(rw http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodGet {
			<-gate // the download stalls until the test ends
		}
		return false
	}
	cfg := testConfig(t)
	cfg.SocketIdleTimeout, cfg.SocketReadTimeout, cfg.SocketWriteTimeout = 300*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond
	cfg.IdleTimeout = 10 * time.Minute // the stalled download is not retried while the test runs
	h := start(t, cfg)
	t.Cleanup(func() { close(gate) })

	body := fmt.Sprintf(`{"name":"p","uri":%q}`, srv.URL+"/w.bin#sha256="+sha(w))
	for _, tc := range []struct {
		route, req string
		phases     []api.Phase
	}{
		{"GET /v1/artifacts/{name}/wait", "GET /v1/artifacts/never/wait HTTP/1.1\r\nHost: modelcached\r\n\r\n", []api.Phase{api.PhasePending}},
		{"POST /v1/pull", fmt.Sprintf("POST /v1/pull?wait=true HTTP/1.1\r\nHost: modelcached\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body),
			[]api.Phase{api.PhasePending, api.PhaseDownloading}},
	} {
		c, _, resp := rawRequest(t, cfg.Socket, tc.req)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s", tc.route, resp.Status)
		}
		sc := bufio.NewScanner(resp.Body)
		t0 := time.Now()
		// At least 4 lines over at least 5 times every socket timeout.
		i := 0
		for ; i < 4 || time.Since(t0) < 1500*time.Millisecond; i++ {
			c.SetReadDeadline(time.Now().Add(30 * time.Second))
			if !sc.Scan() {
				t.Fatalf("%s: line %d: %v (stream ended after %s)", tc.route, i, sc.Err(), time.Since(t0))
			}
			var ev api.Event
			if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || ev.Error != nil || ev.Done || ev.Artifact == nil {
				t.Fatalf("%s: line %d: %s (%v)", tc.route, i, sc.Bytes(), err)
			}
			if !hasPhase(tc.phases, ev.Artifact.Phase) {
				t.Fatalf("%s: line %d: phase %s, want one of %v", tc.route, i, ev.Artifact.Phase, tc.phases)
			}
		}
		t.Logf("%s: %d lines in %s with every socket timeout at 300ms", tc.route, i, time.Since(t0).Round(time.Millisecond))
		c.Close()
		ended := map[string]string{"route": tc.route, "code": "200"}
		testenv.Eventually(t, tc.route+": the stream ends once its client closed the connection", 30*time.Second, func() error {
			if n := series(h.d, "modelcache_api_requests_total", ended); n != 1 {
				return fmt.Errorf("%v requests ended", n)
			}
			return nil
		})
	}
}

// series is the value of the counter or gauge name{labels} on the
// daemon's registry; -1 when there is no such series.
func series(d *Daemon, name string, labels map[string]string) float64 {
	mfs, _ := d.metrics.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

func hasPhase(ps []api.Phase, p api.Phase) bool {
	for _, x := range ps {
		if x == p {
			return true
		}
	}
	return false
}

// countHandler counts the log records whose message contains sub.
type countHandler struct {
	sub string
	n   *atomic.Int64
	at  *stamps // when each counted record was logged; nil: not kept
}

// stamps is a list of times, safe for concurrent use.
type stamps struct {
	mu sync.Mutex
	at []time.Time
}

func (s *stamps) times() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.at)
}

func (h countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.sub) {
		h.n.Add(1)
		if h.at != nil {
			h.at.mu.Lock()
			h.at.at = append(h.at.at, r.Time)
			h.at.mu.Unlock()
		}
	}
	return nil
}
func (h countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h countHandler) WithGroup(string) slog.Handler      { return h }

// TestSocketAcceptEMFILE runs the daemon out of descriptors for real
// (RLIMIT_NOFILE lowered to the lowest free descriptor, any descriptor
// freed later taken at once) while a client waits in the listen backlog:
// accept fails with EMFILE, the server backs off between retries (a
// handful of errors, not a spin) and keeps running, and once descriptors
// are back the waiting client is served. It runs in a fresh process of
// its own, where no other test's leftovers free descriptors meanwhile.
func TestSocketAcceptEMFILE(t *testing.T) {
	if os.Getenv("MODELCACHE_EMFILE_CHILD") == "" {
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(self, "-test.run=^TestSocketAcceptEMFILE$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "MODELCACHE_EMFILE_CHILD=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if _, msg, ok := strings.Cut(l, "socket_test.go:"); ok {
				if _, msg, ok = strings.Cut(msg, ": "); ok {
					t.Log("child: " + msg)
				}
			}
		}
		return
	}
	var acceptErrs atomic.Int64
	var acceptAt stamps
	cfg := testConfig(t)
	cfg.Logger = slog.New(countHandler{sub: "Accept error", n: &acceptErrs, at: &acceptAt})
	cfg.CapacityInterval = time.Hour // no scan opens and closes files meanwhile
	// The harness's health checks leave a keep-alive connection: closed
	// by the idle timeout under the test, it would free a descriptor for
	// the accept that must fail (seen under load).
	cfg.SocketIdleTimeout = time.Hour
	h := start(t, cfg)

	// Several clients wait in the backlog: a descriptor the daemon itself
	// frees meanwhile (seen on a cold, loaded CI machine: 1 error in 30 s)
	// lets one accept succeed, and the next client meets EMFILE again.
	// The first is the one checked for service once descriptors are back.
	clients := make([]int, 8)
	for i := range clients {
		c, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		clients[i] = c
	}
	fd := clients[0]
	for _, c := range clients[1:] {
		defer unix.Close(c)
	}
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	var fill []*os.File // descriptors freed meanwhile, taken so the daemon cannot
	takeFree := func() {
		for {
			f, err := os.Open(os.DevNull)
			if err != nil {
				return
			}
			fill = append(fill, f)
		}
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			for _, f := range fill {
				f.Close()
			}
			if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
				t.Fatalf("restore RLIMIT_NOFILE: %v", err)
			}
		}
	}
	t.Cleanup(restore)
	probe, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	free := probe.Fd() // the lowest free descriptor, once closed
	probe.Close()
	low := orig
	low.Cur = uint64(free)
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	takeFree()
	for _, c := range clients {
		if err := unix.Connect(c, &unix.SockaddrUnix{Name: cfg.Socket}); err != nil {
			restore()
			t.Fatalf("connect: %v", err)
		}
	}
	// Descriptors the daemon frees are taken at once, so the loop paces
	// itself at a millisecond rather than Eventually's backoff.
	const errs = 7
	deadline := time.Now().Add(30 * time.Second)
	for acceptErrs.Load() < errs && time.Now().Before(deadline) {
		takeFree()
		time.Sleep(time.Millisecond)
	}
	n := acceptErrs.Load()
	restore()
	select {
	case err := <-h.done:
		h.cancel = nil
		t.Fatalf("Run returned while out of descriptors: %v", err)
	default:
	}
	// Not a spin: a pause of at least http.Server's first (5 ms) between
	// errors, and pauses that grow (an accept that succeeds meanwhile
	// starts them again at 5 ms).
	at := acceptAt.times()
	if n < errs || len(at) < errs {
		t.Fatalf("%d accept errors while out of descriptors in 30 s; want %d, each after a growing pause", n, errs)
	}
	gaps := make([]time.Duration, errs-1)
	for i := range gaps {
		gaps[i] = at[i+1].Sub(at[i])
	}
	if slices.Min(gaps) < 4*time.Millisecond || slices.Max(gaps) < 2*slices.Min(gaps) {
		t.Fatalf("pauses between accept errors %v; want each 5 ms or more, growing", gaps)
	}
	f := os.NewFile(uintptr(fd), "client")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET /v1/health HTTP/1.1\r\nHost: modelcached\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("the client that waited in the backlog: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("health after EMFILE: %s", resp.Status)
	}
	t.Logf("%d accept errors (EMFILE) while out of descriptors; the server kept running and served the waiting client once they were back", n)
}

// TestSocketConfig: the per-uid limit defaults to 64 (0: no limit; the
// config file sets it as any flag: cmd/modelcached), and Validate refuses
// a negative limit and non-positive timeouts.
func TestSocketConfig(t *testing.T) {
	cfg := DefaultConfig()
	if cfg.MaxConnectionsPerUID != 64 {
		t.Fatalf("default limit %d, want 64", cfg.MaxConnectionsPerUID)
	}
	cfg.MaxConnectionsPerUID, cfg.SocketIdleTimeout, cfg.SocketWriteTimeout = -1, 0, -time.Second
	err := cfg.Validate()
	for _, want := range []string{"--max-connections-per-uid -1", "--socket-idle-timeout 0s", "--socket-write-timeout -1s"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %v, want it to name %q", err, want)
		}
	}
	cfg = DefaultConfig()
	cfg.MaxConnectionsPerUID = 0
	if err := cfg.Validate(); err != nil {
		t.Fatalf("no limit (0): %v", err)
	}
}

// TestWriteBufferConfig: --write-buffer-size defaults to the store's
// default, and Validate refuses a size the store would refuse, naming the
// flag and the rule.
func TestWriteBufferConfig(t *testing.T) {
	cfg := DefaultConfig()
	if cfg.WriteBufferSize != cachestore.DefaultWriteBuffer {
		t.Fatalf("default %d, want %d", cfg.WriteBufferSize, cachestore.DefaultWriteBuffer)
	}
	cfg.WriteBufferSize = 1000
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--write-buffer-size") || !strings.Contains(err.Error(), "multiple of 4 KiB") {
		t.Fatalf("Validate of a 1000-byte buffer: %v", err)
	}
}
