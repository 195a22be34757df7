package e2e

import (
	"bufio"
	"bytes"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// bg is a modelctl running in the background whose stderr is read line
// by line as it comes.
type bg struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer
	mu     sync.Mutex
	stderr strings.Builder
	lines  chan string
	done   chan struct{}
	code   int
}

func (e *env) bgCtl(args ...string) *bg {
	e.t.Helper()
	b := &bg{lines: make(chan string, 1024), done: make(chan struct{})}
	b.cmd = exec.Command(filepath.Join(binDir, "modelctl"), append([]string{"--socket", e.socket}, args...)...)
	b.cmd.Stdout = &b.stdout
	pr, err := b.cmd.StderrPipe()
	if err != nil {
		e.t.Fatal(err)
	}
	if err := b.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			b.mu.Lock()
			b.stderr.WriteString(sc.Text() + "\n")
			b.mu.Unlock()
			select {
			case b.lines <- sc.Text():
			default:
			}
		}
		err := b.cmd.Wait()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			b.code = ee.ExitCode()
		} else if err != nil {
			b.code = -1
		}
		close(b.done)
	}()
	e.t.Cleanup(func() { b.cmd.Process.Kill(); <-b.done })
	return b
}

func (b *bg) err() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stderr.String()
}

// until reads stderr lines until one contains want.
func (b *bg) until(t *testing.T, want string) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		select {
		case l := <-b.lines:
			if strings.Contains(l, want) {
				return
			}
		case <-b.done:
			if strings.Contains(b.err(), want) {
				return
			}
			t.Fatalf("modelctl %v exited %d before printing %q:\n%s", b.cmd.Args[3:], b.code, want, b.err())
		case <-deadline:
			t.Fatalf("modelctl %v did not print %q in 60s:\n%s", b.cmd.Args[3:], want, b.err())
		}
	}
}

// exit waits for the command to end and returns its exit code.
func (b *bg) exit(t *testing.T) int {
	t.Helper()
	select {
	case <-b.done:
		return b.code
	case <-time.After(90 * time.Second):
		t.Fatalf("modelctl %v still runs after 90s:\n%s", b.cmd.Args[3:], b.err())
		return -1
	}
}

// TestWaitAndPullRideOutRestart: a daemon killed in the middle of a pull
// and started again does not fail the pull nor a wait on it (an init
// container during a DaemonSet rollout, a `set -e` script): both say
// what happened and end Ready. A wait that starts before the daemon is
// up waits for it; one whose timeout passes while the daemon is away
// fails and says so.
func TestWaitAndPullRideOutRestart(t *testing.T) {
	e := newEnv(t)
	e.start()
	w := data(4<<20, 9)
	srv := newServer(t, map[string][]byte{"w.bin": w})
	srv.throttle.Store(8 << 10) // ~0.8 MB/s: the pull runs for seconds
	pull := e.bgCtl("pull", srv.URL+"/w.bin#sha256="+sha(w), "--name", "big")
	pull.until(t, "%")
	wait := e.bgCtl("wait", "big", "--timeout", "120")
	wait.until(t, "Downloading")

	e.kill()
	pull.until(t, "modelcached restarted or stopped")
	wait.until(t, "modelcached restarted or stopped")
	srv.throttle.Store(0)
	e.start()
	for name, b := range map[string]*bg{"pull": pull, "wait": wait} {
		if code := b.exit(t); code != 0 || !strings.Contains(b.stdout.String(), "big: Ready") {
			t.Fatalf("%s across a restart: exit %d, stdout %q\n%s\ndaemon log:\n%s", name, code, b.stdout.String(), b.err(), e.log)
		}
		if s := b.err(); !strings.Contains(s, "modelcached is back") || strings.Contains(s, "Is modelcached running") {
			t.Fatalf("%s did not say the daemon came back:\n%s", name, s)
		}
	}
	t.Logf("wait across the restart said:\n%s", wait.err())
	if got := e.list()["big"]; got.Phase != "Ready" {
		t.Fatalf("big after the restart: %+v", got)
	}

	// A wait that starts before the daemon is up (a node booting) waits for it.
	e.stop()
	early := e.bgCtl("wait", "big", "--timeout", "120")
	early.until(t, "cannot reach modelcached")
	e.start()
	if code := early.exit(t); code != 0 || !strings.Contains(early.stdout.String(), "big: Ready") {
		t.Fatalf("wait before the daemon was up: exit %d, stdout %q\n%s", code, early.stdout.String(), early.err())
	}

	// The timeout still holds while the daemon is away.
	e.stop()
	r := e.ctl(nil, "wait", "big", "--timeout", "2s")
	if r.code != 1 || !strings.Contains(r.stderr, "did not answer within --timeout 2s") {
		t.Fatalf("wait with the daemon away past its timeout: exit %d\n%s", r.code, r.stderr)
	}
}

// TestCredentialsAreTheDaemons: HF_TOKEN in modelctl's environment does
// not reach the daemon; modelctl warns so before the pull, and the
// daemon's refusal says where the daemon reads its token.
func TestCredentialsAreTheDaemons(t *testing.T) {
	hub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Error-Code", "GatedRepo")
		http.Error(w, "gated", http.StatusUnauthorized)
	}))
	t.Cleanup(hub.Close)
	e := newEnv(t)
	e.start("HF_ENDPOINT="+hub.URL, "HF_TOKEN=", "HF_HOME="+e.dir)
	cmd := exec.Command(filepath.Join(binDir, "modelctl"), "--socket", e.socket, "pull", "hf://acme/gated", "--name", "gated")
	cmd.Env = append(os.Environ(), "HF_TOKEN=hf_users_own_token")
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("pull of a gated repo: %v\n%s", err, out)
	}
	for _, want := range []string{
		"warning: HF_TOKEN is set in your environment, but modelcached does not see it",
		"modelcached has no Hugging Face token: the daemon reads HF_TOKEN from its own environment, not modelctl's",
	} {
		if !strings.Contains(string(out), want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), "hf_users_own_token") {
		t.Fatalf("the user's token was printed:\n%s", out)
	}
}
