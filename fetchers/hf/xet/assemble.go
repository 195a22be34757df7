package xet

import (
	"context"
	"fmt"
	"io"
	"sync"
)

// prepared is a window ready to emit: file bytes [start, end) at
// buf[skip:], buf holding its terms whole; reused says how many of its
// bytes the ChunkStore gave, placed where its terms sit in the file
// (fetched or held: a held term is remembered under the new file too,
// so it outlives the blob it came from).
type prepared struct {
	start, end int64
	buf        []byte
	skip       int64
	reused     int64
	placed     []Placed
	err        error
}

// target is one term a fetch fills: chunks [first, end) of xorb, decoded
// straight into dst, its place in the window's buffer, in chunk order.
type target struct {
	first, end uint32
	dst        []byte
	fill       int
	lens       []uint32
	fileOff    int64 // where dst sits in the file
}

// job is one ranged request: a signed URL and the ranges of it needed,
// each with the terms it fills.
type job struct {
	xorb    string
	url     string
	ranges  []RangeDescriptor
	targets [][]*target // per range
}

// prepare asks the reconstruction of file bytes [start, end) and
// assembles its terms in one buffer: held terms read from the
// ChunkStore, the others decoded from the CAS straight into their place.
func (o *Options) prepare(ctx context.Context, start, end int64, st *Stats, free chan []byte) prepared {
	p := prepared{start: start, end: end}
	tok, err := o.Tokens.Get(ctx)
	if err != nil {
		p.err = err
		return p
	}
	rec, err := GetReconstruction(ctx, o.Client, tok, o.FileID, uint64(start), uint64(end-1))
	if err != nil {
		p.err = err
		return p
	}
	// Lay the terms that hold [start, end) out from the first one's first
	// byte (download-protocol.md, "Stage 3": offset_into_first_range
	// skipped from the first, the whole cut at end-start bytes).
	skip, want := int64(rec.OffsetIntoFirstRange), end-start
	var terms []Term
	var offs []int64
	var at, base int64
	for _, t := range rec.Terms {
		if at >= skip+want {
			break
		}
		n := int64(t.UnpackedLength)
		if n > int64(t.Range.End-t.Range.Start)*MaxChunk {
			p.err = fmt.Errorf("%w: xorb %s chunks [%d, %d) said to hold %d bytes", ErrCorrupt, t.Hash, t.Range.Start, t.Range.End, n)
			return p
		}
		if at+n > skip {
			if terms == nil {
				base = at
			}
			terms = append(terms, t)
			offs = append(offs, at-base)
		}
		at += n
	}
	if at < skip+want {
		p.err = fmt.Errorf("%w: reconstruction of [%d, %d) holds %d bytes", ErrCorrupt, start, end, at-skip)
		return p
	}
	p.skip = skip - base
	// Room for the window and a chunk each side: the buffers go round.
	p.buf = takeBuf(free, int(at-base), int(o.Window)+2*MaxChunk)
	fileBase := start - p.skip
	need := map[string][]*target{}
	for i, t := range terms {
		n := int64(t.UnpackedLength)
		dst := p.buf[offs[i] : offs[i]+n]
		if lens, ok := o.held(ctx, t, dst); ok {
			p.reused += min(offs[i]+n, p.skip+want) - max(offs[i], p.skip)
			p.place(o.Size, Placed{Xorb: t.Hash, First: t.Range.Start, End: t.Range.End, Offset: fileBase + offs[i], ChunkLens: lens})
			continue
		}
		need[t.Hash] = append(need[t.Hash], &target{first: t.Range.Start, end: t.Range.End, dst: dst, fileOff: fileBase + offs[i]})
	}
	if p.err = o.fetchAll(ctx, rec, need, st); p.err != nil {
		return p
	}
	for x, ts := range need {
		for _, t := range ts {
			if t.fill != len(t.dst) {
				p.err = fmt.Errorf("%w: xorb %s chunks [%d, %d): %d bytes, the term says %d", ErrCorrupt, x, t.first, t.end, t.fill, len(t.dst))
				return p
			}
			p.place(o.Size, Placed{Xorb: x, First: t.first, End: t.end, Offset: t.fileOff, ChunkLens: t.lens})
		}
	}
	return p
}

// place keeps pl when it lies within the file (of size): a term cut at
// the window's edge is kept whole by the window that holds all of it.
func (p *prepared) place(size int64, pl Placed) {
	var n int64
	for _, l := range pl.ChunkLens {
		n += int64(l)
	}
	if pl.Offset >= 0 && pl.Offset+n <= size {
		p.placed = append(p.placed, pl)
	}
}

// takeBuf returns a buffer of n bytes: one this reader is done with,
// else one a finished reader left (windowBufs), when large enough (fresh
// pages for each window cost more: zeroing, page faults, collection),
// else a new one of capacity at least room.
func takeBuf(free chan []byte, n, room int) []byte {
	select {
	case b := <-free:
		if cap(b) >= n {
			return b[:n]
		}
	default:
	}
	if bp, ok := windowBufs.Get().(*[]byte); ok && cap(*bp) >= n {
		return (*bp)[:n]
	}
	return make([]byte, n, max(n, room))
}

// windowBufs keeps the window buffers of readers that finished for the
// next file's (a model is many files read one after the other); the
// runtime drops what stays unused for two collections.
var windowBufs sync.Pool

// recycle hands the buffers in free (read, so no one's) to windowBufs.
func recycle(free chan []byte) {
	for {
		select {
		case b := <-free:
			windowBufs.Put(&b)
		default:
			return
		}
	}
}

// held reads term t from the ChunkStore into dst (one open per term),
// and returns its chunks' lengths and whether it could: a store that
// does not hold it, gives other than len(dst) bytes, or lengths that do
// not add up to them, leaves the term to be fetched.
func (o *Options) held(ctx context.Context, t Term, dst []byte) ([]uint32, bool) {
	if o.Store == nil {
		return nil, false
	}
	r, lens, ok := o.Store.Chunks(ctx, t.Hash, t.Range.Start, t.Range.End)
	if !ok {
		return nil, false
	}
	defer r.Close()
	var sum int
	for _, l := range lens {
		if l == 0 || l > MaxChunk {
			return nil, false
		}
		sum += int(l)
	}
	if len(lens) != int(t.Range.End-t.Range.Start) || sum != len(dst) {
		return nil, false
	}
	if _, err := io.ReadFull(r, dst); err != nil {
		return nil, false
	}
	var one [1]byte
	n, _ := r.Read(one[:])
	return lens, n == 0
}

// fetchAll fills the targets of need from the fetches rec offers: each
// target from the first range that covers it, the ranges of one signed
// URL in one multi-range request, Conns requests at a time.
func (o *Options) fetchAll(ctx context.Context, rec *Reconstruction, need map[string][]*target, st *Stats) error {
	var jobs []job
	for x, ts := range need {
		left := append([]*target(nil), ts...)
		for _, f := range rec.Xorbs[x] {
			j := job{xorb: x, url: f.URL}
			for _, d := range f.Ranges {
				var mine []*target
				rest := left[:0]
				for _, t := range left {
					if d.Chunks.Start <= t.first && t.end <= d.Chunks.End {
						mine = append(mine, t)
					} else {
						rest = append(rest, t)
					}
				}
				left = rest
				if len(mine) > 0 {
					j.ranges = append(j.ranges, d)
					j.targets = append(j.targets, mine)
				}
			}
			if len(j.ranges) > 0 {
				jobs = append(jobs, j)
			}
		}
		if len(left) > 0 {
			return fmt.Errorf("%w: no fetch covers xorb %s chunks [%d, %d)", ErrUnsupported, x, left[0].first, left[0].end)
		}
	}
	var mu sync.Mutex
	var first error
	sem := make(chan struct{}, o.Conns)
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, j := range jobs {
		wg.Add(1)
		sem <- struct{}{}
		go func(j job) {
			defer func() { <-sem; wg.Done() }()
			if err := fetchRanges(ctx, o.Client, j, st); err != nil {
				mu.Lock()
				if first == nil {
					first = err
					cancel()
				}
				mu.Unlock()
			}
		}(j)
	}
	wg.Wait()
	return first
}
