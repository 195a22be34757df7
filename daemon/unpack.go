package daemon

import (
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/fetchers"
)

// member is an archive member written and waiting for its commit: idx is
// its position in the layer (a later entry of the same path wins).
type member struct {
	w   *cachestore.Writer
	e   fetchers.TarEntry
	idx int
}

// Members up to smallMember bytes commit in batches of at most maxBatch
// members or maxBatchBytes bytes.
const (
	smallMember   = 256 << 10
	maxBatch      = 512
	maxBatchBytes = 32 << 20
)

// layerRefPrefix starts the ingest refs of archive members; they are
// never resumed (a layer is unpacked from its start every attempt).
const layerRefPrefix = "layer:"

// unpack unpacks each archive layer in order (unpackLayer). Later layers
// override earlier ones; whiteouts delete. Members are blobs held by the
// pull's lease; if the pull fails they stay unreferenced (GC takes them):
// nothing becomes visible.
func (p *pull) unpack(ctx context.Context, archives []fetchers.File) (map[string]cachestore.Entry, error) {
	merged := map[string]cachestore.Entry{}
	for _, fl := range archives {
		layer, err := p.unpackLayer(ctx, fl, merged)
		if err != nil {
			return nil, err
		}
		maps.Copy(merged, layer)
		p.prog.filesDone.Add(1)
	}
	return merged, nil
}

// unpackLayer fetches one layer whole into the store first, as any file
// (resumable, its digest verified before a byte of it is unpacked), then
// reads it to ingest every member. Before that, fetchers.Untar (the
// hardened reader) reads it once with nothing written, so that the
// archive's limits (entries, sizes) and its hostile entries refuse the
// layer before any per-entry work: for a compressed layer, on the bytes
// of the download as they arrive (layerCheck), else, or when that did not
// see the whole download, from the blob. A layer refused so is a permanent failure. The
// layer's own blob goes when it is unpacked (or refused), unless
// something else uses it. merged holds the lower layers' files; the
// result is this layer's.
func (p *pull) unpackLayer(ctx context.Context, fl fetchers.File, merged map[string]cachestore.Entry) (map[string]cachestore.Entry, error) {
	d, lease := p.d, p.lease
	held := d.store.NewLease()
	defer func() {
		held.Release()
		if _, err := d.store.GCBlobs(context.WithoutCancel(ctx), fl.Digest); err != nil {
			d.log.Warn("remove an unpacked layer", "digest", fl.Digest, "err", err)
		}
	}()
	lower := func(p string) bool { _, ok := merged[p]; return ok }
	lim := fetchers.TarLimits{Subtree: fl.Archive.Subtree, Exists: lower}
	whole := fl
	whole.Archive = nil
	check := startLayerCheck(fl.Archive.MediaType, lim)
	dg, size, err := p.fetchFileTee(ctx, whole, held, check)
	t0 := time.Now() // archive_check: what of the check is left after the download
	checked, checkErr := check.finish(size, err == nil)
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", fl.Digest, err)
	}
	refuse := func(err error) error {
		switch {
		case errors.Is(err, fetchers.ErrHostileArchive):
			return fetchers.Permanent(fmt.Errorf("layer %s: %w", fl.Digest, err))
		case errors.Is(err, syscall.ENOSPC):
			return fetchers.Permanent(diskFull(d.store.Root(), err))
		}
		return err
	}
	if checked {
		err = checkErr
	} else {
		if d.cfg.Hook != nil {
			d.cfg.Hook("layer.check-from-blob")
		}
		err = readLayer(d.store, dg, fl.Archive.MediaType, func(body io.Reader) error { return checkArchive(ctx, body, lim) })
	}
	if err != nil {
		return nil, refuse(err)
	}
	p.stage("archive_check", time.Since(t0))
	t0 = time.Now()
	defer func() { p.stage("unpack", time.Since(t0)) }()
	u := &unpacker{st: d.store, ctx: ctx, lease: lease, layer: fl.Digest, lower: merged,
		entries: map[string]cachestore.Entry{}, seq: map[string]int{}, sem: make(chan struct{}, 4)}
	err = readLayer(d.store, dg, fl.Archive.MediaType, func(body io.Reader) error {
		return fetchers.Untar(body, lim, u.member, u.whiteout)
	})
	if err = u.finish(err); err != nil {
		return nil, refuse(err)
	}
	return u.entries, nil
}

// unpacker commits the members of one layer as they stream in order;
// each one's fsync and commit runs beside the next one's decompression (a
// few at a time). A later entry of the same path wins by its position,
// not by when its commit ends; links wait for every commit before them.
// Small members commit in batches (one syncfs and one index transaction
// each), not one fsync at a time.
type unpacker struct {
	st    cachestore.Ingester
	ctx   context.Context
	lease *cachestore.Lease
	layer string                      // the layer's digest
	lower map[string]cachestore.Entry // the layers below, as merged so far

	mu      sync.Mutex // guards entries, seq and err against the commits
	entries map[string]cachestore.Entry
	seq     map[string]int
	err     error

	pending    sync.WaitGroup
	sem        chan struct{}
	n          int
	batch      []member
	batchBytes int64
}

// set records a committed member unless a later entry of its path won.
// Called with u.mu held.
func (u *unpacker) set(m member, dg string) {
	if u.seq[m.e.Path] <= m.idx {
		u.seq[m.e.Path] = m.idx
		u.entries[m.e.Path] = cachestore.Entry{Path: m.e.Path, Digest: dg, Size: m.e.Size, Mode: m.e.Mode}
	}
}

// done records the end of one commit (a batch or a large member).
func (u *unpacker) done(err error, ms []member, dgs []string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if err != nil {
		if u.err == nil {
			u.err = err
		}
		return
	}
	for i, m := range ms {
		u.set(m, dgs[i])
	}
}

// async runs a commit beside the stream, a few at a time.
func (u *unpacker) async(commit func()) {
	u.sem <- struct{}{}
	u.pending.Add(1)
	go func() {
		defer u.pending.Done()
		defer func() { <-u.sem }()
		commit()
	}()
}

// flush commits the batch of small members gathered so far.
func (u *unpacker) flush() {
	if len(u.batch) == 0 {
		return
	}
	b := u.batch
	u.batch, u.batchBytes = nil, 0
	u.async(func() {
		ws, sizes := make([]*cachestore.Writer, len(b)), make([]int64, len(b))
		for i, m := range b {
			ws[i], sizes[i] = m.w, m.e.Size
		}
		dgs, err := u.st.CommitBatch(u.ctx, ws, sizes)
		u.done(err, b, dgs)
	})
}

// member writes one tar entry: a link to an entry before it, or a file.
func (u *unpacker) member(e fetchers.TarEntry, r io.Reader) error {
	u.n++
	if e.Link != "" {
		return u.link(e)
	}
	if err := cachestore.ValidatePath(e.Path); err != nil {
		return fmt.Errorf("%w: %v", fetchers.ErrHostileArchive, err)
	}
	ref := layerRefPrefix + u.layer + ":" + e.Path
	w, err := u.st.Writer(u.ctx, cachestore.WriterOpts{Ref: ref, Size: e.Size, Lease: u.lease})
	if err == nil && w.Resumed() > 0 { // left by an earlier attempt: members start over
		w.Abort()
		w, err = u.st.Writer(u.ctx, cachestore.WriterOpts{Ref: ref, Size: e.Size, Lease: u.lease})
	}
	if err != nil {
		return err
	}
	if _, err := w.ReadFrom(r); err != nil {
		w.Abort()
		return err
	}
	m := member{w: w, e: e, idx: u.n}
	if e.Size <= smallMember {
		u.batch = append(u.batch, m)
		if u.batchBytes += e.Size; len(u.batch) >= maxBatch || u.batchBytes >= maxBatchBytes {
			u.flush()
		}
	} else {
		u.async(func() {
			dg, err := w.Commit(u.ctx, m.e.Size, "")
			u.done(err, []member{m}, []string{dg})
		})
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.err
}

// link records a hard link once every commit before it has ended.
func (u *unpacker) link(e fetchers.TarEntry) error {
	u.flush()
	u.pending.Wait()
	if u.err != nil {
		return u.err
	}
	src, ok := u.entries[e.Link]
	if !ok {
		src, ok = u.lower[e.Link]
	}
	if !ok {
		return fmt.Errorf("%w %q: link target %q was removed", fetchers.ErrHostileArchive, e.Path, e.Link)
	}
	u.seq[e.Path] = u.n
	u.entries[e.Path] = cachestore.Entry{Path: e.Path, Digest: src.Digest, Size: src.Size, Mode: src.Mode}
	return nil
}

// whiteout hides p and what is under it in the lower layers; an opaque
// one hides everything under the directory p.
func (u *unpacker) whiteout(p string, opaque bool) error {
	for k := range u.lower {
		if p == "." || strings.HasPrefix(k, p+"/") || (!opaque && k == p) {
			delete(u.lower, k)
		}
	}
	return nil
}

// finish commits what is left (or, after err, aborts the batch never
// committed: its partial data goes), waits for every commit, and returns
// the first error.
func (u *unpacker) finish(err error) error {
	if err == nil {
		u.flush()
	} else {
		for _, m := range u.batch {
			m.w.Abort()
		}
		u.batch = nil
	}
	u.pending.Wait()
	if err == nil {
		err = u.err
	}
	return err
}

// readLayer hands fn the uncompressed stream of the layer blob dg. An
// uncompressed layer is the blob's file itself, so the tar reader skips
// member bodies by seeking.
func readLayer(st cachestore.Provider, dg, mediaType string, fn func(io.Reader) error) error {
	fh, err := st.OpenBlob(dg)
	if err != nil {
		return err
	}
	defer fh.Close()
	// The blob was just written with O_DIRECT, so it is read from the disk:
	// sequential, in 1 MiB reads (the decompressors' own buffers are 4 KiB
	// to 64 KiB: many small reads of a cold file), with the next 32 MiB
	// asked for ahead (readAhead). An uncompressed layer is read as the
	// file itself, so the tar reader seeks past member bodies in the check
	// pass; its unpack has the kernel's own read-ahead only (the bench's
	// layers are compressed: an uncompressed one is not measured).
	unix.Fadvise(int(fh.Fd()), 0, 0, unix.FADV_SEQUENTIAL)
	var src io.Reader = fh
	if compression(mediaType) != "" {
		src = bufio.NewReaderSize(&readAhead{f: fh}, 1<<20)
	}
	body, closeBody, err := decompress(src, mediaType)
	if err != nil {
		return fetchers.Permanent(fmt.Errorf("layer %s: %w", dg, err))
	}
	defer closeBody()
	return fn(body)
}

// compression is a layer media type's compression: gzip, zstd or "".
func compression(mediaType string) string {
	switch {
	case strings.HasSuffix(mediaType, "+gzip") || strings.HasSuffix(mediaType, ".gzip") || strings.HasSuffix(mediaType, "tar.gzip"):
		return "gzip"
	case strings.HasSuffix(mediaType, "+zstd") || strings.HasSuffix(mediaType, ".zstd"):
		return "zstd"
	}
	return ""
}

// decompress reads a layer by its media type's compression suffix.
func decompress(r io.Reader, mediaType string) (io.Reader, func(), error) {
	switch compression(mediaType) {
	case "gzip":
		z, err := gzip.NewReader(r)
		if err != nil {
			return nil, nil, err
		}
		return z, func() { z.Close() }, nil
	case "zstd":
		z, err := zstd.NewReader(r)
		if err != nil {
			return nil, nil, err
		}
		return z, z.Close, nil
	}
	return r, func() {}, nil
}

// checkArchive reads an archive through fetchers.Untar with nothing
// written: its verdict on the archive's limits and hostile entries.
func checkArchive(ctx context.Context, body io.Reader, lim fetchers.TarLimits) error {
	return fetchers.Untar(body, lim, func(fetchers.TarEntry, io.Reader) error { return ctx.Err() }, func(string, bool) error { return nil })
}

// layerCheck runs checkArchive on the bytes of a layer's download as they
// arrive, on its own goroutine, so that the check is done when the
// download is: for a compressed layer, one read and decompression of the
// whole layer fewer (docs/benchmarks.md, kernel cache). Its verdict counts
// only when it saw the very bytes whose digest the download then
// verified: the file from byte 0 in one continuous stream (no resumed
// ingest, no attempt that restarted at another offset, not another pull's
// download of the same blob); otherwise the check reads the blob.
type layerCheck struct {
	pw     *io.PipeWriter
	pos    int64 // bytes of the download that went through tee
	broken bool  // an attempt started where the stream did not end
	used   bool
	done   chan error
}

// errCheckEnded closes the pipe under a check that has its verdict: the
// download goes on without feeding it.
var errCheckEnded = errors.New("archive check ended")

// startLayerCheck starts the check of a layer of mediaType; nil (no check
// alongside) for an uncompressed layer, whose check from the blob seeks
// over member bodies and costs little.
func startLayerCheck(mediaType string, lim fetchers.TarLimits) *layerCheck {
	if compression(mediaType) == "" {
		return nil
	}
	pr, pw := io.Pipe()
	c := &layerCheck{pw: pw, done: make(chan error, 1)}
	go func() {
		body, closeBody, err := decompress(pr, mediaType)
		if err == nil {
			err = checkArchive(context.Background(), body, lim)
			closeBody()
		}
		pr.CloseWithError(errCheckEnded) // later writes fail at once: the download never waits on it
		c.done <- err
	}()
	return c
}

// tee returns r feeding the check, for an attempt that reads the file
// from offset; r itself when the check cannot use this attempt.
func (c *layerCheck) tee(r io.Reader, offset int64) io.Reader {
	if c == nil || c.broken {
		return r
	}
	if offset != c.pos {
		c.broken = true
		c.pw.CloseWithError(errCheckEnded)
		return r
	}
	c.used = true
	return &checkTee{r: r, c: c}
}

type checkTee struct {
	r       io.Reader
	c       *layerCheck
	stopped bool
}

func (t *checkTee) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if n > 0 {
		if !t.stopped {
			if _, werr := t.c.pw.Write(p[:n]); werr != nil {
				t.stopped = true // the check has its verdict
			}
		}
		t.c.pos += int64(n)
	}
	return n, err
}

// finish ends the check of a download that committed size bytes (ok) or
// failed, and says whether its verdict err is the blob's.
func (c *layerCheck) finish(size int64, ok bool) (checked bool, err error) {
	if c == nil {
		return false, nil
	}
	c.pw.Close() // the end of the stream, where the check has not ended
	err = <-c.done
	return ok && c.used && !c.broken && c.pos == size, err
}

// readAhead keeps the next aheadWindow bytes of a file read sequentially
// asked of the disk (FADV_WILLNEED), so that the disk reads the blob
// while the unpack writes members. The kernel's own read-ahead starts
// small and waits for the reader; the kernel caps one WILLNEED at the
// device's read-ahead or I/O size (as little as 128 KiB), so the window
// is asked for in aheadChunk pieces, a few syscalls per MiB read.
type readAhead struct {
	f        *os.File
	pos, req int64 // read up to pos; asked for up to req
}

const (
	aheadWindow = 32 << 20
	aheadChunk  = 128 << 10
)

func (r *readAhead) Read(p []byte) (int, error) {
	for r.req < r.pos+aheadWindow {
		unix.Fadvise(int(r.f.Fd()), r.req, aheadChunk, unix.FADV_WILLNEED)
		r.req += aheadChunk
	}
	n, err := r.f.Read(p)
	r.pos += int64(n)
	return n, err
}
