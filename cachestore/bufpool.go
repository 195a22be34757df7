package cachestore

import (
	"sync"

	"golang.org/x/sys/unix"
)

// ioBufKeep is how many idle pipeline buffers stay mapped for the next
// writer (4 writers' worth: 8 MiB). A buffer beyond it is unmapped when
// it comes back, so the resident set is what the open writers hold plus
// at most this many.
const ioBufKeep = 4 * ioBuffers

// bufPool holds the writers' pipeline buffers. They are mapped outside
// the Go heap: page-aligned as O_DIRECT wants, never scanned or moved by
// the collector, and not counted in its heap goal (a heap of buffers
// would let the garbage around them grow as large). Kept buffers stay
// faulted in, so a new writer does not take a page fault per 4 KiB on the
// hot path as a freshly allocated buffer does.
var bufPool = &ioBufPool{}

type ioBufPool struct {
	mu   sync.Mutex
	idle []*ioBuf
}

// get returns a buffer of ioBufSize bytes; n is 0.
func (p *ioBufPool) get() *ioBuf {
	p.mu.Lock()
	if k := len(p.idle); k > 0 {
		b := p.idle[k-1]
		p.idle = p.idle[:k-1]
		p.mu.Unlock()
		return b
	}
	p.mu.Unlock()
	mem, err := unix.Mmap(-1, 0, ioBufSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		// No mapping to be had: the heap, aligned by hand.
		raw := make([]byte, ioBufSize+ioAlign)
		off := alignOffset(raw)
		return &ioBuf{mem: raw[off : off+ioBufSize]}
	}
	return &ioBuf{mem: mem, mapped: true}
}

// put takes a buffer back; it must not be used after.
func (p *ioBufPool) put(b *ioBuf) {
	b.n = 0
	p.mu.Lock()
	if len(p.idle) < ioBufKeep {
		p.idle = append(p.idle, b)
		p.mu.Unlock()
		return
	}
	p.mu.Unlock()
	if b.mapped {
		unix.Munmap(b.mem)
	}
}
