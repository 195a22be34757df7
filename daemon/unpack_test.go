package daemon

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/modelcache/modelcache/internal/testenv"
)

// resident says whether the page of f at off is in the page cache.
func resident(t *testing.T, f *os.File, off int64) bool {
	t.Helper()
	m, err := unix.Mmap(int(f.Fd()), off, os.Getpagesize(), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	vec := make([]byte, 1)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	return vec[0]&1 == 1
}

// The unpack reads a cold layer blob with the next window of it asked of
// the disk ahead (FADV_WILLNEED): a page well past the kernel's own
// read-ahead comes into the page cache while the reader is still at the
// start, and the bytes read are the file's.
func TestReadAheadAsksForTheNextWindow(t *testing.T) {
	const size = 2 * aheadWindow
	body := make([]byte, size)
	rand.Read(body)
	p := filepath.Join(testenv.DiskDir(t), "layer") // tmpfs keeps its pages: no cold read there
	if err := os.WriteFile(p, body, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	// Cold: the clean pages dropped from the page cache.
	unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED)
	far := int64(aheadWindow * 3 / 4) // in the first window, far past the kernel's read-ahead (128-256 KiB)
	if resident(t, f, far) {
		t.Fatalf("%s stays in the page cache after fsync and FADV_DONTNEED, on a disk filesystem: cannot tell a cold read", p)
	}
	r := &readAhead{f: f}
	head := make([]byte, 1<<20)
	if _, err := io.ReadFull(r, head); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, "the window ahead asked for after reading 1 MiB", 20*time.Second, func() error {
		if !resident(t, f, far) {
			return fmt.Errorf("the page at %d MiB is not in the page cache", far>>20)
		}
		return nil
	})
	// The window slides with the reader.
	mid := make([]byte, aheadWindow/2)
	for i := 0; i < len(mid); i += 1 << 20 { // in 1 MiB reads, as the unpack's bufio reads
		if _, err := io.ReadFull(r, mid[i:i+1<<20]); err != nil {
			t.Fatal(err)
		}
	}
	far2 := int64(1<<20 + aheadWindow/2 + aheadWindow*3/4)
	testenv.Eventually(t, fmt.Sprintf("the window slid half-way through the file's first %d MiB", aheadWindow>>20), 20*time.Second, func() error {
		if !resident(t, f, far2) {
			return fmt.Errorf("the page at %d MiB is not in the page cache", far2>>20)
		}
		return nil
	})
	if beyond := int64(size - 4096); resident(t, f, beyond) {
		t.Fatalf("at %d MiB the reader has the page at %d MiB read already: more than the %d MiB window ahead", (1<<20+aheadWindow/2)>>20, beyond>>20, aheadWindow>>20)
	}
	rest, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	got := append(append(head, mid...), rest...)
	if !bytes.Equal(got, body) {
		t.Fatal("the bytes read through readAhead differ from the file's")
	}
}
