package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/fanout"
	"github.com/modelcache/modelcache/fetchers"
	p2p "github.com/modelcache/modelcache/peer"
)

// meterStep is how many bytes a download reads between two updates of
// modelcache_fetch_bytes_total: the counter moves while a large file
// downloads, not only when it ends.
const meterStep = 1 << 20

// meteredReader adds what it reads from r to c every meterStep bytes;
// flush adds the rest. One download's attempts read through it in turn.
type meteredReader struct {
	r       io.Reader
	c       prometheus.Counter
	pending int64
}

func (m *meteredReader) Read(b []byte) (int, error) {
	n, err := m.r.Read(b)
	if m.pending += int64(n); m.pending >= meterStep {
		m.flush()
	}
	return n, err
}

func (m *meteredReader) flush() {
	if m.pending > 0 {
		m.c.Add(float64(m.pending))
		m.pending = 0
	}
}

// timedReader sums the time spent inside Read: waiting on the source.
type timedReader struct {
	r  io.Reader
	ns *int64
}

func (t timedReader) Read(b []byte) (int, error) {
	t0 := time.Now()
	n, err := t.r.Read(b)
	*t.ns += int64(time.Since(t0))
	return n, err
}

func collect(c chan error) []error {
	var out []error
	for err := range c {
		out = append(out, err)
	}
	return out
}

// ingestSource names a source in an ingest's ref (written beside the
// partial data): the URI as given, or, where it carries credentials, the
// redacted URI and a hash of the whole, so the secret is never written.
func ingestSource(uri string) string {
	r := fetchers.RedactURI(uri)
	if r == uri {
		return uri
	}
	sum := sha256.Sum256([]byte(uri))
	return r + "~" + hex.EncodeToString(sum[:8])
}

// fetchFile makes sure the file's blob is in the store and returns its
// digest and size; lease holds it (the pull's, or an unpacked layer's
// own). A known digest already present costs nothing; a blob another
// pull is fetching is waited for, not fetched twice.
func (p *pull) fetchFile(ctx context.Context, fl fetchers.File, lease *cachestore.Lease) (string, int64, error) {
	return p.fetchFileTee(ctx, fl, lease, nil)
}

// fetchFileTee is fetchFile with the bytes this pull downloads fed to
// check as they arrive (unpack.go).
func (p *pull) fetchFileTee(ctx context.Context, fl fetchers.File, lease *cachestore.Lease, check *layerCheck) (string, int64, error) {
	d, prog := p.d, p.prog
	ref := "src:" + p.src.ref + "#" + fl.Path
	if fl.Validator != "" {
		// Partial data is of one version of the file: a later resolve that
		// sees another validator must not continue it.
		ref += "@" + fl.Validator
	}
	if fl.Digest != "" {
		lease.Hold(fl.Digest)
		if d.store.HasBlob(fl.Digest) && fl.Size >= 0 {
			prog.skipped.Add(fl.Size)
			return fl.Digest, fl.Size, nil
		}
		ref = "blob:" + fl.Digest
	}
	for {
		d.mu.Lock()
		if fw, ok := d.flights[ref]; ok {
			fw.waiters++
			d.mu.Unlock()
			err := p.slot.wait(ctx, func() error { // not a transfer of this pull: the slot is free meanwhile
				select {
				case <-fw.done:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			})
			if err != nil {
				return "", 0, err
			}
			if fw.err == nil {
				lease.Hold(fw.digest)
				if d.store.HasBlob(fw.digest) {
					prog.skipped.Add(fw.size)
					return fw.digest, fw.size, nil
				}
			}
			continue // the other download failed or its blob went: try ourselves
		}
		fw := &flight{done: make(chan struct{})}
		d.flights[ref] = fw
		d.mu.Unlock()

		if fl.Digest != "" && fl.Size >= 0 && d.store.HasBlob(fl.Digest) {
			// Another pull's flight committed the blob between this
			// pull's first look and now (a flight ends only after its
			// commit): take it, do not fetch it again.
			prog.skipped.Add(fl.Size)
			fw.digest, fw.size = fl.Digest, fl.Size
		} else {
			fw.digest, fw.size, fw.err = p.download(ctx, ref, fl, lease, check)
		}
		d.mu.Lock()
		delete(d.flights, ref)
		d.mu.Unlock()
		close(fw.done)
		return fw.digest, fw.size, fw.err
	}
}

// transportReporter is a source's reader of one file that says how the
// source sent it: the hf fetcher's, api.TransportXet or
// api.TransportResolve. The pull records it in the file's manifest entry
// (cachestore.Entry.Transport), which inspect shows.
type transportReporter interface{ Transport() string }

// commitListener is a source's reader of one file that wants to hear
// that a blob was committed from the bytes it gave, its digest checked:
// the hf fetcher's Xet reader, which then teaches the store's chunk
// index where the file's chunks sit (fetchers/hf/xet: Reader.Committed).
type commitListener interface{ Committed(digest string) }

// tellCommitted tells r, when it listens, that digest was committed.
func tellCommitted(r io.Reader, digest string) {
	if l, ok := r.(commitListener); ok {
		l.Committed(digest)
	}
}

// download streams the file into an ingest, resuming from what is on disk
// and after each interrupted attempt, then commits it. When the source
// says it cannot continue from the offset (fetchers.ErrCannotResume: the
// file changed), the partial data is discarded and the file starts over
// from byte 0.
func (p *pull) download(ctx context.Context, ref string, fl fetchers.File, lease *cachestore.Lease, check *layerCheck) (string, int64, error) {
	if p.viaPeers(fl) {
		return p.downloadFanout(ctx, ref, fl, lease, check)
	}
	d, f, scheme, prog := p.d, p.f, p.src.scheme, p.prog
	opts := cachestore.WriterOpts{Ref: ref, Size: fl.Size, Lease: lease, Check: fl.Check, Owner: p.ds.Name}
	w, err := d.store.Writer(ctx, opts)
	if err != nil {
		return "", 0, err
	}
	resumed := w.Resumed()
	if resumed > 0 {
		prog.skipped.Add(resumed)
		d.log.Info("resuming download", "ref", ref, "offset", resumed)
	}
	var last io.Reader // the source's reader of the last attempt
	start := time.Now()
	fetched := &meteredReader{c: d.metrics.fetchedBytes.WithLabelValues(scheme)}
	var readNs int64 // time inside the source's Read, over every attempt
	err = p.backoff.Do(ctx, func(int) error {
		rc, err := f.Open(ctx, fl, w.Offset())
		if errors.Is(err, fetchers.ErrCannotResume) && w.Offset() > 0 {
			d.log.Warn("source cannot continue the partial download; starting the file over", "ref", ref, "offset", w.Offset(), "err", err)
			w.Abort()
			prog.skipped.Add(-resumed)
			resumed = 0
			if w, err = d.store.Writer(ctx, opts); err != nil {
				w = nil
				return fetchers.Permanent(err)
			}
			rc, err = f.Open(ctx, fl, 0)
		}
		if err != nil {
			return err
		}
		last = rc
		if tr, ok := rc.(transportReporter); ok {
			defer func() { prog.setTransport(fl.Path, tr.Transport()) }() // once the stream has said all it will
		}
		rc = fetchers.MinRate(rc, d.cfg.ProgressFloor, d.cfg.ProgressWindow)
		defer rc.Close()
		fetched.r = rc
		_, err = w.ReadFrom(p.sinkReader(ctx, timedReader{fetched, &readNs}, fl, check, w.Offset()))
		fetched.flush()
		if err = p.sinkError(err, fl); err == nil && fl.Size >= 0 && w.Offset() < fl.Size {
			return fmt.Errorf("stream ended at byte %d of %d: %w", w.Offset(), fl.Size, io.ErrUnexpectedEOF)
		}
		return err
	}, p.retrying(ref, fl, func() int64 { return w.Offset() }))
	if err != nil {
		d.metrics.fetchErrors.WithLabelValues(scheme).Inc()
		switch {
		case w == nil: // a restart from byte 0 could not open a new ingest
		case fetchers.IsPermanent(err) && ctx.Err() == nil:
			w.Abort() // no later attempt can use it: a full disk, a spent budget, a source that broke its word
		default:
			w.Close() // keep the partial data for the next attempt
		}
		return "", 0, err
	}
	size := w.Offset()
	before, t0 := w.Stages(), time.Now()
	digest, err := w.Commit(ctx, fl.Size, fl.Digest)
	err = p.committed(ref, w, before, time.Since(t0), time.Duration(readNs), err)
	if err != nil {
		return "", 0, err
	}
	tellCommitted(last, digest)
	d.metrics.fetchDuration.WithLabelValues(scheme).Observe(time.Since(start).Seconds())
	return digest, size, nil
}

// sinkReader is r on its way into a file's ingest at offset: within the
// budget of files of unknown size, the node's bandwidth limit, fed to
// check, and counted as the pull's progress.
func (p *pull) sinkReader(ctx context.Context, r io.Reader, fl fetchers.File, check *layerCheck, offset int64) io.Reader {
	if fl.Size < 0 {
		r = budgetReader{r: r, p: p.prog}
	}
	r = fetchers.RateLimited(ctx, r, p.d.limiter)
	r = check.tee(r, offset)
	return fetchers.CountingReader{R: r, N: &p.prog.done}
}

// sinkError is how a failure of an ingest's ReadFrom fails the
// download: a source that sent more than it announced, a full disk or a
// spent budget stop it (no retry can help), anything else is retried.
func (p *pull) sinkError(err error, fl fetchers.File) error {
	switch {
	case errors.Is(err, cachestore.ErrSizeMismatch):
		return fetchers.Permanent(fmt.Errorf("the source sent more than the %d bytes it announced", fl.Size))
	case errors.Is(err, syscall.ENOSPC):
		return fetchers.Permanent(diskFull(p.d.store.Root(), err))
	case errors.As(err, new(*capacityError)):
		return fetchers.Permanent(err)
	}
	return err
}

// retrying is the backoff's report of an interrupted attempt of one
// file's download; offset says how far it got.
func (p *pull) retrying(ref string, fl fetchers.File, offset func() int64) func(int, error, time.Duration) {
	return func(n int, err error, wait time.Duration) {
		p.d.metrics.fetchErrors.WithLabelValues(p.src.scheme).Inc()
		p.d.log.Warn("download interrupted; resuming", "ref", ref, "offset", offset(), "attempt", n, "wait", wait.Round(time.Millisecond), "err", err)
		p.setPhase(api.PhaseDownloading, fmt.Sprintf("%s: attempt %d interrupted at byte %d (%v); resuming in %s", fl.Path, n, offset(), redactedError{err}, wait.Round(time.Second)))
	}
}

// committed records the commit of w (its stages, the time reading the
// source, the verification) and says what its error means: a full disk
// drops the partial blob it refused.
func (p *pull) committed(ref string, w *cachestore.Writer, before cachestore.Stages, commitTime, read time.Duration, err error) error {
	d := p.d
	st := w.Stages()
	p.stage("read", read)
	p.stage("buffer_wait", st.Wait)
	p.stage("hash", st.Hash)
	p.stage("write", st.Write)
	p.stage("fsync", st.Sync)
	if errors.Is(err, syscall.ENOSPC) {
		d.store.RemoveIngest(ref) // what the full disk refused is missing from it
		err = diskFull(d.store.Root(), err)
	}
	if err != nil {
		if errors.Is(err, cachestore.ErrDigestMismatch) {
			d.metrics.verifications.WithLabelValues("mismatch").Inc()
		}
		return err
	}
	d.metrics.verifications.WithLabelValues("ok").Inc()
	p.stage("commit", commitTime-(st.Sync-before.Sync)) // Commit's own fsync counts as fsync
	return nil
}

// diskFull says what a full disk under root means for the operator.
func diskFull(root string, err error) error {
	return fmt.Errorf("disk full under %s: %w; free space or evict artifacts (modelctl evict, modelctl gc)", root, err)
}

// budgetReader stops the files of unknown size of one pull at the budget
// admission gave them, together.
type budgetReader struct {
	r io.Reader
	p *progress
}

func (b budgetReader) Read(p []byte) (int, error) {
	if left := b.p.budget - b.p.unknown.Load(); int64(len(p)) > left+1 {
		p = p[:max(left+1, 1)] // one byte past the budget tells an overrun from an exact fit
	}
	n, err := b.r.Read(p)
	if total := b.p.unknown.Add(int64(n)); total > b.p.budget {
		over := min(total-b.p.budget, int64(n))
		b.p.unknown.Add(-over)
		return n - int(over), &capacityError{fmt.Sprintf("%s: the source sent more than the %s this pull was admitted for (its size was not announced; the budget is what the capacity policy left usable when the pull started); the partial download was removed",
			api.ReasonInsufficientCapacity, api.FormatBytes(b.p.budget))}
	}
	return n, err
}

// fromPeers records where the bytes of one fetch of file path came from.
func (p *pull) fromPeers(path string, res p2p.Result) {
	peers := res.Peers()
	if len(peers) == 0 {
		return
	}
	var n int64
	for _, s := range res.Spans {
		if s.Source != p2p.SourceOrigin {
			n += s.Bytes
		}
	}
	p.prog.fromPeers.Add(n)
	p.prog.peerMu.Lock()
	defer p.prog.peerMu.Unlock()
	if p.prog.peerFiles == nil {
		p.prog.peerFiles = map[string][]string{}
	}
	for _, pe := range peers {
		if !slices.Contains(p.prog.peerFiles[path], pe) && len(p.prog.peerFiles[path]) < fanout.MaxPeersAsked {
			p.prog.peerFiles[path] = append(p.prog.peerFiles[path], pe)
		}
	}
}
