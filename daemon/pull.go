package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/fetchers"
)

// flight is one download of one blob; pulls that want the same blob wait
// for it instead of fetching it again.
type flight struct {
	done   chan struct{}
	digest string
	size   int64
	err    error
}

// runPull resolves the desire, fetches the files the store lacks, and
// commits the version. The old version stays current until the commit.
func (d *Daemon) runPull(ctx context.Context, ds api.Desire, fp string, st *artState, prog *progress) error {
	// The pull takes a slot for as long as it transfers; its backoff and
	// its waits for other pulls' downloads give the slot up (slot.go).
	sl := prog.slot
	holding := true
	defer func() {
		if holding {
			sl.leave()
		}
	}()
	if err := sl.enter(ctx); err != nil {
		return err
	}
	d.setPhase(st, api.PhaseDownloading, "resolving "+ds.URI)
	if err := lostCredentials(ds); err != nil {
		return err
	}
	f, err := d.fetcherFor(ds)
	if err != nil {
		return err
	}
	scheme, _ := fetchers.Scheme(ds.URI)
	kernel := ds.Kind == api.KindKernelCache
	src := fetchers.Source{URI: ds.URI, Include: ds.Include, Exclude: ds.Exclude, KernelCache: kernel, As: identity(ds.Requester)}
	var res *fetchers.Resolved
	err = prog.backoff.Do(ctx, func(int) error {
		var err error
		res, err = f.Resolve(ctx, src)
		return err
	}, func(n int, err error, wait time.Duration) {
		d.log.Warn("resolve failed; retrying", "artifact", ds.Name, "attempt", n, "wait", wait, "err", err)
	})
	if err != nil {
		return fmt.Errorf("resolve %s: %w", ds.URI, err)
	}
	var kc *api.KernelCacheInfo
	if kernel {
		kc, err = d.kernelCacheBefore(ctx, ds, res, f)
		d.mu.Lock()
		st.kc = kc
		d.mu.Unlock()
		if err != nil {
			return err
		}
	}
	started := time.Now()
	files, err := fetchers.Filter(res.Files, ds.Include, ds.Exclude)
	if err != nil {
		return fmt.Errorf("%s: %w", ds.URI, err)
	}
	for _, fl := range files {
		if err := cachestore.ValidatePath(fl.Path); err != nil {
			return fmt.Errorf("%s: refusing a file name from the source: %w", ds.URI, err)
		}
	}
	prog.filesTotal.Store(int32(len(files)))
	var total int64
	for _, fl := range files {
		if fl.Size < 0 {
			total = -1
			break
		}
		total += fl.Size
	}
	prog.total.Store(total)
	// Admission: what the store lacks must fit in free space plus what
	// eviction can free, and stays reserved while it downloads. (An archive
	// counts by its layer size; compressed layers may unpack larger.)
	// A file of unknown size may write what is usable beyond that when the
	// pull is admitted (its budget), and no more.
	var need int64
	unknown := false
	for _, fl := range files {
		if fl.Digest != "" && d.store.HasBlob(fl.Digest) {
			continue
		}
		need += max(fl.Size, 0)
		unknown = unknown || fl.Size < 0
	}
	release, err := d.admit(ctx, ds.Name, need, unknown, prog)
	if err != nil {
		return err
	}
	defer release()
	d.setPhase(st, api.PhaseDownloading, fmt.Sprintf("fetching %d files", len(files)))

	lease := d.store.NewLease()
	defer lease.Release()
	// Archive layers (OCI tar layers) are unpacked in order; the rest are files.
	var archives, plain []fetchers.File
	for _, fl := range files {
		if fl.Archive != nil {
			archives = append(archives, fl)
		} else {
			plain = append(plain, fl)
		}
	}
	files = plain
	unpacked, err := d.unpack(ctx, f, scheme, archives, lease, prog)
	if err != nil {
		return err
	}
	entries := make(cachestore.Manifest, len(files))
	work := make(chan int)
	errs := make(chan error, len(files))
	var wg sync.WaitGroup
	// The workers transfer under the pull's slot; this goroutine only
	// waits for them, and the commit after them needs none.
	workers := min(d.cfg.FilesPerPull, len(files))
	sl.add(workers)
	holding = false
	sl.leave()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer sl.leave()
			for i := range work {
				fl := files[i]
				digest, size, err := d.fetchFile(ctx, f, scheme, ds.URI, fl, lease, prog)
				if err != nil {
					errs <- fmt.Errorf("%s: %w", fl.Path, err)
					continue
				}
				entries[i] = cachestore.Entry{Path: fl.Path, Digest: digest, Size: size, Mode: fl.Mode, Etag: fl.Etag}
				prog.filesDone.Add(1)
			}
		}()
	}
	for i := range files {
		if ctx.Err() != nil || len(errs) > 0 {
			break
		}
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	if err := errors.Join(collect(errs)...); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(archives) > 0 {
		// Raw files win over archive members of the same path; the include
		// and exclude globs apply to members too.
		have := map[string]bool{}
		for _, e := range entries {
			have[e.Path] = true
		}
		var members []fetchers.File
		for _, e := range unpacked {
			if !have[e.Path] {
				members = append(members, fetchers.File{Path: e.Path})
			}
		}
		kept, err := fetchers.Filter(members, ds.Include, ds.Exclude)
		if err != nil {
			return fmt.Errorf("%s: %w", ds.URI, err)
		}
		for _, m := range kept {
			entries = append(entries, unpacked[m.Path])
		}
	}
	spec := cachestore.VersionSpec{
		Name: ds.Name, Source: fetchers.RedactURI(ds.URI), Revision: res.Revision, Manifest: entries,
		ExpectedDigest: ds.Digest, Pin: ds.Pin, Spec: fp, HFRepo: res.Repo, HFRef: res.Ref,
	}
	if kernel {
		if err := d.kernelCacheAfter(kc, res, entries, started); err != nil {
			return err
		}
		spec.Kind = cachestore.KindKernelCache
		spec.Annotations, _ = json.Marshal(kc)
	}
	_, err = d.store.CommitVersion(ctx, spec)
	return err
}

func collect(c chan error) []error {
	var out []error
	for err := range c {
		out = append(out, err)
	}
	return out
}

func (d *Daemon) setPhase(st *artState, p api.Phase, msg string) {
	d.mu.Lock()
	st.phase, st.message = p, msg
	d.notify()
	d.mu.Unlock()
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
// digest and size. A known digest already present costs nothing; a blob
// another pull is fetching is waited for, not fetched twice.
func (d *Daemon) fetchFile(ctx context.Context, f fetchers.Fetcher, scheme, uri string, fl fetchers.File, lease *cachestore.Lease, prog *progress) (string, int64, error) {
	ref := "src:" + ingestSource(uri) + "#" + fl.Path
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
			d.mu.Unlock()
			err := prog.slot.wait(ctx, func() error { // not a transfer of this pull: the slot is free meanwhile
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

		fw.digest, fw.size, fw.err = d.download(ctx, f, scheme, ref, fl, lease, prog)
		d.mu.Lock()
		delete(d.flights, ref)
		d.mu.Unlock()
		close(fw.done)
		return fw.digest, fw.size, fw.err
	}
}

// download streams the file into an ingest, resuming from what is on disk
// and after each interrupted attempt, then commits it. When the source
// says it cannot continue from the offset (fetchers.ErrCannotResume: the
// file changed), the partial data is discarded and the file starts over
// from byte 0.
func (d *Daemon) download(ctx context.Context, f fetchers.Fetcher, scheme, ref string, fl fetchers.File, lease *cachestore.Lease, prog *progress) (string, int64, error) {
	opts := cachestore.WriterOpts{Ref: ref, Size: fl.Size, Lease: lease, Check: fl.Check, Owner: prog.owner}
	w, err := d.store.Writer(ctx, opts)
	if err != nil {
		return "", 0, err
	}
	resumed := w.Resumed()
	if resumed > 0 {
		prog.skipped.Add(resumed)
		d.log.Info("resuming download", "ref", ref, "offset", resumed)
	}
	start := time.Now()
	var fetched atomic.Int64
	err = prog.backoff.Do(ctx, func(int) error {
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
		rc = fetchers.MinRate(rc, d.cfg.ProgressFloor, d.cfg.ProgressWindow)
		defer rc.Close()
		var r io.Reader = fetchers.CountingReader{R: rc, N: &fetched}
		if fl.Size < 0 {
			r = budgetReader{r: r, p: prog}
		}
		r = fetchers.RateLimited(ctx, r, d.limiter)
		before := fetched.Load()
		_, err = w.ReadFrom(fetchers.CountingReader{R: r, N: &prog.done})
		d.metrics.fetchedBytes.WithLabelValues(scheme).Add(float64(fetched.Load() - before))
		switch {
		case errors.Is(err, cachestore.ErrSizeMismatch):
			return fetchers.Permanent(fmt.Errorf("the source sent more than the %d bytes it announced", fl.Size))
		case errors.Is(err, syscall.ENOSPC):
			return fetchers.Permanent(d.diskFull(err))
		case errors.As(err, new(*capacityError)):
			return fetchers.Permanent(err)
		case err != nil:
			return err
		case fl.Size >= 0 && w.Offset() < fl.Size:
			return fmt.Errorf("stream ended at byte %d of %d: %w", w.Offset(), fl.Size, io.ErrUnexpectedEOF)
		}
		return nil
	}, func(n int, err error, wait time.Duration) {
		d.metrics.fetchErrors.WithLabelValues(scheme).Inc()
		d.log.Warn("download interrupted; resuming", "ref", ref, "offset", w.Offset(), "attempt", n, "wait", wait.Round(time.Millisecond), "err", err)
	})
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
	digest, err := w.Commit(ctx, fl.Size, fl.Digest)
	if errors.Is(err, syscall.ENOSPC) {
		d.store.RemoveIngest(ref) // what the full disk refused is missing from it
		err = d.diskFull(err)
	}
	if err != nil {
		if errors.Is(err, cachestore.ErrDigestMismatch) {
			d.metrics.verifications.WithLabelValues("mismatch").Inc()
		}
		return "", 0, err
	}
	d.metrics.verifications.WithLabelValues("ok").Inc()
	d.metrics.fetchDuration.WithLabelValues(scheme).Observe(time.Since(start).Seconds())
	return digest, size, nil
}

// diskFull says what a full disk means for the operator.
func (d *Daemon) diskFull(err error) error {
	return fmt.Errorf("disk full under %s: %w; free space or evict artifacts (modelctl evict, modelctl gc)", d.store.Root(), err)
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

type progress struct {
	done, skipped atomic.Int64
	total         atomic.Int64 // -1 while unknown
	filesDone     atomic.Int32
	filesTotal    atomic.Int32
	started       time.Time

	// What the stages of the pull share besides the counts, set before it
	// starts: the artifact its partial downloads belong to, its share of
	// the pull slots, and the backoff that gives the slot up while it
	// waits. budget is what admission allows its files of unknown size
	// (set before any download starts); unknown is what they have written.
	owner   string
	slot    *slot
	backoff fetchers.Backoff
	budget  int64
	unknown atomic.Int64
}

func (p *progress) view() *api.Progress {
	if p == nil {
		return nil
	}
	v := &api.Progress{
		BytesDone: p.done.Load(), BytesSkipped: p.skipped.Load(), BytesTotal: p.total.Load(),
		FilesDone: int(p.filesDone.Load()), FilesTotal: int(p.filesTotal.Load()), Started: p.started,
	}
	if el := time.Since(p.started).Seconds(); el > 0 {
		v.BytesPerSecond = float64(v.BytesDone) / el
	}
	return v
}

// startPull launches a pull; called with d.mu held.
func (d *Daemon) startPull(ctx context.Context, ds api.Desire, st *artState, fp string) {
	pctx, cancel := context.WithCancel(ctx)
	st.cancel, st.spec, st.force, st.permanent = cancel, fp, false, false
	st.done = make(chan struct{})
	st.phase, st.message = api.PhasePending, "waiting for a pull slot"
	st.prog = &progress{started: time.Now(), owner: ds.Name, slot: &slot{sem: d.pullSem}, backoff: d.backoff}
	st.prog.backoff.Sleep = st.prog.slot.sleeper(d.backoff.Sleep)
	st.prog.total.Store(-1)
	prog := st.prog
	d.notify()
	d.pulls.Add(1)
	go func() {
		defer d.pulls.Done()
		defer cancel()
		err := d.runPull(pctx, ds, fp, st, prog)
		d.finishPull(ctx, pctx, ds, st, err)
	}()
}
