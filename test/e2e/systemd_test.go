package e2e

import (
	"bytes"
	"github.com/modelcache/modelcache/internal/testenv"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
)

// TestSystemdNotify runs the daemon with NOTIFY_SOCKET and WATCHDOG_USEC as
// systemd would: READY=1 once the socket serves, watchdog pings while
// healthy, STOPPING=1 on SIGTERM.
func TestSystemdNotify(t *testing.T) {
	e := newEnv(t)
	ns := filepath.Join(e.dir, "notify.sock")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: ns, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	msgs := make(chan string, 64)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, _, err := conn.ReadFromUnix(buf)
			if err != nil {
				close(msgs)
				return
			}
			msgs <- string(buf[:n])
		}
	}()
	e.start("NOTIFY_SOCKET="+ns, "WATCHDOG_USEC=200000", "WATCHDOG_PID=")
	next := func(want string) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case m := <-msgs:
				if strings.Contains(m, want) {
					return
				}
			case <-deadline:
				t.Fatalf("no %s from the daemon\n%s", want, e.log)
			}
		}
	}
	next("READY=1")
	// READY came after the socket served: a request now must succeed.
	if err := (&api.Client{Socket: e.socket}).Health(t.Context()); err != nil {
		t.Fatalf("READY=1 but the socket does not serve: %v", err)
	}
	next("WATCHDOG=1")
	next("WATCHDOG=1")
	e.cmd.Process.Signal(syscall.SIGTERM)
	next("STOPPING=1")
	if err := <-e.exited; err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	e.cmd = nil
	if _, err := os.Stat(e.socket); err == nil {
		t.Fatal("the socket was left behind after a clean stop")
	}
}

// TestStaleSocketAndSecondDaemon: a socket left by a killed daemon is
// replaced; a second daemon on a live socket or a locked root is refused
// with a message that says why.
func TestStaleSocketAndSecondDaemon(t *testing.T) {
	e := newEnv(t)
	e.start()
	e.kill() // leaves the socket file behind
	if _, err := os.Stat(e.socket); err != nil {
		t.Fatalf("expected a stale socket after SIGKILL: %v", err)
	}
	e.start() // must take the stale socket over
	e2 := &env{t: t, dir: e.dir, root: filepath.Join(e.dir, "root2"), socket: e.socket}
	out := e2.startFail()
	if !strings.Contains(out, "another modelcached is serving there") {
		t.Fatalf("second daemon on a live socket: %s", out)
	}
	e3 := &env{t: t, dir: e.dir, root: e.root, socket: filepath.Join(e.dir, "other.sock")}
	if out := e3.startFail(); !strings.Contains(out, "locked by another process") {
		t.Fatalf("second daemon on a locked root: %s", out)
	}
}

// TestSocketActivation: started by systemd-socket-activate (as by
// modelcached.socket), the daemon serves on the passed socket; asked for
// activation without one, it says so and exits.
func TestSocketActivation(t *testing.T) {
	sa := testenv.Require(t, "systemd-socket-activate", "apt-get install systemd")
	e := newEnv(t)
	cmd := exec.Command(sa, "-l", e.socket, filepath.Join(binDir, "modelcached"), "--systemd-socket",
		"--root", e.root, "--socket", filepath.Join(e.dir, "ignored.sock"), "--metrics-addr", "", "--models-dir", "", "--socket-group", "")
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() }()
	// systemd-socket-activate starts the daemon on the first connection.
	var st *api.Status
	err := testenv.Poll(5*time.Second, func() (err error) {
		st, err = (&api.Client{Socket: e.socket}).Status(t.Context())
		return err
	})
	if err != nil || st.Socket != e.socket {
		t.Fatalf("status over the activated socket: %+v %v\n%s", st, err, log.String())
	}
	if _, err := os.Stat(filepath.Join(e.dir, "ignored.sock")); err == nil {
		t.Fatal("the daemon listened on --socket despite being passed one")
	}
	out := e.startFail("--systemd-socket")
	if !strings.Contains(out, "no socket from systemd") {
		t.Fatalf("--systemd-socket without LISTEN_FDS: %s", out)
	}
}
