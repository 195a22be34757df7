package cliutil

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/urfave/cli/v2"
)

// The reference tables of docs/flags.md are written from the flag
// definitions, each between two markers of its own (a section):
//
//	<!-- BEGIN modelcached-flags: written by go generate ./cmd/modelcached; do not edit -->
//	…
//	<!-- END modelcached-flags -->
//
// A test of the command's package compares the section with what the
// definitions give (SyncDocSection), so the doc cannot drift from the code.

// SyncDocSection compares section name of the markdown file at path with
// body. With update it rewrites the section to body instead. It returns
// an error naming the file, the section and how to bring it up to date
// when they differ (and update is false) or the markers are missing.
func SyncDocSection(path, name, generator, body string, update bool) error {
	doc, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	begin, end := "<!-- BEGIN "+name, "<!-- END "+name+" -->"
	i := bytes.Index(doc, []byte(begin))
	j := bytes.Index(doc, []byte(end))
	if i < 0 || j < i {
		return fmt.Errorf("%s: no section %s (the lines %q … and %q)", path, name, begin, end)
	}
	nl := bytes.IndexByte(doc[i:], '\n')
	if nl < 0 || i+nl >= j {
		return fmt.Errorf("%s: section %s: its BEGIN line ends at its END", path, name)
	}
	head := fmt.Sprintf("%s: written by %s; do not edit -->\n", begin, generator)
	want := head + body + end
	have := string(doc[i : j+len(end)])
	if have == want {
		return nil
	}
	if !update {
		return fmt.Errorf("%s: section %s differs from the definitions in the code; run %s and commit the result (first line that differs: %s)",
			path, name, generator, firstDiff(have, want))
	}
	out := append(append(append([]byte{}, doc[:i]...), want...), doc[j+len(end):]...)
	return os.WriteFile(path, out, 0o644)
}

// firstDiff quotes the first line of have that differs from want's.
func firstDiff(have, want string) string {
	h, w := strings.Split(have, "\n"), strings.Split(want, "\n")
	for k := range h {
		if k >= len(w) || h[k] != w[k] {
			return strconv.Quote(h[k])
		}
	}
	return "(the doc ends early)"
}

// Cell is s as one cell of a markdown table: pipes escaped, on one line.
func Cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.Join(strings.Fields(s), " ")
}

// Code is s as a markdown code span of a table cell.
func Code(s string) string {
	return "`" + strings.ReplaceAll(s, "|", `\|`) + "`"
}

// DefaultText is a flag's default as its help shows it, unquoted; ""
// where it has none.
func DefaultText(f cli.Flag) string {
	df, ok := f.(cli.DocGenerationFlag)
	if !ok {
		return ""
	}
	d := df.GetDefaultText()
	if u, err := strconv.Unquote(d); err == nil {
		d = u
	}
	return d
}

// Usage is a flag's help text.
func Usage(f cli.Flag) string {
	if df, ok := f.(cli.DocGenerationFlag); ok {
		return df.GetUsage()
	}
	return ""
}

// EnvVars are the environment variables that set a flag.
func EnvVars(f cli.Flag) []string {
	if df, ok := f.(cli.DocGenerationFlag); ok {
		return df.GetEnvVars()
	}
	return nil
}
