package cachestore

import (
	"path/filepath"
	"strings"
	"testing"
)

// FuzzValidatePath: a path the store accepts stays under the root it is
// joined to, whatever bytes it holds.
func FuzzValidatePath(f *testing.F) {
	for _, s := range []string{"config.json", "a/b/c.safetensors", "../x", "/etc/passwd", "a/../../b", "a//b", "./a", "a/./b", "a\x00b", "current", "ü/ß", "a/b/", strings.Repeat("a/", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if ValidatePath(p) != nil {
			return
		}
		root := "/store/models/m/rev"
		full := filepath.Join(root, filepath.FromSlash(p))
		if !strings.HasPrefix(full, root+"/") {
			t.Fatalf("ValidatePath accepted %q, which lands at %q outside %s", p, full, root)
		}
		if filepath.Clean(p) != p || strings.Contains(p, "\x00") || strings.HasPrefix(p, "/") {
			t.Fatalf("ValidatePath accepted the unclean path %q", p)
		}
	})
}

// FuzzValidateName: an accepted artifact name is one path element.
func FuzzValidateName(f *testing.F) {
	for _, s := range []string{"llama-3", "a.kc0", "..", ".", "a/b", "current", "", strings.Repeat("x", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, n string) {
		if ValidateName(n) != nil {
			return
		}
		if n == "." || n == ".." || strings.ContainsAny(n, "/\\\x00") || filepath.Base(n) != n {
			t.Fatalf("ValidateName accepted %q", n)
		}
	})
}
