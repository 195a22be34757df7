package warm

import (
	"fmt"
	"os"
	"time"
)

// chunk is one read of a warm: a range of the plan's file number file.
type chunk struct {
	file     int
	off, len int64
}

// chunks merges the plan's adjacent ranges of one file and cuts them
// into reads of at most size bytes; files are numbered in plan order.
func chunks(items []Item, size int64) (files []string, out []chunk) {
	index := map[string]int{}
	var segs []chunk
	for _, it := range items {
		if it.Length <= 0 {
			continue
		}
		n, ok := index[it.File]
		if !ok {
			n = len(files)
			index[it.File] = n
			files = append(files, it.File)
		}
		if k := len(segs) - 1; k >= 0 && segs[k].file == n && segs[k].off+segs[k].len == it.Offset {
			segs[k].len += it.Length
			continue
		}
		segs = append(segs, chunk{file: n, off: it.Offset, len: it.Length})
	}
	for _, s := range segs {
		for at := int64(0); at < s.len; at += size {
			out = append(out, chunk{file: s.file, off: s.off + at, len: min(size, s.len-at)})
		}
	}
	return files, out
}

// openedFile is a file the warm reads, with its mapping for mincore.
type openedFile struct {
	f *os.File
	m *mapping
}

// cursor is one warm's walk over its chunks: the files it has open (each
// closed once the cursor passes its last chunk) and what of each chunk
// was resident when it was probed lookahead ahead.
type cursor struct {
	dirfd int
	root  string
	names []string
	cs    []chunk
	last  []int // the last chunk of each file
	open  map[int]*openedFile
	// probed[j] is what of chunk j was resident when it was probed
	// lookahead ahead (-1: not probed).
	probed       []int64
	probe, check int
}

func newCursor(dirfd int, root string, items []Item, chunk, lookahead int64) *cursor {
	names, cs := chunks(items, chunk)
	c := &cursor{dirfd: dirfd, root: root, names: names, cs: cs, last: make([]int, len(names)),
		open: map[int]*openedFile{}, probed: make([]int64, len(cs)), probe: int(lookahead / chunk)}
	c.check = c.probe / 2
	for i, x := range cs {
		c.last[x.file] = i
	}
	for j := range c.probed {
		c.probed[j] = -1
	}
	return c
}

// get opens file n (once) with its mapping.
func (c *cursor) get(n int) (*openedFile, error) {
	if o := c.open[n]; o != nil {
		return o, nil
	}
	f, size, err := openFile(c.dirfd, c.root, c.names[n])
	if err != nil {
		return nil, err
	}
	m, err := mapFile(f, size)
	if err != nil {
		f.Close()
		return nil, err
	}
	o := &openedFile{f: f, m: m}
	c.open[n] = o
	return o, nil
}

func (c *cursor) residentOf(x chunk) (int64, error) {
	o, err := c.get(x.file)
	if err != nil {
		return 0, err
	}
	return o.m.resident(x.off, x.len)
}

// passed closes the files whose last chunk is before chunk i.
func (c *cursor) passed(i int) {
	for n, o := range c.open {
		if c.last[n] < i {
			o.m.Close()
			o.f.Close()
			delete(c.open, n)
		}
	}
}

func (c *cursor) close() { c.passed(len(c.cs)) }

// overtaken probes the chunk lookahead ahead of i and checks the one
// half that distance ahead: more than half of it resident since its
// probe means someone else read it (the consumer is ahead).
func (c *cursor) overtaken(i int) (bool, error) {
	if j := i + c.probe; c.probe > 0 && j < len(c.cs) {
		res, err := c.residentOf(c.cs[j])
		if err != nil {
			return false, err
		}
		c.probed[j] = res
	}
	if j := i + c.check; c.check > 0 && j < len(c.cs) && c.probed[j] >= 0 {
		res, err := c.residentOf(c.cs[j])
		if err != nil {
			return false, err
		}
		if res-c.probed[j] > c.cs[j].len/2 {
			return true, nil
		}
	}
	return false, nil
}

// warm reads the plan's chunks in order into the page cache (pread into
// one reused buffer, the file's readahead off: see docs/benchmarks.md for
// why not readahead(2) or fadvise(WILLNEED)), skipping a chunk already
// resident. It yields while other processes do I/O on the device, and
// stops at the budget, at r.ctx's end, or when more than half of a chunk
// probed lookahead ahead has become resident by the time the cursor is
// half that distance from it or at it (someone else read it: the
// consumer is ahead).
func (r *Run) warm(dirfd int, root string, items []Item, budget int64) (Reason, error) {
	cfg := r.w.cfg
	cur := newCursor(dirfd, root, items, cfg.chunk, cfg.lookahead)
	defer cur.close()
	oth, ok := r.firstYield(dirfd)
	if !ok {
		return Cancelled, nil
	}
	mark := time.Now()
	buf := make([]byte, cfg.chunk)
	var warmed int64
	for i, c := range cur.cs {
		if cfg.onChunk != nil {
			cfg.onChunk(r, i)
		}
		if r.ctx.Err() != nil {
			return Cancelled, nil
		}
		cur.passed(i)
		if oth != nil && time.Since(mark) >= cfg.yieldWindow {
			if !r.yield(oth, time.Since(mark)) {
				return Cancelled, nil
			}
			mark = time.Now()
		}
		if over, err := cur.overtaken(i); over || err != nil {
			return Overtaken, err
		}
		res, err := cur.residentOf(c)
		if err != nil {
			return "", err
		}
		if cur.probed[i] >= 0 && res-cur.probed[i] > c.len/2 {
			return Overtaken, nil // read since its probe, and not by the warm
		}
		if res == c.len {
			r.resident.Add(res)
			cfg.metrics.add(0, res)
			continue
		}
		n, fresh, err := r.read(cur, c, buf, res, budget-warmed)
		if err != nil || n == 0 {
			return BudgetSpent, err
		}
		warmed += fresh
		if oth != nil {
			oth.ours += uint64(fresh)
		}
		if n < c.len {
			return BudgetSpent, nil
		}
	}
	return Done, nil
}

// firstYield looks at the device once before the first read: a pull
// already under way keeps the warm waiting from the start. It returns
// the device's counters (nil when the warm does not yield), and false
// when r.ctx ended while it waited.
func (r *Run) firstYield(dirfd int) (*others, bool) {
	cfg := r.w.cfg
	if cfg.yieldAbove <= 0 {
		return nil, true
	}
	dev := cfg.device(dirfd)
	if dev == nil {
		return nil, true
	}
	oth := &others{dev: dev}
	oth.since()
	if !r.sleep(cfg.yieldWindow) || !r.yield(oth, cfg.yieldWindow) {
		return nil, false
	}
	return oth, true
}

// read reads chunk c (res of it resident already) into the page cache,
// or what left of the budget allows of it; it returns the bytes read (0:
// the budget is spent) and those of them that were not resident, and
// counts them.
func (r *Run) read(cur *cursor, c chunk, buf []byte, res, left int64) (n, fresh int64, err error) {
	o := cur.open[c.file]
	n = c.len
	if c.len-res > left {
		n = left &^ (pageSize - 1)
		if n <= 0 {
			return 0, 0, nil
		}
		if res, err = o.m.resident(c.off, n); err != nil {
			return 0, 0, err
		}
	}
	if _, err := o.f.ReadAt(buf[:n], c.off); err != nil {
		return 0, 0, fmt.Errorf("warm: read %s in %s: %w", cur.names[c.file], cur.root, err)
	}
	r.warmed.Add(n - res)
	r.resident.Add(res)
	r.w.cfg.metrics.add(n-res, res)
	return n, n - res, nil
}
