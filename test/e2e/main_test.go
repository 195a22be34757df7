// Package e2e runs the real binaries: modelcached as a subprocess on a
// temp root and socket, driven by modelctl, killed with SIGKILL at chosen
// points of the commit protocols.
package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore/storetest"
	"github.com/modelcache/modelcache/internal/testenv"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "modelcache-e2e-bin-")
	if err != nil {
		panic(err)
	}
	os.Chmod(dir, 0o755)
	for c, pkg := range map[string]string{"modelcached": "cmd/modelcached", "modelctl": "cmd/modelctl", "mmapper": "test/e2e/mmapper"} {
		out, err := exec.Command("go", "build", "-o", filepath.Join(dir, c), "github.com/modelcache/modelcache/"+pkg).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", c, err, out)
			os.Exit(1)
		}
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// env is one daemon's world: a root, a socket, a models dir.
type env struct {
	t      *testing.T
	dir    string
	root   string
	socket string
	cmd    *exec.Cmd
	exited chan error
	log    *bytes.Buffer
	flags  []string // extra daemon flags
}

func newEnv(t *testing.T) *env {
	dir, err := os.MkdirTemp("", "mc-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o755) // other uids must reach the socket (peer test)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return &env{t: t, dir: dir, root: filepath.Join(dir, "root"), socket: filepath.Join(dir, "mc.sock")}
}

// start runs modelcached; extra env such as MODELCACHED_FAULTPOINT=….
func (e *env) start(extraEnv ...string) {
	e.t.Helper()
	e.log = &bytes.Buffer{}
	args := append([]string{
		"--root", e.root, "--socket", e.socket, "--metrics-addr", "127.0.0.1:0",
		"--models-dir", filepath.Join(e.dir, "models.d"), "--socket-group", "",
		"--retry-initial", "100ms", "--retry-max", "500ms", "--log-level", "debug"}, e.flags...)
	e.cmd = exec.Command(filepath.Join(binDir, "modelcached"), args...)
	e.cmd.Env = append(os.Environ(), extraEnv...)
	e.cmd.Stdout, e.cmd.Stderr = e.log, e.log
	if err := e.cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.exited = make(chan error, 1)
	go func(c *exec.Cmd, ch chan error) { ch <- c.Wait() }(e.cmd, e.exited)
	c := &api.Client{Socket: e.socket}
	err := testenv.Poll(20*time.Second, func() error {
		select {
		case err := <-e.exited:
			e.t.Fatalf("modelcached exited at start: %v\n%s", err, e.log)
		default:
		}
		return c.Health(context.Background())
	})
	if err != nil {
		e.t.Fatalf("modelcached not healthy: %v\n%s", err, e.log)
	}
	e.t.Cleanup(e.stop)
}

// stop sends SIGTERM and waits: a clean shutdown must exit 0.
func (e *env) stop() {
	if e.cmd == nil {
		return
	}
	e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-e.exited:
		if err != nil {
			e.t.Errorf("modelcached after SIGTERM: %v\n%s", err, e.log)
		}
	case <-time.After(20 * time.Second):
		e.cmd.Process.Kill()
		e.t.Errorf("modelcached ignored SIGTERM for 20s\n%s", e.log)
	}
	e.cmd = nil
}

// waitKilled waits for the daemon to die by SIGKILL (its fault point).
func (e *env) waitKilled(timeout time.Duration) bool {
	select {
	case <-e.exited:
		e.cmd = nil
		return true
	case <-time.After(timeout):
		return false
	}
}

func (e *env) kill() {
	e.cmd.Process.Kill()
	<-e.exited
	e.cmd = nil
}

type result struct {
	stdout, stderr string
	code           int
}

// ctl runs modelctl against this env's socket; prefix (e.g. setpriv …)
// runs it as someone else.
func (e *env) ctl(prefix []string, args ...string) result {
	e.t.Helper()
	argv := append(append([]string{}, prefix...), filepath.Join(binDir, "modelctl"), "--socket", e.socket)
	argv = append(argv, args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		e.t.Fatalf("modelctl %v: %v", args, err)
	}
	return result{so.String(), se.String(), code}
}

func (e *env) mustCtl(args ...string) string {
	e.t.Helper()
	r := e.ctl(nil, args...)
	if r.code != 0 {
		e.t.Fatalf("modelctl %s: exit %d\nstdout: %s\nstderr: %s\ndaemon log:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr, e.log)
	}
	return r.stdout
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func data(n int, seed byte) []byte { return storetest.Data(n, seed) }

// server serves files, counts bytes sent, records Range headers, and can
// be throttled so that kills land in the middle of a body.
type server struct {
	*httptest.Server
	files    map[string][]byte
	sent     atomic.Int64
	mu       sync.Mutex
	ranges   []string
	throttle atomic.Int64 // bytes per 10ms; 0 = full speed
}

func newServer(t *testing.T, files map[string][]byte) *server {
	s := &server{files: files}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, ok := s.files[strings.TrimPrefix(r.URL.Path, "/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		if r.Method == http.MethodGet {
			s.mu.Lock()
			s.ranges = append(s.ranges, r.Header.Get("Range"))
			s.mu.Unlock()
		}
		http.ServeContent(&slowWriter{w, s}, r, "", time.Time{}, bytes.NewReader(b))
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *server) lastRange() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ranges) == 0 {
		return ""
	}
	return s.ranges[len(s.ranges)-1]
}

type slowWriter struct {
	http.ResponseWriter
	s *server
}

func (w *slowWriter) Write(b []byte) (int, error) {
	total := 0
	for len(b) > 0 {
		chunk := len(b)
		if lim := int(w.s.throttle.Load()); lim > 0 {
			chunk = min(chunk, lim)
			time.Sleep(time.Duration(chunk) * 10 * time.Millisecond / time.Duration(lim))
		}
		n, err := w.ResponseWriter.Write(b[:chunk])
		w.s.sent.Add(int64(n))
		total += n
		if err != nil {
			return total, err
		}
		b = b[chunk:]
	}
	return total, nil
}

func parseRangeStart(h string) int64 {
	s := strings.TrimSuffix(strings.TrimPrefix(h, "bytes="), "-")
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// startFail runs modelcached expecting it to exit non-zero; it returns
// what it printed.
func (e *env) startFail(args ...string) string {
	e.t.Helper()
	argv := append([]string{"--root", e.root, "--socket", e.socket, "--metrics-addr", "", "--models-dir", "", "--socket-group", ""}, args...)
	cmd := exec.Command(filepath.Join(binDir, "modelcached"), argv...)
	out, err := cmd.CombinedOutput()
	if err == nil {
		e.t.Fatalf("modelcached %v succeeded; want a failure\n%s", argv, out)
	}
	return string(out)
}
