package main

import (
	"strings"
	"testing"
)

// TestRefusedUnder: a capture of a directory is refused for the entries
// a kept layer refused at or under it, and only those.
func TestRefusedUnder(t *testing.T) {
	refused := []string{"shadow (a symbolic link)", "kernels/tk/io.triton.cache/x.json (a symbolic link)", "kernels/tk/io.triton.cachex (a named pipe)"}
	for _, c := range []struct{ dir, want string }{
		{"kernels/tk/io.triton.cache", "kernels/tk/io.triton.cache/x.json (a symbolic link)"},
		{"kernels/tk/io.triton.cache/x.json", "kernels/tk/io.triton.cache/x.json (a symbolic link)"},
		{"kernels/other", ""},
		{".", strings.Join(refused, "; ")},
	} {
		if got := strings.Join(refusedUnder(refused, c.dir), "; "); got != c.want {
			t.Errorf("refusedUnder(%s) = %q, want %q", c.dir, got, c.want)
		}
	}
}
