package modelcache_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/internal/testenv"
)

// TestTourReadme runs README.md's "Quick start" and "A five-minute tour"
// as a reader would, each in a fresh directory with bin/modelctl and
// bin/modelcached built from this tree and the daemon started by the
// Makefile's run recipe (its metrics on a free port): every line of a sh
// block runs with bash on an 80-column terminal and must exit 0; an
// output block that follows a sh block (prose may come between) is what
// that block's last command prints; a block of "$ " lines is commands and
// what they print, exiting as the prose before it says ("exits 2"); and
// "`bin/modelctl …` prints `…`" in the prose is checked the same way.
// Output is compared line by line, blanks collapsed, after tourVariable
// has replaced what differs from run to run.
func TestTourReadme(t *testing.T) {
	text, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	bins := t.TempDir()
	for _, name := range []string{"modelctl", "modelcached"} {
		if err := os.Rename(build(t, name), filepath.Join(bins, name)); err != nil {
			t.Fatal(err)
		}
	}
	recipe := makeRunRecipe(t)

	// The sources the Quick start pulls, served here: a local tree and an
	// HTTP origin on loopback.
	fixtures := shortTempDir(t)
	model := filepath.Join(fixtures, "a-model")
	if err := os.MkdirAll(model, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{"config.json": `{"model_type":"gpt2"}`, "model.safetensors": strings.Repeat("w", 1<<16)} {
		if err := os.WriteFile(filepath.Join(model, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	weights := bytes.Repeat([]byte("weights!"), 1<<14)
	sum := sha256.Sum256(weights)
	origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeContent(w, r, "w.safetensors", time.Time{}, bytes.NewReader(weights))
	}))
	t.Cleanup(origin.Close)

	// What a command line says that cannot mean the same here, and what it
	// means here instead. The same replacements apply to the samples.
	rewrite := strings.NewReplacer(
		"/tmp/tiny-model", filepath.Join(fixtures, "tiny-model"), // not the machine's shared /tmp
		"/path/to/a/model", model,
		"https://example.com/w.safetensors", origin.URL+"/w.safetensors",
		"<64 hex>", hex.EncodeToString(sum[:]),
	)
	// The lines that do not run here, each with why. A line named here
	// that the README no longer has fails the test.
	skip := map[string]string{
		"make run":  "the test starts the daemon with the Makefile's run recipe itself",
		"make test": "every test, this one included",
	}
	skipped := map[string]bool{}

	for _, section := range []string{"Quick start", "A five-minute tour"} {
		t.Run(strings.ReplaceAll(section, " ", "_"), func(t *testing.T) {
			steps := tourSteps(t, string(text), section)
			if len(steps) == 0 {
				t.Fatalf("README.md has no commands under %q", section)
			}
			for _, s := range steps {
				if c := strings.TrimSpace(stripComment(s.cmd)); skip[c] != "" {
					skipped[c] = true
				}
			}
			dir := shortTempDir(t)
			if err := os.Symlink(bins, filepath.Join(dir, "bin")); err != nil {
				t.Fatal(err)
			}
			env := []string{"HOME=" + dir, "PATH=" + os.Getenv("PATH"), "TERM=dumb", "LANG=C.UTF-8"}
			startDaemon(t, dir, env, recipe)
			for _, s := range steps {
				line := rewrite.Replace(s.cmd)
				if why, ok := skip[strings.TrimSpace(stripComment(s.cmd))]; ok {
					t.Logf("README.md:%d: not run: %s: %s", s.line, s.cmd, why)
					continue
				}
				if name, ok := exportLine(line); ok {
					cmd := exec.Command("bash", "-c", line+`; printf %s "$`+name+`"`)
					cmd.Dir, cmd.Env = dir, env
					out, err := cmd.Output()
					if err != nil {
						t.Fatalf("README.md:%d: %s: %v", s.line, s.cmd, err)
					}
					env = append(env, name+"="+string(out))
					continue
				}
				got, code := runOnTerminal(t, dir, env, line)
				if code != s.code {
					t.Errorf("README.md:%d: %s: exit %d, want %d; it printed:\n%s", s.line, s.cmd, code, s.code, got)
					continue
				}
				if s.want != nil {
					compareSample(t, s, rewrite, got)
				}
			}
		})
	}
	for cmd := range skip {
		if !skipped[cmd] {
			t.Errorf("the skip of %q is stale: README.md's tour no longer has that line", cmd)
		}
	}
}

// shortTempDir is a temporary directory of a short path, whatever TMPDIR
// says: a unix socket's path has at most 107 bytes, and list cuts a
// source past 60 columns.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("/tmp", "tour")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// A tourStep is one command line of the README and what it must do.
type tourStep struct {
	line     int      // README.md's line of the command
	cmd      string   // as written
	code     int      // the exit status it must have
	want     []string // what it prints; nil: not compared
	wantLine int      // README.md's line of want's first line
}

// tourSteps reads the commands of README.md's section "## name".
func tourSteps(t *testing.T, text, name string) []tourStep {
	lines := strings.Split(text, "\n")
	start := -1
	for i, l := range lines {
		if l == "## "+name {
			start = i + 1
		} else if start >= 0 && strings.HasPrefix(l, "## ") {
			lines = lines[:i]
			break
		}
	}
	if start < 0 {
		t.Fatalf("README.md has no section %q", name)
	}
	var (
		steps     []tourStep
		pending   = -1 // the step an output block would belong to
		prose     []string
		proseLine = start + 1 // README.md's line of prose[0]
	)
	exits := regexp.MustCompile(`exits (\d+)`)
	prints := regexp.MustCompile("`(bin/modelctl [^`]+)` prints\\s+`([^`]+)`")
	for i := start; i < len(lines); i++ {
		l := lines[i]
		if !strings.HasPrefix(l, "```") {
			if prose == nil {
				proseLine = i + 1
			}
			prose = append(prose, l)
			continue
		}
		// Prose since the last block: "`CMD` prints `OUT`" is a step.
		p := strings.Join(prose, "\n")
		for _, m := range prints.FindAllStringSubmatchIndex(p, -1) {
			at := proseLine + strings.Count(p[:m[0]], "\n")
			steps = append(steps, tourStep{line: at, cmd: p[m[2]:m[3]], want: []string{p[m[4]:m[5]]}, wantLine: at + strings.Count(p[m[0]:m[4]], "\n")})
		}
		info, blockLine := strings.TrimPrefix(l, "```"), i+1
		var body []string
		for i++; i < len(lines) && !strings.HasPrefix(lines[i], "```"); i++ {
			body = append(body, lines[i])
		}
		switch {
		case info == "sh":
			for j, c := range body {
				if strings.TrimSpace(stripComment(c)) == "" {
					continue
				}
				steps = append(steps, tourStep{line: blockLine + 1 + j, cmd: c})
				pending = len(steps) - 1
			}
		case info == "" && len(body) > 0 && strings.HasPrefix(body[0], "$ "):
			code := 0
			if m := exits.FindStringSubmatch(lastParagraph(prose)); m != nil {
				code, _ = strconv.Atoi(m[1])
			}
			for j := 0; j < len(body); j++ {
				s := tourStep{line: blockLine + 1 + j, cmd: strings.TrimPrefix(body[j], "$ "), code: code, want: []string{}, wantLine: blockLine + 2 + j}
				for j+1 < len(body) && !strings.HasPrefix(body[j+1], "$ ") {
					j++
					s.want = append(s.want, body[j])
				}
				steps = append(steps, s)
			}
			pending = -1
		case info == "":
			if pending < 0 {
				t.Errorf("README.md:%d: a sample output that follows no command", blockLine)
				break
			}
			steps[pending].want, steps[pending].wantLine = body, blockLine+1
			pending = -1
		default:
			t.Errorf("README.md:%d: a block of %q in a section this test runs", blockLine, info)
		}
		prose = nil
	}
	return steps
}

// lastParagraph is the last paragraph of prose.
func lastParagraph(prose []string) string {
	p := strings.TrimSpace(strings.Join(prose, "\n"))
	if i := strings.LastIndex(p, "\n\n"); i >= 0 {
		p = p[i+2:]
	}
	return p
}

// stripComment drops a shell comment at the end of a command line.
func stripComment(line string) string {
	if i := strings.Index(line, "#"); i >= 0 && (i == 0 || line[i-1] == ' ') {
		return line[:i]
	}
	return line
}

var exportRE = regexp.MustCompile(`^export ([A-Za-z_][A-Za-z0-9_]*)=(.*)$`)

// exportLine says whether line is "export NAME=VALUE", whose value the
// steps after it see.
func exportLine(line string) (name string, ok bool) {
	m := exportRE.FindStringSubmatch(strings.TrimSpace(line))
	if m == nil {
		return "", false
	}
	return m[1], true
}

// tourVariable is what differs from run to run in the samples, and how
// both sides of a comparison spell it. The README marks these in prose:
// "your path and revision differ", and a bar that "fits its width".
var tourVariable = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`(?:…|(?:/[^/\s'"]+)+)/\.modelcache/`), "…/.modelcache/"}, // where the reader's clone is
	{regexp.MustCompile(`\b[0-9a-f]{12,64}\b`), "<hex>"},                          // revisions and digests of random bytes
	{regexp.MustCompile(`\[[=> ]*\]`), "[<bar>]"},                                 // as wide as the terminal allows
	{regexp.MustCompile(`\d+(?:\.\d+)? [KMGTPE]?i?B/s\b`), "<rate>"},
	{regexp.MustCompile(`\b(?:\d+(?:ms|s|m|h|d))+\b`), "<duration>"}, // ages, time taken
}

// normalizeSample is line with what varies replaced and runs of blanks
// made one: a column is as wide as its widest value.
func normalizeSample(line string) string {
	for _, v := range tourVariable {
		line = v.re.ReplaceAllString(line, v.with)
	}
	return strings.Join(strings.Fields(line), " ")
}

// compareSample fails with a diff naming README.md's lines when got is
// not what s's sample says the command prints.
func compareSample(t *testing.T, s tourStep, rewrite *strings.Replacer, got string) {
	t.Helper()
	gotLines := strings.Split(strings.TrimRight(got, "\n"), "\n")
	if got == "" {
		gotLines = nil
	}
	var diff strings.Builder
	for i := 0; i < max(len(s.want), len(gotLines)); i++ {
		var w, g string
		if i < len(s.want) {
			w = normalizeSample(rewrite.Replace(s.want[i]))
		}
		if i < len(gotLines) {
			g = normalizeSample(gotLines[i])
		}
		if w == g {
			continue
		}
		switch {
		case i >= len(s.want):
			fmt.Fprintf(&diff, "  README.md:%d: (nothing)\n      printed: %s\n", s.wantLine+len(s.want)-1, gotLines[i])
		case i >= len(gotLines):
			fmt.Fprintf(&diff, "  README.md:%d: %s\n      printed: (nothing)\n", s.wantLine+i, s.want[i])
		default:
			fmt.Fprintf(&diff, "  README.md:%d: %s\n      printed: %s\n", s.wantLine+i, s.want[i], gotLines[i])
		}
	}
	if diff.Len() > 0 {
		t.Errorf("README.md:%d: %s does not print its sample (compared with blanks collapsed and tourVariable's parts replaced):\n%s", s.line, s.cmd, diff.String())
	}
}

// makeRunRecipe is the Makefile's "run" recipe (without its build
// prerequisite: the test built bin/ already) as shell lines, with the
// variables it uses set as the Makefile sets them and the metrics on a
// free port rather than 9477.
func makeRunRecipe(t *testing.T) []string {
	b, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), "\nrun:")
	if !ok {
		t.Fatal("Makefile has no run target")
	}
	vars := strings.NewReplacer("$(ROOT)", "./.modelcache", "$(BIN)", "bin")
	port := regexp.MustCompile(`127\.0\.0\.1:9477\b`)
	var recipe []string
	for _, l := range strings.Split(after, "\n")[1:] {
		if !strings.HasPrefix(l, "\t") {
			break
		}
		l = strings.TrimSpace(l)
		if n := len(recipe); n > 0 && strings.HasSuffix(recipe[n-1], "\\") {
			recipe[n-1] = strings.TrimSuffix(recipe[n-1], "\\") + " " + l
			continue
		}
		recipe = append(recipe, l)
	}
	for i, l := range recipe {
		if recipe[i] = port.ReplaceAllString(vars.Replace(l), "127.0.0.1:0"); strings.Contains(recipe[i], "$(") {
			t.Fatalf("Makefile's run recipe uses a variable this test does not set: %s", l)
		}
	}
	if len(recipe) == 0 || !strings.HasPrefix(recipe[len(recipe)-1], "bin/modelcached ") {
		t.Fatalf("Makefile's run recipe does not end by starting bin/modelcached: %q", recipe)
	}
	return recipe
}

// startDaemon runs recipe in dir: every line but the last to its end,
// the last (the daemon) until the test ends, when it gets SIGTERM and
// must exit 0. It returns once the daemon answers on its socket.
func startDaemon(t *testing.T, dir string, env, recipe []string) {
	t.Helper()
	for _, l := range recipe[:len(recipe)-1] {
		cmd := exec.Command("bash", "-c", l)
		cmd.Dir, cmd.Env = dir, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("make run: %s: %v\n%s", l, err, out)
		}
	}
	var log bytes.Buffer
	daemon := exec.Command("bash", "-c", "exec "+recipe[len(recipe)-1])
	daemon.Dir, daemon.Env = dir, env
	daemon.Stdout, daemon.Stderr = &log, &log
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- daemon.Wait() }()
	t.Cleanup(func() {
		daemon.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("modelcached after SIGTERM: %v\n%s", err, &log)
			}
		case <-time.After(20 * time.Second):
			daemon.Process.Kill()
			t.Errorf("modelcached ignored SIGTERM for 20s\n%s", &log)
		}
		if t.Failed() {
			t.Logf("modelcached's log:\n%s", &log)
		}
	})
	c := &api.Client{Socket: filepath.Join(dir, ".modelcache", "modelcached.sock")}
	err := testenv.Poll(20*time.Second, func() error {
		select {
		case err := <-exited:
			t.Fatalf("modelcached exited at start: %v\n%s", err, &log)
		default:
		}
		return c.Health(context.Background())
	})
	if err != nil {
		t.Fatalf("modelcached not answering on %s after 20s: %v\n%s", c.Socket, err, &log)
	}
}

// runOnTerminal runs line with bash in dir on a terminal of 80 columns,
// stdout and stderr both, as a reader's shell would, and returns what the
// terminal shows at the end (a line redrawn in place: its last state)
// and the exit status.
func runOnTerminal(t *testing.T, dir string, env []string, line string) (string, int) {
	t.Helper()
	ptm, pts, err := openPTY(80)
	if err != nil {
		testenv.Missing(t, "a pseudo-terminal", err.Error())
	}
	defer ptm.Close()
	cmd := exec.Command("bash", "-e", "-o", "pipefail", "-c", line)
	cmd.Dir, cmd.Env = dir, env
	cmd.Stdout, cmd.Stderr = pts, pts
	if err := cmd.Start(); err != nil {
		pts.Close()
		t.Fatal(err)
	}
	pts.Close()
	read := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(ptm) // ends in EIO once the last writer is gone
		read <- b
	}()
	err = cmd.Wait()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	var out []byte
	select {
	case out = <-read:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the terminal stayed open after it exited", line)
	}
	var shown []string
	for _, l := range strings.Split(strings.ReplaceAll(string(out), "\r\n", "\n"), "\n") {
		if i := strings.LastIndex(l, "\r"); i >= 0 {
			l = l[i+1:]
		}
		shown = append(shown, strings.ReplaceAll(l, "\033[K", ""))
	}
	return strings.Join(shown, "\n"), code
}

// openPTY opens a pseudo-terminal of cols columns: its master and the
// terminal a command writes to.
func openPTY(cols uint16) (ptm, pts *os.File, err error) {
	ptm, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	fd := int(ptm.Fd())
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err == nil {
		err = unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0)
	}
	if err == nil {
		pts, err = os.OpenFile("/dev/pts/"+strconv.Itoa(n), os.O_RDWR|syscall.O_NOCTTY, 0)
	}
	if err == nil {
		err = unix.IoctlSetWinsize(int(pts.Fd()), unix.TIOCSWINSZ, &unix.Winsize{Row: 24, Col: cols})
	}
	if err != nil {
		ptm.Close()
		if pts != nil {
			pts.Close()
		}
		return nil, nil, err
	}
	return ptm, pts, nil
}
