package cachestore

import (
	"fmt"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DefaultWriteBuffer is the size of each of a Writer's two pipeline
// buffers, and so of its writes to disk (WithWriteBuffer): one huge page.
// Larger writes mean fewer O_DIRECT syscalls, each a blocked thread whose
// P the Go runtime hands to another thread, and fewer hypervisor round
// trips on a VM. Of 1, 2 and 4 MiB, alternated on one stream, 2 MiB took
// the least CPU per GB and was the fastest, and 4 MiB added RSS
// (docs/benchmarks.md, the http row, has the figures). The cost against
// 1 MiB: a crash loses up to two buffers of what was read
// (4 MiB, half a Range chunk of the fetchers) and a file being pulled
// holds 4 MiB.
const DefaultWriteBuffer = 2 << 20

// Bounds of WithWriteBuffer.
const (
	MinWriteBuffer = 64 << 10
	MaxWriteBuffer = 64 << 20
)

// hugePage is the size of a transparent huge page on x86-64 and arm64
// (4 KiB base pages). A buffer that is a multiple of it is mapped on
// that alignment with MADV_HUGEPAGE: a first touch then faults 2 MiB at
// once, not 512 pages, each fault a hypervisor round trip on a VM
// (docs/benchmarks.md, machine line), and an O_DIRECT write pins one
// huge page per 2 MiB instead of 512 small ones (with THP off, the same
// buffers took more CPU per GB: docs/benchmarks.md). Where THP is
// off the advice is ignored and the buffer is made of small pages.
const hugePage = 2 << 20

// ValidWriteBuffer says what is wrong with a write buffer size, or nil.
func ValidWriteBuffer(n int64) error {
	if n < MinWriteBuffer || n > MaxWriteBuffer || n%ioAlign != 0 {
		return fmt.Errorf("write buffer of %d bytes: want a multiple of 4 KiB from 64 KiB to 64 MiB (default 2 MiB)", n)
	}
	return nil
}

// bufKeepWriters is how many writers' buffers stay mapped when they come
// back to the pool, for the next writers (eight: the default
// --max-concurrent-pulls × --files-per-pull, and more than a kernel
// cache's unpack holds at once; 32 MiB at the default size); beyond it a
// buffer is unmapped at once. bufIdleTime is how long the kept ones stay
// once no writer takes one: then the pool unmaps them all, so an idle
// daemon holds none.
const (
	bufKeepWriters = 8
	bufIdleTime    = 30 * time.Second
)

// ioBufPool holds one store's pipeline buffers. They are mapped outside
// the Go heap: aligned as O_DIRECT wants, never scanned or moved by the
// collector, and not counted in its heap goal (a heap of buffers would
// let the garbage around them grow as large). Kept buffers stay faulted
// in, so a new writer does not fault on the hot path.
type ioBufPool struct {
	size     int           // bytes per buffer
	idleTime time.Duration // bufIdleTime; shorter in tests

	mu    sync.Mutex
	idle  []*ioBuf
	timer *time.Timer // trims the idle buffers after idleTime without a get
	gets  uint64      // gets so far; trim leaves the buffers when it moved
}

func newBufPool(size int) *ioBufPool { return &ioBufPool{size: size, idleTime: bufIdleTime} }

// get returns a buffer of p.size bytes; n is 0.
func (p *ioBufPool) get() *ioBuf {
	p.mu.Lock()
	p.gets++
	if k := len(p.idle); k > 0 {
		b := p.idle[k-1]
		p.idle = p.idle[:k-1]
		p.mu.Unlock()
		return b
	}
	p.mu.Unlock()
	return newBuf(p.size, true)
}

// getFor returns a buffer for a writer that has left bytes still to
// come (< 0: unknown). A blob smaller than half a pooled buffer gets one
// of its own size (one byte more, to see an overlong body, rounded up to
// 4 KiB) in small pages, unmapped when it comes back: a batch of small
// members (daemon/unpack.go) holds hundreds of writers at once, and each
// would otherwise hold a whole pooled buffer, faulted in as a huge page
// by its first byte.
func (p *ioBufPool) getFor(left int64) *ioBuf {
	if left < 0 || left+1 >= int64(p.size/2) {
		return p.get()
	}
	return newBuf(int((left+ioAlign)&^(ioAlign-1)), false)
}

// newBuf maps a buffer of size bytes (huge: on huge pages where size
// allows), or takes it from the heap when no mapping is to be had.
func newBuf(size int, huge bool) *ioBuf {
	if mem, err := mapBuffer(size, huge); err == nil {
		return &ioBuf{mem: mem, mapped: true}
	}
	raw := make([]byte, size+ioAlign)
	off := alignOffset(raw)
	return &ioBuf{mem: raw[off : off+size]}
}

// mapBuffer maps size bytes of anonymous memory; with huge, and when size
// is a multiple of hugePage, on a huge page boundary with MADV_HUGEPAGE.
func mapBuffer(size int, huge bool) ([]byte, error) {
	if !huge || size%hugePage != 0 {
		return unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	}
	// Map one huge page more and unmap what lies outside the aligned span.
	raw, err := unix.Mmap(-1, 0, size+hugePage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, err
	}
	off := alignUp(raw, hugePage)
	if off > 0 {
		unix.Munmap(raw[:off])
	}
	if rest := raw[off+size:]; len(rest) > 0 {
		unix.Munmap(rest)
	}
	mem := raw[off : off+size : off+size]
	unix.Madvise(mem, unix.MADV_HUGEPAGE) // advice: ignored where THP is off
	return mem, nil
}

// put takes a buffer back; it must not be used after.
func (p *ioBufPool) put(b *ioBuf) {
	b.n = 0
	if len(b.mem) != p.size { // a small blob's own (getFor)
		b.free()
		return
	}
	p.mu.Lock()
	if len(p.idle) < bufKeepWriters*ioBuffers {
		p.idle = append(p.idle, b)
		gets := p.gets
		if p.timer == nil {
			p.timer = time.AfterFunc(p.idleTime, func() { p.trim(gets) })
		}
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	b.free()
}

// trim unmaps the idle buffers if no writer took one since the timer was
// set (gets is the count then); otherwise it looks again later.
func (p *ioBufPool) trim(gets uint64) {
	p.mu.Lock()
	if p.gets != gets {
		now := p.gets
		p.timer = time.AfterFunc(p.idleTime, func() { p.trim(now) })
		p.mu.Unlock()
		return
	}
	idle := p.idle
	p.idle, p.timer = nil, nil
	p.mu.Unlock()
	for _, b := range idle {
		b.free()
	}
}

// close unmaps the idle buffers and stops the timer (Store.Close).
func (p *ioBufPool) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	if p.timer != nil {
		p.timer.Stop()
		p.timer = nil
	}
	p.mu.Unlock()
	for _, b := range idle {
		b.free()
	}
}

// idleBuffers is how many buffers the pool keeps now (tests).
func (p *ioBufPool) idleBuffers() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}

func (b *ioBuf) free() {
	if b.mapped {
		unix.Munmap(b.mem)
	}
}

type ioBuf struct {
	mem    []byte // aligned: the pool's size, or a small blob's own (getFor)
	mapped bool   // mem is an anonymous mapping (mapBuffer)
	n      int
	pos    int64
}

// alignOffset is how far into raw the first ioAlign-aligned byte is.
func alignOffset(raw []byte) int { return alignUp(raw, ioAlign) }

// alignUp is how far into raw the first byte aligned to a (a power of
// two) is.
func alignUp(raw []byte, a int) int {
	off := int(uintptr(unsafe.Pointer(&raw[0])) & uintptr(a-1))
	if off != 0 {
		off = a - off
	}
	return off
}
