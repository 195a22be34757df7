package cachestore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
	"unsafe"

	"github.com/modelcache/modelcache/internal/testenv"
)

// TestBufPoolAlignsAndTrims: a buffer is as large as the pool says and
// aligned as O_DIRECT wants, on a huge page when its size is a multiple
// of one; buffers that come back are kept for the next writer up to four
// writers' worth, and unmapped once no writer took one for the idle
// time, so an idle daemon holds none.
func TestBufPoolAlignsAndTrims(t *testing.T) {
	for _, tc := range []struct {
		size, align int
	}{{DefaultWriteBuffer, hugePage}, {3 << 20, ioAlign}, {MinWriteBuffer, ioAlign}} {
		p := newBufPool(tc.size)
		b := p.get()
		if len(b.mem) != tc.size || cap(b.mem) != tc.size {
			t.Fatalf("size %d: buffer len %d cap %d", tc.size, len(b.mem), cap(b.mem))
		}
		if a := uintptr(unsafe.Pointer(&b.mem[0])) % uintptr(tc.align); a != 0 {
			t.Errorf("size %d: buffer %d bytes off a %d alignment", tc.size, a, tc.align)
		}
		b.mem[0], b.mem[tc.size-1] = 1, 1 // the whole span is mapped
		p.put(b)
		p.close()
	}

	p := newBufPool(MinWriteBuffer)
	// An idle time long against a loaded machine's pauses: a writer that
	// takes a buffer every 20 ms must not look idle because the scheduler
	// held it back for a moment.
	p.idleTime = time.Second
	var taken []*ioBuf
	for range bufKeepWriters*ioBuffers + 3 {
		taken = append(taken, p.get())
	}
	for _, b := range taken {
		p.put(b)
	}
	if n := p.idleBuffers(); n != bufKeepWriters*ioBuffers {
		t.Fatalf("%d buffers kept, want %d (four writers' worth)", n, bufKeepWriters*ioBuffers)
	}
	// A writer that keeps taking buffers keeps the pool, past two idle
	// times.
	for start := time.Now(); time.Since(start) < 5*p.idleTime/2; {
		time.Sleep(20 * time.Millisecond)
		p.put(p.get())
	}
	if n := p.idleBuffers(); n != bufKeepWriters*ioBuffers {
		t.Fatalf("%d buffers kept while writers kept taking them, want %d", n, bufKeepWriters*ioBuffers)
	}
	testenv.Eventually(t, "no buffers kept after two idle times", 30*time.Second, func() error {
		if n := p.idleBuffers(); n > 0 {
			return fmt.Errorf("%d buffers still kept after the last get", n)
		}
		return nil
	})
	if b := p.get(); len(b.mem) != MinWriteBuffer {
		t.Fatalf("a get after the trim: %d bytes", len(b.mem))
	}
}

// TestSmallBlobsOwnBuffers: a blob smaller than half a pooled buffer is
// written from a buffer of its own size (one byte more, rounded up to
// 4 KiB) in small pages, which is unmapped when it comes back and never
// kept; larger or unknown sizes take pooled buffers. Every size around
// the edges lands intact, through Write and ReadFrom, and a body one
// byte longer than announced is refused.
func TestSmallBlobsOwnBuffers(t *testing.T) {
	p := newBufPool(DefaultWriteBuffer)
	var held []*ioBuf
	for _, tc := range []struct {
		left int64
		want int
	}{{0, 4096}, {5000, 8192}, {4095, 4096}, {4096, 8192}, {DefaultWriteBuffer/2 - 2, DefaultWriteBuffer / 2}, {DefaultWriteBuffer/2 - 1, DefaultWriteBuffer}, {-1, DefaultWriteBuffer}, {1 << 30, DefaultWriteBuffer}} {
		b := p.getFor(tc.left)
		if len(b.mem) != tc.want {
			t.Errorf("getFor(%d): %d bytes, want %d", tc.left, len(b.mem), tc.want)
		}
		held = append(held, b)
	}
	for _, b := range held {
		p.put(b)
	}
	if n := p.idleBuffers(); n != 3 {
		t.Errorf("%d buffers kept, want the 3 pooled ones only", n)
	}
	p.close()

	ctx := context.Background()
	s, _, err := Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, size := range []int{0, 1, 4095, 4096, 4097, DefaultWriteBuffer/2 - 2, DefaultWriteBuffer/2 - 1, DefaultWriteBuffer, 2*DefaultWriteBuffer + 1} {
		b := make([]byte, size+1)
		rand.NewChaCha8([32]byte{byte(size)}).Read(b)
		body := b[:size]
		sum := sha256.Sum256(body)
		want := "sha256:" + hex.EncodeToString(sum[:])
		got, err := s.Ingest(ctx, "r"+strconv.Itoa(size), bytes.NewReader(body), int64(size), want)
		if err != nil || got != want {
			t.Fatalf("size %d via ReadFrom: %s %v", size, got, err)
		}
		w, err := s.Writer(ctx, WriterOpts{Ref: "w" + strconv.Itoa(size), Size: int64(size)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write(body); err != nil {
			t.Fatalf("size %d via Write: %v", size, err)
		}
		if got, err := w.Commit(ctx, int64(size), want); err != nil || got != want {
			t.Fatalf("size %d via Write: %s %v", size, got, err)
		}
		if _, err := s.Ingest(ctx, "long"+strconv.Itoa(size), bytes.NewReader(b), int64(size), ""); !errors.Is(err, ErrSizeMismatch) {
			t.Fatalf("size %d with one byte more: %v, want ErrSizeMismatch", size, err)
		}
		s.RemoveIngest("long" + strconv.Itoa(size))
	}
}
