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

	"github.com/prometheus/client_golang/prometheus"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/fetchers"
)

// flight is one download of one blob; pulls that want the same blob wait
// for it instead of fetching it again.
type flight struct {
	done    chan struct{}
	digest  string
	size    int64
	err     error
	waiters int // pulls waiting for it; under d.mu
}

// pull is one pull of one desire, from the slot it waits for to the
// commit. It carries what it pulls (the desire, its URI parsed once into
// src), how (the fetcher, the lease that keeps its blobs from GC, its
// share of the pull slots and the backoff that gives the slot up), and
// how far it got (prog, which views show). startPull makes one and runs
// it; finish (failure.go) records its outcome. The old version of the
// artifact stays current until commit.
type pull struct {
	d    *Daemon
	ds   api.Desire
	spec string    // fingerprint(ds)
	src  source    // ds.URI, parsed once
	st   *artState // the artifact's state (its fields under d.mu)
	prog *progress

	slot    *slot
	backoff fetchers.Backoff // fetchers' backoff; its sleeps give the slot up

	// Set as the pull goes.
	f       fetchers.Fetcher     // resolve
	res     *fetchers.Resolved   // resolve
	kc      *api.KernelCacheInfo // resolve, for a kernel cache
	lease   *cachestore.Lease    // holds what the pull wrote until commit
	fetched time.Time            // when the first byte was asked for
}

// source is a desire's URI parsed once: scheme picks the fetcher and
// labels the metrics; redacted is what is shown and stored; ref names it
// in the refs of its partial downloads.
type source struct {
	uri      string // as given; may carry credentials, never shown
	scheme   string
	redacted string
	ref      string
}

func parseSource(uri string) (source, error) {
	scheme, err := fetchers.Scheme(uri)
	if err != nil {
		return source{uri: uri, redacted: fetchers.RedactURI(uri)}, err
	}
	return source{uri: uri, scheme: scheme, redacted: fetchers.RedactURI(uri), ref: ingestSource(uri)}, nil
}

// startPull makes the pull of ds and runs it; called with d.mu held.
func (d *Daemon) startPull(ctx context.Context, ds api.Desire, st *artState, fp string) {
	pctx, cancel := context.WithCancel(ctx)
	st.cancel, st.spec, st.force, st.permanent = cancel, fp, false, false
	st.done = make(chan struct{})
	st.phase, st.message = api.PhasePending, "starting"
	st.prog = &progress{started: time.Now()}
	st.prog.total.Store(-1)
	p := &pull{d: d, ds: ds, spec: fp, st: st, prog: st.prog, slot: &slot{sem: d.pullSem}, backoff: d.backoff}
	// The phase says so only while every slot is really taken.
	var before struct {
		phase api.Phase
		msg   string
	}
	p.slot.waiting = func() {
		d.mu.Lock()
		before.phase, before.msg = st.phase, st.message
		d.mu.Unlock()
		p.setPhase(api.PhasePending, fmt.Sprintf("waiting for a pull slot: all %d are taken (--max-concurrent-pulls)", cap(d.pullSem)))
	}
	p.slot.waited = func() { p.setPhase(before.phase, before.msg) }
	p.backoff.Sleep = p.slot.sleeper(d.backoff.Sleep)
	src, srcErr := parseSource(ds.URI)
	p.src = src
	d.notify()
	d.pulls.Add(1)
	go func() {
		defer d.pulls.Done()
		defer cancel()
		err := srcErr
		if err == nil {
			err = p.run(pctx)
		}
		p.finish(ctx, pctx, err)
	}()
}

// run resolves the source, fetches the files the store lacks, and
// commits the version.
func (p *pull) run(ctx context.Context) error {
	// The pull takes a slot for as long as it transfers; its backoff and
	// its waits for other pulls' downloads give the slot up (slot.go).
	holding := true
	defer func() {
		if holding {
			p.slot.leave()
		}
	}()
	if err := p.slot.enter(ctx); err != nil {
		return err
	}
	p.setPhase(api.PhaseDownloading, "resolving "+p.ds.URI)
	t0 := time.Now()
	if err := p.resolve(ctx); err != nil {
		return err
	}
	p.stage("resolve", time.Since(t0))
	p.fetched = time.Now()
	files, err := p.files()
	if err != nil {
		return err
	}
	release, err := p.admit(ctx, files)
	if err != nil {
		return err
	}
	defer release()
	p.setPhase(api.PhaseDownloading, fmt.Sprintf("fetching %d files", len(files)))

	p.lease = p.d.store.NewLease()
	defer p.lease.Release()
	// Archive layers (OCI tar layers) are unpacked in order; the rest are files.
	var archives, plain []fetchers.File
	for _, fl := range files {
		if fl.Archive != nil {
			archives = append(archives, fl)
		} else {
			plain = append(plain, fl)
		}
	}
	unpacked, err := p.unpack(ctx, archives)
	if err != nil {
		return err
	}
	// The workers transfer under the pull's slot; this goroutine only
	// waits for them, and the commit after them needs none.
	holding = false
	entries, err := p.fetchAll(ctx, plain)
	if err != nil {
		return err
	}
	if len(archives) > 0 {
		if entries, err = p.merge(entries, unpacked); err != nil {
			return err
		}
	}
	return p.commit(ctx, entries)
}

// resolve picks the fetcher and resolves the source to an immutable
// revision and its files (retried with the backoff); a kernel cache's
// signature and GPU compatibility are checked here, before any layer is
// fetched.
func (p *pull) resolve(ctx context.Context) error {
	ds := p.ds
	if err := lostCredentials(ds); err != nil {
		return err
	}
	f, err := p.d.sources.fetcherFor(ds, p.src)
	if err != nil {
		return err
	}
	p.f = f
	kernel := ds.Kind == api.KindKernelCache
	src := fetchers.Source{URI: ds.URI, Include: ds.Include, Exclude: ds.Exclude, KernelCache: kernel, As: p.d.sources.readAs(ds)}
	err = p.backoff.Do(ctx, func(int) error {
		var err error
		p.res, err = f.Resolve(ctx, src)
		return err
	}, func(n int, err error, wait time.Duration) {
		p.d.log.Warn("resolve failed; retrying", "artifact", ds.Name, "attempt", n, "wait", wait, "err", err)
		p.setPhase(api.PhaseDownloading, fmt.Sprintf("resolving %s: attempt %d failed (%v); retrying in %s", p.src.redacted, n, redactedError{err}, wait.Round(time.Second)))
	})
	if err != nil {
		return fmt.Errorf("resolve %s: %w", ds.URI, err)
	}
	if ds.Revision != "" && p.res.Revision != ds.Revision {
		return fmt.Errorf("%w: revision %s, cluster has %s", errSourceChanged, p.res.Revision, ds.Revision)
	}
	if kernel {
		kc, err := p.kernelCacheBefore(ctx)
		p.d.mu.Lock()
		p.kc, p.st.kc = kc, kc
		p.d.mu.Unlock()
		return err
	}
	return nil
}

// files is what the pull fetches: the resolved files its include and
// exclude globs keep, each name checked; the totals go to the progress.
func (p *pull) files() ([]fetchers.File, error) {
	files, err := fetchers.Filter(p.res.Files, p.ds.Include, p.ds.Exclude)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.ds.URI, err)
	}
	var total int64
	for _, fl := range files {
		if err := cachestore.ValidatePath(fl.Path); err != nil {
			return nil, fmt.Errorf("%s: refusing a file name from the source: %w", p.ds.URI, err)
		}
		if fl.Size < 0 || total < 0 {
			total = -1
			continue
		}
		total += fl.Size
	}
	p.prog.filesTotal.Store(int32(len(files)))
	p.prog.total.Store(total)
	return files, nil
}

// admit asks admission (admission.go) for the space the pull needs: what
// the store lacks must fit in free space plus what eviction can free, and
// stays reserved while it downloads. (An archive counts by its layer
// size; compressed layers may unpack larger.) A file of unknown size may
// write what is usable beyond that when the pull is admitted (its
// budget), and no more.
func (p *pull) admit(ctx context.Context, files []fetchers.File) (release func(), err error) {
	var need int64
	unknown := false
	for _, fl := range files {
		if fl.Digest != "" && p.d.store.HasBlob(fl.Digest) {
			continue
		}
		need += max(fl.Size, 0)
		unknown = unknown || fl.Size < 0
	}
	return p.d.space.admit(ctx, p.ds.Name, need, unknown, p.prog)
}

// fetchAll fetches the plain files, FilesPerPull at a time, under the
// pull's slot (the caller hands its hold of the slot to the workers).
func (p *pull) fetchAll(ctx context.Context, files []fetchers.File) (cachestore.Manifest, error) {
	entries := make(cachestore.Manifest, len(files))
	work := make(chan int)
	errs := make(chan error, len(files))
	var wg sync.WaitGroup
	workers := min(p.d.cfg.FilesPerPull, len(files))
	p.slot.add(workers)
	p.slot.leave()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer p.slot.leave()
			for i := range work {
				fl := files[i]
				digest, size, err := p.fetchFile(ctx, fl, p.lease)
				if err != nil {
					errs <- fmt.Errorf("%s: %w", fl.Path, err)
					continue
				}
				entries[i] = cachestore.Entry{Path: fl.Path, Digest: digest, Size: size, Mode: fl.Mode, Etag: fl.Etag, Streamed: fl.Digest == ""}
				p.prog.filesDone.Add(1)
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
		return nil, err
	}
	return entries, ctx.Err()
}

// merge adds the archive members to the plain files: a raw file wins over
// a member of the same path; the include and exclude globs apply to
// members too.
func (p *pull) merge(entries cachestore.Manifest, unpacked map[string]cachestore.Entry) (cachestore.Manifest, error) {
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
	kept, err := fetchers.Filter(members, p.ds.Include, p.ds.Exclude)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", p.ds.URI, err)
	}
	for _, m := range kept {
		entries = append(entries, unpacked[m.Path])
	}
	return entries, nil
}

// commit makes the version visible in one index transaction (the store
// verifies and fsyncs first); a kernel cache's tree is checked before.
func (p *pull) commit(ctx context.Context, entries cachestore.Manifest) error {
	ds := p.ds
	spec := cachestore.VersionSpec{
		Name: ds.Name, Source: p.src.redacted, Revision: p.res.Revision, Manifest: entries,
		ExpectedDigest: ds.Digest, Pin: ds.Pin, Spec: p.spec, HFRepo: p.res.Repo, HFRef: hfRef(ds, p.res), Stage: ds.Stage,
	}
	if ds.Kind == api.KindKernelCache {
		if err := p.kernelCacheAfter(entries); err != nil {
			return err
		}
		spec.Kind = cachestore.KindKernelCache
		spec.Annotations, _ = json.Marshal(p.kc)
	}
	t0 := time.Now()
	_, err := p.d.store.CommitVersion(ctx, spec)
	if err == nil {
		p.stage("publish", time.Since(t0))
	}
	return clusterDigestError(ds, entries, err)
}

// stage records time spent in one stage of the pull
// (modelcache_pull_stage_seconds).
func (p *pull) stage(name string, d time.Duration) {
	p.d.metrics.pullStages.WithLabelValues(name).Observe(d.Seconds())
}

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

// setPhase shows where the pull is.
func (p *pull) setPhase(ph api.Phase, msg string) {
	p.d.mu.Lock()
	p.st.phase, p.st.message = ph, msg
	p.d.notify()
	p.d.mu.Unlock()
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

		fw.digest, fw.size, fw.err = p.download(ctx, ref, fl, lease, check)
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
func (p *pull) download(ctx context.Context, ref string, fl fetchers.File, lease *cachestore.Lease, check *layerCheck) (string, int64, error) {
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
		rc = fetchers.MinRate(rc, d.cfg.ProgressFloor, d.cfg.ProgressWindow)
		defer rc.Close()
		fetched.r = timedReader{rc, &readNs}
		var r io.Reader = fetched
		if fl.Size < 0 {
			r = budgetReader{r: r, p: prog}
		}
		r = fetchers.RateLimited(ctx, r, d.limiter)
		r = check.tee(r, w.Offset())
		_, err = w.ReadFrom(fetchers.CountingReader{R: r, N: &prog.done})
		fetched.flush()
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
		p.setPhase(api.PhaseDownloading, fmt.Sprintf("%s: attempt %d interrupted at byte %d (%v); resuming in %s", fl.Path, n, w.Offset(), redactedError{err}, wait.Round(time.Second)))
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
	before, t0 := w.Stages(), time.Now()
	digest, err := w.Commit(ctx, fl.Size, fl.Digest)
	commitTime := time.Since(t0)
	st := w.Stages()
	p.stage("read", time.Duration(readNs))
	p.stage("buffer_wait", st.Wait)
	p.stage("hash", st.Hash)
	p.stage("write", st.Write)
	p.stage("fsync", st.Sync)
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
	p.stage("commit", commitTime-(st.Sync-before.Sync)) // Commit's own fsync counts as fsync
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

// progress is how far a pull got: what views show, and what admission
// counts against its reservation.
type progress struct {
	done, skipped atomic.Int64
	total         atomic.Int64 // -1 while unknown
	filesDone     atomic.Int32
	filesTotal    atomic.Int32
	started       time.Time

	// budget is what admission allows the pull's files of unknown size
	// (set before any download starts); unknown is what they have written.
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
