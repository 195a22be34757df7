package cachestore_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"unsafe"

	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/cachestore/storetest"
	"github.com/modelcache/modelcache/internal/testenv"
)

// opener opens stores with direct I/O on or off and keeps them, so a test
// can ask each what it wrote with O_DIRECT.
type opener struct {
	direct bool
	mu     sync.Mutex
	stores []*cachestore.Store
}

func (o *opener) open(t *testing.T, root string) *cachestore.Store {
	s, _, err := cachestore.Open(context.Background(), root, cachestore.WithDirectIO(o.direct))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	o.mu.Lock()
	o.stores = append(o.stores, s)
	o.mu.Unlock()
	return s
}

func (o *opener) directBytes() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	var n int64
	for _, s := range o.stores {
		n += s.DirectIOBytes()
	}
	return n
}

// TestConformanceDirectIO runs the suite with O_DIRECT and checks that it
// was used: the suite ingests blobs of several MiB, whose aligned part
// goes through O_DIRECT wherever the filesystem takes it.
func TestConformanceDirectIO(t *testing.T) {
	// The suite's stores go under TMPDIR: one on a disk filesystem
	// (tmpfs refuses O_DIRECT).
	t.Setenv("TMPDIR", testenv.DiskDir(t))
	if err := probeDirectIO(t.TempDir()); err != nil {
		testenv.Missing(t, fmt.Sprintf("a filesystem that takes O_DIRECT under %s (%v)", os.TempDir(), err), "set TMPDIR to a directory on a disk filesystem that takes O_DIRECT")
	}
	o := &opener{direct: true}
	storetest.Run(t, o.open)
	if n := o.directBytes(); n < 4<<20 {
		t.Fatalf("the stores wrote %d bytes with O_DIRECT, want at least 4 MiB: the suite ran buffered", n)
	}
}

func TestConformanceBuffered(t *testing.T) {
	o := &opener{direct: false}
	storetest.Run(t, o.open)
	if n := o.directBytes(); n != 0 {
		t.Fatalf("WithDirectIO(false), yet %d bytes were written with O_DIRECT", n)
	}
}

// probeDirectIO writes one aligned block with O_DIRECT in dir; its error
// says why the filesystem refuses (EINVAL on tmpfs before Linux 6.6).
func probeDirectIO(dir string) error {
	f, err := os.OpenFile(filepath.Join(dir, "probe"), os.O_WRONLY|os.O_CREATE|syscall.O_DIRECT, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	const align = 4096
	buf := make([]byte, 2*align)
	off := int(align-uintptr(unsafe.Pointer(&buf[0]))%align) % align
	_, err = f.WriteAt(buf[off:off+align], 0)
	return err
}
