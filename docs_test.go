package modelcache_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestDocsLinksAndCommands holds README.md and docs/*.md to the tree: every
// relative link names a file that exists (and a heading of it, for a
// #fragment), and every modelctl command a code span or block names is a
// command of the modelctl built from this tree (but in a block that shows
// modelctl answering a typo with "did you mean").
func TestDocsLinksAndCommands(t *testing.T) {
	pages := docPages()
	bin := build(t, "modelctl")
	out, err := exec.Command(bin, "__complete", "").Output()
	if err != nil {
		t.Fatal(err)
	}
	commands := map[string]bool{"help": true}
	for _, c := range strings.Fields(string(out)) {
		commands[c] = true
	}
	for c, aliases := range map[string][]string{"list": {"ls"}, "evict": {"rm", "delete"}} {
		for _, a := range aliases {
			commands[a] = commands[c]
		}
	}

	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	code := codeRE
	invocation := regexp.MustCompile(`(?:^|[\s/(;|&"'$]|` + "`" + `)modelctl((?:\s+(?:-o|--output|--socket)(?:\s+|=)\S+)*)\s+([a-z][a-z-]*)`)
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for _, m := range link.FindAllStringSubmatch(text, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s: link %q: %v", page, target, err)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(path, ".md") && !hasHeading(t, path, frag) {
				t.Errorf("%s: link %q: %s has no heading #%s", page, target, path, frag)
			}
		}
		for _, span := range code.FindAllString(text, -1) {
			if strings.Contains(span, "did you mean") { // a typo on purpose, and its answer
				continue
			}
			for _, m := range invocation.FindAllStringSubmatch(span, -1) {
				if !commands[m[2]] {
					t.Errorf("%s: %q names no modelctl command %q", page, strings.TrimSpace(m[0]), m[2])
				}
			}
		}
	}
}

// codeRE matches a code block or a code span of markdown.
var codeRE = regexp.MustCompile("(?s)```.*?```|`[^`\n]+`")

func docPages() []string {
	pages, _ := filepath.Glob("docs/*.md")
	return append(pages, "README.md")
}

// build builds ./cmd/name from this tree and returns the binary's path.
func build(t *testing.T, name string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/"+name).CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, out)
	}
	return bin
}

// TestDocsFlagsExist: each flag the docs give modelctl or modelcached in a
// code span or block ("modelctl pull URI --name x", "modelcached --quota
// 500Gi", and a span that begins with a modelctl command, "pull --keep")
// is a flag of the binary built from this tree: of the command named, or a
// global one. A block that shows a typo answered with "did you mean" is
// passed by; after a bare "--" come another program's arguments.
func TestDocsFlagsExist(t *testing.T) {
	ctl := build(t, "modelctl")
	out, err := exec.Command(ctl, "__complete", "").Output()
	if err != nil {
		t.Fatal(err)
	}
	ctlFlags := map[string]map[string]bool{"": completions(t, ctl, "--")} // command → its flags and the global ones
	for _, c := range strings.Fields(string(out)) {
		ctlFlags[c] = completions(t, ctl, c, "--")
	}
	for _, c := range strings.Fields(string(out)) { // subcommands: "kernelcache build"
		subs, _ := exec.Command(ctl, "__complete", c, "").Output()
		for _, sub := range strings.Fields(string(subs)) {
			if !strings.HasPrefix(sub, "-") && ctlFlags[c+" "+sub] == nil && len(ctlFlags[c]) > 0 {
				ctlFlags[c+" "+sub] = completions(t, ctl, c, sub, "--")
			}
		}
	}
	for c, aliases := range map[string][]string{"list": {"ls"}, "evict": {"rm", "delete"}} {
		for _, a := range aliases {
			ctlFlags[a] = ctlFlags[c]
		}
	}
	help, err := exec.Command(build(t, "modelcached"), "--help").Output()
	if err != nil {
		t.Fatal(err)
	}
	daemonFlags := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\s+(--[a-z][a-z0-9-]*)`).FindAllStringSubmatch(string(help), -1) {
		daemonFlags[m[1]] = true
	}
	if !daemonFlags["--quota"] || !ctlFlags["pull"]["--name"] || !ctlFlags["list"]["--output"] {
		t.Fatalf("flag sets not read: modelcached %v; modelctl %v", daemonFlags, ctlFlags)
	}

	flag := regexp.MustCompile(`(?:^|[\s\[(|=])(--[a-z][a-z0-9-]*)`)
	// An invocation runs to the end of its line (one that ends in "\"
	// goes on) or to a shell separator.
	invocation := regexp.MustCompile(`\b(modelctl|modelcached)\b([^|;&\n` + "`" + `]*)`)
	for _, page := range docPages() {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, span := range codeRE.FindAllString(string(b), -1) {
			if strings.Contains(span, "did you mean") {
				continue
			}
			check := func(prog, args string) {
				args, _, _ = strings.Cut(args+" ", " -- ")
				known, what := daemonFlags, "modelcached"
				if prog == "modelctl" {
					cmd := ctlCommand(args)
					if w := strings.Fields(args); ctlFlags[cmd+" "+nextWord(w, cmd)] != nil { // a subcommand
						cmd += " " + nextWord(w, cmd)
					}
					if known = ctlFlags[cmd]; known == nil {
						return // not a command: TestDocsLinksAndCommands says so
					}
					what = strings.TrimSpace("modelctl " + cmd)
				}
				for _, m := range flag.FindAllStringSubmatch(args, -1) {
					if !known[m[1]] {
						t.Errorf("%s: %q: %s has no flag %s", page, strings.TrimSpace(prog+args), what, m[1])
					}
				}
			}
			for _, m := range invocation.FindAllStringSubmatch(strings.ReplaceAll(span, "\\\n", " "), -1) {
				check(m[1], m[2])
			}
			// An inline span that begins with a command: "pull --keep".
			if inner := strings.Trim(span, "`"); !strings.Contains(span, "\n") {
				if w := strings.Fields(inner); len(w) > 1 && ctlFlags[w[0]] != nil {
					check("modelctl", " "+inner)
				}
			}
		}
	}
}

// completions is what "modelctl __complete WORDS..." offers.
func completions(t *testing.T, bin string, words ...string) map[string]bool {
	t.Helper()
	out, err := exec.Command(bin, append([]string{"__complete"}, words...)...).Output()
	if err != nil {
		t.Fatal(err)
	}
	set := map[string]bool{}
	for _, f := range strings.Fields(string(out)) {
		set[f] = true
	}
	return set
}

// ctlCommand is the command of modelctl's arguments args: the first word
// that is not a global flag or its value.
// nextWord is the word after the first w equal to word.
func nextWord(w []string, word string) string {
	for i := 0; i+1 < len(w); i++ {
		if w[i] == word {
			return w[i+1]
		}
	}
	return ""
}

func ctlCommand(args string) string {
	w := strings.Fields(args)
	for i := 0; i < len(w); i++ {
		switch {
		case w[i] == "-o" || w[i] == "--output" || w[i] == "--socket":
			i++
		case strings.HasPrefix(w[i], "-"):
		default:
			return w[i]
		}
	}
	return ""
}

// hasHeading says whether the markdown file has a heading whose GitHub
// anchor is frag.
func hasHeading(t *testing.T, path, frag string) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, "#") {
			continue
		}
		h := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
		var slug strings.Builder
		for _, r := range h {
			switch {
			case r == ' ':
				slug.WriteRune('-')
			case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
				slug.WriteRune(r)
			}
		}
		if slug.String() == frag {
			return true
		}
	}
	return false
}

// TestMakeBenchRunsEveryBenchmark: every Go benchmark of the tree runs in
// make bench (a bench-* target that bench runs selects it: its -bench
// regexp matches the name, and the target names the benchmark's package),
// and every BenchmarkX docs/benchmarks.md names is one of them.
func TestMakeBenchRunsEveryBenchmark(t *testing.T) {
	benchmarks := map[string]string{} // name → package dir, "./daemon/"
	decl := regexp.MustCompile(`(?m)^func (Benchmark\w+)\(`)
	err := filepath.WalkDir(".", func(p string, e os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() && (e.Name() == ".git" || e.Name() == "testdata" || e.Name() == "bin") {
			return filepath.SkipDir
		}
		if e.IsDir() || !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllStringSubmatch(string(b), -1) {
			benchmarks[m[1]] = "./" + filepath.Dir(p) + "/"
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(benchmarks) < 10 {
		t.Fatalf("found %d benchmarks: %v", len(benchmarks), benchmarks)
	}

	// The Makefile's bench targets: their go test lines, and which
	// targets bench runs.
	mk, err := os.ReadFile("Makefile")
	if err != nil {
		t.Fatal(err)
	}
	type run struct {
		target string
		re     *regexp.Regexp
		pkgs   []string
	}
	var runs []run
	ranByBench := map[string]bool{"bench": true}
	target := ""
	benchArg := regexp.MustCompile(`-bench\s+('[^']*'|\S+)`)
	for _, line := range strings.Split(string(mk), "\n") {
		if m := regexp.MustCompile(`^([a-z][a-z-]*):`).FindStringSubmatch(line); m != nil {
			target = m[1]
			continue
		}
		if !strings.HasPrefix(line, "\t") || (target != "bench" && !strings.HasPrefix(target, "bench-")) {
			continue
		}
		if target == "bench" {
			if m := regexp.MustCompile(`\$\(MAKE\).*\s(bench-[a-z-]+)`).FindStringSubmatch(line); m != nil {
				ranByBench[m[1]] = true
			}
		}
		m := benchArg.FindStringSubmatch(line)
		if m == nil || !strings.Contains(line, " test ") {
			continue
		}
		expr := strings.ReplaceAll(strings.Trim(m[1], "'"), "$$", "$")
		re, err := regexp.Compile(expr)
		if err != nil {
			t.Fatalf("Makefile %s: -bench %s: %v", target, m[1], err)
		}
		r := run{target: target, re: re}
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "./") {
				r.pkgs = append(r.pkgs, strings.TrimSuffix(f, "/")+"/")
			}
		}
		runs = append(runs, r)
	}
	for name, pkg := range benchmarks {
		ran := false
		for _, r := range runs {
			if ranByBench[r.target] && r.re.MatchString(name) && slices.Contains(r.pkgs, pkg) {
				ran = true
			}
		}
		if !ran {
			t.Errorf("%s (%s) runs in no bench target of the Makefile that make bench runs", name, pkg)
		}
	}

	doc, err := os.ReadFile("docs/benchmarks.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range regexp.MustCompile(`\bBenchmark[A-Z]\w*`).FindAllString(string(doc), -1) {
		if benchmarks[name] == "" {
			t.Errorf("docs/benchmarks.md names %s, which no _test.go declares", name)
		}
	}
}
