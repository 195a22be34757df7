package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
)

// models.d holds what is not a regular file: a FIFO (which blocked the
// loader for ever), symlinks to files elsewhere (whose content reached the
// world-readable status or became a desire), a directory and an oversized
// file. Each is named in the status and skipped; the regular file counts,
// and later edits are still seen.
func TestModelsDirOnlyRegularFiles(t *testing.T) {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "w.bin"), []byte("declared"), 0o644)
	traversable(t, src) // models.d reads as --file-identity, nobody by default
	secret := t.TempDir()
	os.WriteFile(filepath.Join(secret, "desire"), []byte("name: leaked\nuri: file:///secret-token-4711\n"), 0o600)
	os.WriteFile(filepath.Join(secret, "shadow"), []byte("secret-token-4712: x\n"), 0o600)

	cfg := testConfig(t)
	md := cfg.ModelsDir
	os.MkdirAll(md, 0o755)
	os.WriteFile(filepath.Join(md, "good.yaml"), []byte("name: good\nuri: file://"+src+"\n"), 0o644)
	if err := syscall.Mkfifo(filepath.Join(md, "fifo.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Symlink(filepath.Join(secret, "desire"), filepath.Join(md, "link.yaml"))
	os.Symlink(filepath.Join(secret, "shadow"), filepath.Join(md, "shadow.yml"))
	os.Mkdir(filepath.Join(md, "dir.yaml"), 0o755)
	big, _ := os.Create(filepath.Join(md, "big.yaml"))
	big.Truncate(2 << 20)
	big.Close()

	started := make(chan *harness, 1)
	go func() { started <- start(t, cfg) }()
	var h *harness
	select {
	case h = <-started:
	case <-time.After(20 * time.Second):
		// Unblock the loader stuck on the FIFO, and take the FIFO away so
		// that the next reload (and the stop) does not block again.
		if f, err := os.OpenFile(filepath.Join(md, "fifo.yaml"), os.O_RDWR, 0); err == nil {
			os.Remove(filepath.Join(md, "fifo.yaml"))
			f.Close()
		}
		<-started
		t.Fatal("the daemon did not start in 20s with a FIFO in models.d")
	}
	h.waitPhase("good", api.PhaseReady)
	if _, err := h.c.Get(context.Background(), "leaked"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("a symlinked file became a desire: %v", err)
	}
	s, err := h.c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(s.ModelsDirError, "\n")
	if strings.Contains(all, "secret-token") {
		t.Fatalf("status echoes the content of a file models.d does not own:\n%s", all)
	}
	for _, n := range []string{"fifo.yaml", "link.yaml", "shadow.yml", "dir.yaml", "big.yaml"} {
		if !strings.Contains(all, filepath.Join(md, n)) {
			t.Errorf("status does not name %s:\n%s", n, all)
		}
	}
	if len(s.ModelsDirError) != 5 {
		t.Errorf("want 5 problems, got %d:\n%s", len(s.ModelsDirError), all)
	}
	// The loader is not wedged: a file added now is seen.
	os.WriteFile(filepath.Join(md, "later.yaml"), []byte("name: later\nuri: file://"+src+"\n"), 0o644)
	h.waitPhase("later", api.PhaseReady)
}
