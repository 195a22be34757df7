package file

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/modelcache/modelcache/fetchers"
)

func write(t *testing.T, p, s string) {
	t.Helper()
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestResolveTree(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "config.json"), "{}")
	write(t, filepath.Join(dir, "a/b/w.bin"), "weights")
	os.Symlink("a/b/w.bin", filepath.Join(dir, "alias.bin")) // inside the tree: followed
	f := New()
	res, err := f.Resolve(context.Background(), fetchers.Source{URI: "file://" + dir})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, fl := range res.Files {
		got[fl.Path] = fl.Size
	}
	if len(got) != 3 || got["a/b/w.bin"] != 7 || got["alias.bin"] != 7 || got["config.json"] != 2 {
		t.Fatalf("files %v", got)
	}
	for _, fl := range res.Files {
		if fl.Path == "alias.bin" {
			rc, err := f.Open(context.Background(), fl, 2)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(rc)
			rc.Close()
			if string(b) != "ights" {
				t.Fatalf("read through symlink at offset: %q", b)
			}
		}
	}
}

func TestHostileSources(t *testing.T) {
	outside := t.TempDir()
	write(t, filepath.Join(outside, "secret"), "do not cache me")
	escAbs := t.TempDir()
	write(t, filepath.Join(escAbs, "ok.json"), "{}")
	os.Symlink(filepath.Join(outside, "secret"), filepath.Join(escAbs, "abs-link"))
	escRel := t.TempDir()
	write(t, filepath.Join(escRel, "ok.json"), "{}")
	os.MkdirAll(filepath.Join(escRel, "sub"), 0o755)
	os.Symlink("../../"+filepath.Base(outside)+"/secret", filepath.Join(escRel, "sub/rel-link"))
	fifo := t.TempDir()
	syscall.Mkfifo(filepath.Join(fifo, "pipe"), 0o644)

	f := New()
	for _, tc := range []struct {
		name, uri, want string
		is              error
	}{
		{"absolute symlink out", "file://" + escAbs, "points outside the source tree", fetchers.ErrBadSource},
		{"relative symlink out", "file://" + escRel, "points outside the source tree", fetchers.ErrBadSource},
		{"dotdot in URI", "file://" + escAbs + "/../x", "'..'", fetchers.ErrBadSource},
		{"relative URI", "file:relative/path", "absolute", fetchers.ErrBadSource},
		{"host in URI", "file://host/abs", "three slashes", fetchers.ErrBadSource},
		{"missing", "file:///nonexistent/model", "does not exist", fetchers.ErrNotFound},
		{"fifo", "file://" + fifo, "not a regular file", fetchers.ErrBadSource},
		{"empty dir", "file://" + t.TempDir(), "no files", fetchers.ErrNotFound},
	} {
		_, err := f.Resolve(context.Background(), fetchers.Source{URI: tc.uri})
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, tc.is) || !fetchers.IsPermanent(err) {
			t.Errorf("%s: %v; want a permanent %v containing %q", tc.name, err, tc.is, tc.want)
		}
	}
}

// TestOpenRefusesSwappedSymlink: a file that turned into an escaping
// symlink after Resolve is refused at Open.
func TestOpenRefusesSwappedSymlink(t *testing.T) {
	outside := t.TempDir()
	write(t, filepath.Join(outside, "secret"), "secret")
	dir := t.TempDir()
	write(t, filepath.Join(dir, "w.bin"), "weights")
	f := New()
	res, err := f.Resolve(context.Background(), fetchers.Source{URI: "file://" + dir})
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, "w.bin"))
	os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "w.bin"))
	if rc, err := f.Open(context.Background(), res.Files[0], 0); err == nil {
		b, _ := io.ReadAll(rc)
		t.Fatalf("opened a swapped escaping symlink and read %q", b)
	}
}

func TestUnreadable(t *testing.T) {
	if os.Geteuid() == 0 {
		// root reads everything; the message is checked through explain instead.
		err := explain("file:///x", "/x/y", os.ErrPermission)
		if !errors.Is(err, fetchers.ErrUnauthorized) || !strings.Contains(err.Error(), "by the user this pull reads as") {
			t.Fatalf("explain: %v", err)
		}
		return
	}
	dir := t.TempDir()
	write(t, filepath.Join(dir, "locked"), "x")
	os.Chmod(filepath.Join(dir, "locked"), 0)
	res, err := New().Resolve(context.Background(), fetchers.Source{URI: "file://" + dir})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New().Open(context.Background(), res.Files[0], 0); !errors.Is(err, fetchers.ErrUnauthorized) {
		t.Fatalf("unreadable: %v", err)
	}
}
