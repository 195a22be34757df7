package e2e

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcache/modelcache/internal/testenv"
)

// modelcached with bad flags exits 2 and names each of them on a line of
// its own, then where to look; it does not print the whole help.
func TestDaemonUsageErrors(t *testing.T) {
	e := newEnv(t)
	out := e.startFail("--nope", "--quota", "5X", "--high-watermark", "ninety", "--min-age", "5", "--qouta=1G", "extra")
	for _, w := range []string{
		"modelcached: unknown flag --nope\n",
		`modelcached: --quota "5X": want bytes or a size with a unit`,
		`modelcached: --high-watermark "ninety": want a whole number`,
		`modelcached: --min-age "5": want a duration with its unit`,
		"modelcached: unknown flag --qouta (did you mean --quota?)",
		`modelcached: unexpected argument "extra"`,
		"Run 'modelcached --help' for usage.",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	if strings.Contains(out, "USAGE:") || strings.Contains(out, "OPTIONS:") {
		t.Errorf("a usage error printed the whole help:\n%s", out)
	}
	// Values that parse but that the daemon refuses: every one, each on a
	// line of its own, exit 2.
	out = e.startFail("--log-level", "bogus", "--log-format", "xml", "--socket-mode", "999", "--high-watermark", "200", "--file-identity", "abc")
	for _, w := range []string{
		`modelcached: --log-level "bogus"`, `modelcached: --log-format "xml"`, `modelcached: --socket-mode "999"`,
		"modelcached: capacity policy: watermarks 200/", `modelcached: --file-identity "abc"`, "Run 'modelcached --help' for usage.",
	} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
	cmd := exec.Command(filepath.Join(binDir, "modelcached"), "--high-watermark", "x")
	if err := cmd.Run(); err == nil || cmd.ProcessState.ExitCode() != 2 {
		t.Errorf("modelcached --high-watermark x: %v, want exit 2", err)
	}
}

// Ctrl-C during a pull detaches: exit 130, a line that says the pull goes
// on and how to follow or cancel it; the daemon finishes the pull.
func TestInterruptedPullDetaches(t *testing.T) {
	e := newEnv(t)
	e.start()
	srv := newServer(t, map[string][]byte{"w.bin": data(4<<20, 7)})
	srv.throttle.Store(16 << 10) // ~1.6 MB/s: the pull takes a few seconds
	cmd := exec.Command(filepath.Join(binDir, "modelctl"), "--socket", e.socket, "pull", srv.URL+"/w.bin", "--name", "slow")
	var stderr bytes.Buffer
	pr, pw, _ := os.Pipe()
	cmd.Stderr = pw
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	sc := bufio.NewScanner(pr)
	for sc.Scan() { // progress lines until the download runs
		stderr.WriteString(sc.Text() + "\n")
		if strings.Contains(sc.Text(), "Downloading") && strings.Contains(sc.Text(), "%") {
			break
		}
	}
	cmd.Process.Signal(syscall.SIGINT)
	for sc.Scan() {
		stderr.WriteString(sc.Text() + "\n")
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Fatalf("pull after SIGINT: %v, want exit 130\n%s", err, stderr.String())
	}
	if want := "detached; the pull continues — `modelctl wait slow` to follow, `modelctl evict slow` to cancel"; !strings.Contains(stderr.String(), want) {
		t.Fatalf("stderr lacks %q:\n%s", want, stderr.String())
	}
	if strings.Contains(stderr.String(), "cannot reach") {
		t.Fatalf("an interrupted pull blamed the daemon:\n%s", stderr.String())
	}
	srv.throttle.Store(0)
	if out := e.mustCtl("wait", "slow", "--timeout", "30"); !strings.Contains(out, "slow: Ready") {
		t.Fatalf("wait after detach: %q", out)
	}
}

// A socket this user may not open names its mode and group and the
// remedy; wait for a name nothing desires fails at once.
func TestSocketPermissionAndWaitUnknown(t *testing.T) {
	nobody := asNobody(t)
	e := newEnv(t)
	e.flags = []string{"--socket-mode", "0660"}
	e.start()
	r := e.ctl(nobody, "list")
	if r.code != 1 || !strings.Contains(r.stderr, "permission denied opening modelcached's socket "+e.socket) ||
		!strings.Contains(r.stderr, "mode 0660") || !strings.Contains(r.stderr, "--socket-mode 0666") {
		t.Fatalf("uid 65534 on a 0660 socket: exit %d\n%s", r.code, r.stderr)
	}
	if strings.Contains(r.stderr, "Is modelcached running") {
		t.Fatalf("a permission problem sent the user to start the daemon:\n%s", r.stderr)
	}
	start := time.Now()
	r = e.ctl(nil, "wait", "nosuch")
	if r.code != 1 || !strings.Contains(r.stderr, "nothing desires it") || time.Since(start) > 10*time.Second {
		t.Fatalf("wait nosuch: exit %d after %v\n%s", r.code, time.Since(start), r.stderr)
	}
	if r := e.ctl(nil, "wait", "nosuch", "--for-create", "--timeout", "0.3"); r.code != 1 || !strings.Contains(r.stderr, "still Pending") {
		t.Fatalf("wait nosuch --for-create: exit %d\n%s", r.code, r.stderr)
	}
}

// modelctl completion bash, sourced by a real bash, completes commands,
// flags, flag values and the daemon's artifact names.
func TestBashCompletion(t *testing.T) {
	bash := testenv.Require(t, "bash", "apt-get install bash")
	e := newEnv(t)
	e.start()
	src := filepath.Join(e.dir, "src")
	writeTree(t, src, map[string][]byte{"w.bin": []byte("weights")})
	e.mustCtl("pull", "file://"+src, "--name", "llama-8b")
	e.mustCtl("pull", "file://"+src, "--name", "llama-70b")
	ctl := filepath.Join(binDir, "modelctl")
	complete := func(line ...string) string {
		t.Helper()
		script := `source <("$CTL" completion bash)
COMP_WORDS=("$CTL" "$@"); COMP_CWORD=$#; COMP_LINE="${COMP_WORDS[*]}"
_modelctl; printf '%s\n' "${COMPREPLY[@]}"`
		cmd := exec.Command(bash, append([]string{"-c", script, "bash"}, line...)...)
		cmd.Env = append(os.Environ(), "CTL="+ctl, "MODELCACHE_SOCKET="+e.socket)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("bash completion of %q: %v\n%s", line, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	for _, tc := range []struct {
		line []string
		want string
	}{
		{[]string{"ev"}, "evict"},
		{[]string{"inspect", "llama-"}, "llama-70b\nllama-8b"},
		{[]string{"evict", "--fo"}, "--force"},
		{[]string{"-o", "ya"}, "yaml"},
		{[]string{"pull", "--kind", ""}, "kernelcache\nmodel"},
		{[]string{"completion", "f"}, "fish"},
	} {
		if got := complete(tc.line...); got != tc.want {
			t.Errorf("complete %q = %q, want %q", tc.line, got, tc.want)
		}
	}
}
