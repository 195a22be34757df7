// Package testenv is what the tests and the benchmark share about their
// environment: finding the real tools they drive (on PATH or where
// `go install` puts them), failing under CI=true and skipping elsewhere
// when one is missing, loopback ports for the servers they start, and
// the one way a test waits for a condition: Eventually polls it, Await
// checks it at each change a component signals. DropPageCache makes a
// tree's reads cold again.
package testenv

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// DropPageCache writes back and drops from the page cache every regular
// file under dir (fsync, then FADV_DONTNEED: dirty pages are not
// dropped), so the next read of them comes from the disk. tmpfs and
// ramfs keep their pages whatever it does: check with mincore.
func DropPageCache(dir string) error {
	return filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := f.Sync(); err != nil {
			return err
		}
		return unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	})
}

// Tool finds name on PATH, then in $(go env GOPATH)/bin.
func Tool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	out, err := exec.Command("go", "env", "GOPATH").Output()
	if err != nil {
		return "", err
	}
	p := filepath.Join(strings.TrimSpace(string(out)), "bin", name)
	if _, err := os.Stat(p); err != nil {
		return "", errors.New(name + " not found on PATH or in GOPATH/bin")
	}
	return p, nil
}

// DiskBase is prefer if it is not empty, which must then be on a
// disk-backed filesystem, else the first of TMPDIR and /var/tmp that is:
// tmpfs and ramfs keep their pages in memory (a page cache that cannot be
// dropped) and refuse O_DIRECT.
func DiskBase(prefer string) (string, error) {
	onDisk := func(dir string) bool {
		var st unix.Statfs_t
		return unix.Statfs(dir, &st) == nil && st.Type != unix.TMPFS_MAGIC && st.Type != unix.RAMFS_MAGIC
	}
	if prefer != "" {
		if !onDisk(prefer) {
			return "", fmt.Errorf("%s is not a directory on a disk-backed filesystem (tmpfs and ramfs keep their pages); name one that is", prefer)
		}
		return prefer, nil
	}
	for _, base := range []string{os.TempDir(), "/var/tmp"} {
		if onDisk(base) {
			return base, nil
		}
	}
	return "", fmt.Errorf("neither %s nor /var/tmp is on a disk-backed filesystem; set TMPDIR to one", os.TempDir())
}

// DiskDir is a new directory on a disk-backed filesystem (DiskBase),
// removed when the test ends; without one the test stops as Missing.
func DiskDir(t testing.TB) string {
	t.Helper()
	base, err := DiskBase("")
	if err != nil {
		Missing(t, "a directory on a disk-backed filesystem ("+err.Error()+")", "set TMPDIR to a directory on a disk filesystem")
	}
	d, err := os.MkdirTemp(base, "modelcache-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// Missing stops the test for a missing prerequisite: a failure under
// CI=true (CI must install it), a skip elsewhere. how says how to get it.
func Missing(t testing.TB, what, how string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is missing; .ci/run must install it (%s)", what, how)
	}
	t.Skipf("%s is missing (%s)", what, how)
}

// Require returns the path of tool, or stops the test as Missing does.
func Require(t testing.TB, tool, how string) string {
	t.Helper()
	p, err := Tool(tool)
	if err != nil {
		Missing(t, tool, how)
	}
	return p
}

// FreeAddr returns a 127.0.0.1:port nothing listens on right now.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Eventually calls f until it returns nil and fails the test with what
// and f's last error if it has not by timeout. The pause between calls
// starts at 5ms and doubles up to 250ms, so a quick condition is seen
// at once and a slow one is not polled hard. f runs on the test's
// goroutine; Eventually must be called from it too (it uses t.Fatalf).
func Eventually(t testing.TB, what string, timeout time.Duration, f func() error) {
	t.Helper()
	if err := Poll(timeout, f); err != nil {
		t.Fatalf("%s: not within %v: %v", what, timeout, err)
	}
}

// EventuallyProgressing is Eventually for a condition that a slow machine
// reaches late but surely, as long as it moves: f returns a count that
// grows on the way (connections accepted, bytes written) and nil once the
// condition holds. It fails the test only when the count has not grown
// for stall, whatever the time since the start, so a loaded machine
// passes and a stuck one fails at the first stall.
func EventuallyProgressing(t testing.TB, what string, stall time.Duration, f func() (int64, error)) {
	t.Helper()
	if err := pollProgressing(stall, f); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func pollProgressing(stall time.Duration, f func() (int64, error)) error {
	best, since := int64(-1), time.Now()
	pause := 5 * time.Millisecond
	for {
		n, err := f()
		if err == nil {
			return nil
		}
		if n > best {
			best, since = n, time.Now()
		} else if time.Since(since) > stall {
			return fmt.Errorf("no progress for %v (at %d): %w", stall, best, err)
		}
		time.Sleep(pause)
		pause = min(2*pause, 250*time.Millisecond)
	}
}

// Poll is Eventually for callers without a testing.TB (the benchmark, a
// helper that reports its own failure): it returns nil once f does, or
// f's last error at timeout.
func Poll(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	pause := 5 * time.Millisecond
	for {
		err := f()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(pause)
		pause = min(2*pause, 250*time.Millisecond)
	}
}

// Await is Eventually driven by a change signal instead of a timer:
// changed returns a channel that is closed at the next change (the
// daemon's Changed), and cond is checked at once and after each close,
// never in between. Await fails the test with what and cond's last error
// if it does not hold by timeout. A state change that does not close the
// channel is a bug Await shows as a timeout.
func Await(t testing.TB, what string, timeout time.Duration, changed func() <-chan struct{}, cond func() error) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		ch := changed() // before cond: a change while cond runs is not missed
		err := cond()
		if err == nil {
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
	}
}

// WaitTCP waits until addr accepts connections.
func WaitTCP(addr string, timeout time.Duration) error {
	err := Poll(timeout, func() error {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err
	})
	if err != nil {
		return errors.New(addr + " did not accept connections within " + timeout.String() + ": " + err.Error())
	}
	return nil
}

// Tmpfs mounts a tmpfs of size (e.g. "40m") on a temp dir for the test
// and unmounts it afterwards: a small real filesystem for disk-full and
// eviction tests. It needs root, which CI has.
func Tmpfs(t testing.TB, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "root (to mount a tmpfs)", "run the tests as root, as CI does")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		Missing(t, "a mountable tmpfs", err.Error()+": "+strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

// StartRegistry starts Debian's docker-registry (distribution 2.8) on a
// loopback port with its storage under dir and returns its host:port and
// a stop function.
func StartRegistry(bin, dir string) (string, func(), error) {
	host, err := FreeAddr()
	if err != nil {
		return "", nil, err
	}
	cfg := filepath.Join(dir, "registry.yml")
	body := "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: " + filepath.Join(dir, "registry-data") + "\n  delete:\n    enabled: true\nhttp:\n  addr: " + host + "\n"
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		return "", nil, err
	}
	cmd := exec.Command(bin, "serve", cfg)
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() { cmd.Process.Kill(); cmd.Wait(); os.RemoveAll(filepath.Join(dir, "registry-data")) }
	if err := WaitTCP(host, 10*time.Second); err != nil {
		stop()
		return "", nil, errors.New("docker-registry: " + err.Error())
	}
	return host, stop, nil
}

// Registry starts a docker-registry for the test (Missing when the
// package is not installed) and stops it at cleanup.
func Registry(t testing.TB) string {
	t.Helper()
	bin := Require(t, "docker-registry", "apt-get install --no-install-recommends docker-registry")
	host, stop, err := StartRegistry(bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return host
}

// ServeOn starts h on ip:0 (a loopback address other than 127.0.0.1 stands
// for a remote host in the redirect tests); it skips where ip cannot be
// bound, which is a property of the machine, not a missing tool.
func ServeOn(t testing.TB, ip string, h http.Handler) *httptest.Server {
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

// Origin is a test server that records the credentials of every
// request it answers: redirect tests hold the origins of a redirect to
// it. An Origin is also the recording http.Handler.
type Origin struct {
	*httptest.Server
	h    http.Handler
	mu   sync.Mutex
	seen []string
}

// NewOrigin returns an Origin that answers with h (nil: 200 "ok") and
// has no server yet: the caller starts one with it as the handler
// (httptest.NewTLSServer(o)) and sets Server.
func NewOrigin(h http.Handler) *Origin { return &Origin{h: h} }

// ServeOrigin serves an Origin answering with h on ip (ServeOn).
func ServeOrigin(t testing.TB, ip string, h http.Handler) *Origin {
	t.Helper()
	o := NewOrigin(h)
	o.Server = ServeOn(t, ip, o)
	return o
}

// ServeHTTP records the request's path, every header it carried (a
// credential may ride in any: Authorization, Cookie, a Referer naming the
// previous URL with its query) and the query, as "path", "path
// Header=value" and "path ?query" lines, then answers.
func (o *Origin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	o.mu.Lock()
	o.seen = append(o.seen, r.URL.Path)
	keys := make([]string, 0, len(r.Header))
	for k := range r.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		for _, v := range r.Header[k] {
			o.seen = append(o.seen, r.URL.Path+" "+k+"="+v)
		}
	}
	if r.URL.RawQuery != "" {
		o.seen = append(o.seen, r.URL.Path+" ?"+r.URL.RawQuery)
	}
	o.mu.Unlock()
	if o.h == nil {
		io.WriteString(w, "ok")
		return
	}
	o.h.ServeHTTP(w, r)
}

// Seen returns what the origin recorded, in order.
func (o *Origin) Seen() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]string(nil), o.seen...)
}

// Saw reports whether any recorded line contains s.
func (o *Origin) Saw(s string) bool {
	for _, l := range o.Seen() {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}
