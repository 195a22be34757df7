package fetchers

import (
	"fmt"
	"path"
	"regexp"
	"strings"
)

// Glob matches paths the way huggingface_hub's allow_patterns and
// ignore_patterns do (Python's fnmatch): '*' matches any run of characters
// including '/', '?' one character, '[...]' a class; a pattern ending in
// '/' matches everything under that directory.
type Glob struct {
	pattern string
	re      *regexp.Regexp
}

// CompileGlob compiles pattern, or says what is wrong with it.
func CompileGlob(pattern string) (*Glob, error) {
	if pattern == "" {
		return nil, fmt.Errorf("glob: empty pattern")
	}
	p := pattern
	if strings.HasSuffix(p, "/") {
		p += "*"
	}
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(p); i++ {
		switch c := p[i]; c {
		case '*':
			b.WriteString(".*")
		case '?':
			b.WriteString(".")
		case '[':
			j := strings.IndexByte(p[i+1:], ']')
			if j < 0 {
				return nil, fmt.Errorf("glob %q: unclosed '['", pattern)
			}
			class := p[i+1 : i+1+j]
			if strings.HasPrefix(class, "!") {
				class = "^" + class[1:]
			}
			b.WriteString("[" + strings.ReplaceAll(class, `\`, `\\`) + "]")
			i += j + 1
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString("$")
	re, err := regexp.Compile(b.String())
	if err != nil {
		return nil, fmt.Errorf("glob %q: %v", pattern, err)
	}
	return &Glob{pattern: pattern, re: re}, nil
}

// Match reports whether p matches.
func (g *Glob) Match(p string) bool { return g.re.MatchString(path.Clean(p)) || g.re.MatchString(p) }

// Filter keeps the files that match an include glob (all when none) and no
// exclude glob. A pattern that matches nothing at all is not an error, but
// an include list that keeps no file is: the caller asked for nothing.
func Filter(files []File, include, exclude []string) ([]File, error) {
	comp := func(list []string) ([]*Glob, error) {
		out := make([]*Glob, 0, len(list))
		for _, p := range list {
			g, err := CompileGlob(p)
			if err != nil {
				return nil, err
			}
			out = append(out, g)
		}
		return out, nil
	}
	inc, err := comp(include)
	if err != nil {
		return nil, err
	}
	exc, err := comp(exclude)
	if err != nil {
		return nil, err
	}
	any := func(gs []*Glob, p string) bool {
		for _, g := range gs {
			if g.Match(p) {
				return true
			}
		}
		return false
	}
	var out []File
	for _, f := range files {
		if (len(inc) == 0 || any(inc, f.Path)) && !any(exc, f.Path) {
			out = append(out, f)
		}
	}
	if len(out) == 0 && len(files) > 0 {
		var some []string
		for _, f := range files[:min(3, len(files))] {
			some = append(some, f.Path)
		}
		// Asking again cannot help: a source that does not have what the
		// globs name (ErrNotFound, not retried until the desire changes).
		return nil, fmt.Errorf("%w: include %q / exclude %q leave none of the source's %d files (they are named like %s); fix the globs",
			ErrNotFound, include, exclude, len(files), strings.Join(some, ", "))
	}
	return out, nil
}
