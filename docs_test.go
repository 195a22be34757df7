package modelcache_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocsLinksAndCommands holds README.md and docs/*.md to the tree: every
// relative link names a file that exists (and a heading of it, for a
// #fragment), and every modelctl command a code span or block names is a
// command of the modelctl built from this tree (but in a block that shows
// modelctl answering a typo with "did you mean").
func TestDocsLinksAndCommands(t *testing.T) {
	pages, _ := filepath.Glob("docs/*.md")
	pages = append(pages, "README.md")
	bin := filepath.Join(t.TempDir(), "modelctl")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/modelctl").CombinedOutput(); err != nil {
		t.Fatalf("build modelctl: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "__complete", "").Output()
	if err != nil {
		t.Fatal(err)
	}
	commands := map[string]bool{"help": true}
	for _, c := range strings.Fields(string(out)) {
		commands[c] = true
	}
	commands["ls"] = true // list's alias

	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	code := regexp.MustCompile("(?s)```.*?```|`[^`\n]+`")
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
