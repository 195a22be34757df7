package cachestore

import (
	"testing"
	"time"
	"unsafe"
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
	p.idleTime = 200 * time.Millisecond
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
	for range 25 {
		time.Sleep(20 * time.Millisecond)
		p.put(p.get())
	}
	if n := p.idleBuffers(); n != bufKeepWriters*ioBuffers {
		t.Fatalf("%d buffers kept while writers kept taking them, want %d", n, bufKeepWriters*ioBuffers)
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.idleBuffers() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d buffers still kept 5 s after the last get, want 0 after two idle times", p.idleBuffers())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if b := p.get(); len(b.mem) != MinWriteBuffer {
		t.Fatalf("a get after the trim: %d bytes", len(b.mem))
	}
}
