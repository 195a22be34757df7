package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/fetchers"
)

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
	// reused names the files of digest-less sources (file://) whose
	// validator matched the current version's: their blobs are reused.
	reused map[string]bool
	// unchanged: the source is as the current Ready version holds it;
	// nothing is fetched or committed (reuse).
	unchanged bool
	evicted   []api.EvictedVersion // admission evicted these to make room
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
	if p.unchanged = p.reuse(files); p.unchanged {
		return nil // finish says so: Ready, nothing read, nothing committed
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
	f, err := p.d.sources.FetcherFor(ds, p.src.scheme)
	if err != nil {
		return err
	}
	p.f = f
	kernel := ds.Kind == api.KindKernelCache
	src := fetchers.Source{URI: ds.URI, Include: ds.Include, Exclude: ds.Exclude, KernelCache: kernel, As: p.d.sources.ReadAs(ds)}
	err = p.backoff.Do(ctx, func(int) error {
		var err error
		p.res, err = f.Resolve(ctx, src)
		return err
	}, func(n int, err error, wait time.Duration) {
		p.d.log.Warn("resolve failed; retrying", "artifact", ds.Name, "attempt", n, "wait", wait, "err", err)
		p.setPhase(api.PhaseDownloading, fmt.Sprintf("resolving %s: attempt %d failed (%v); retrying in %s", p.src.redacted, n, redactedError{err}, wait.Round(time.Second)))
	})
	if err != nil {
		if strings.Contains(err.Error(), ds.URI) || strings.Contains(err.Error(), p.src.redacted) {
			return fmt.Errorf("resolve: %w", err) // the fetcher named the source already
		}
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

// reuse finds the files the artifact's current Ready version already
// holds from this same source: a file without a digest (file://) whose
// validator (its inode, size and times) and size match the version's entry
// gets that entry's digest, so the pull neither counts nor reads it. It
// reports whether the pull is a no-op: the same desire, and every file
// (by digest) as the current version holds it.
func (p *pull) reuse(files []fetchers.File) bool {
	if p.ds.Kind == api.KindKernelCache || p.ds.Stage {
		return false
	}
	a, err := p.d.store.Get(p.ds.Name)
	if err != nil {
		return false
	}
	var cur *cachestore.Version
	for i := range a.Versions {
		if v := &a.Versions[i]; v.Revision == a.Current && v.State == cachestore.StateReady {
			cur = v
		}
	}
	if cur == nil || cur.Source != p.src.redacted {
		return false
	}
	byPath := make(map[string]cachestore.Entry, len(cur.Manifest))
	for _, e := range cur.Manifest {
		byPath[e.Path] = e
	}
	same := len(files) == len(cur.Manifest) && (p.res.Revision == "" || p.res.Revision == cur.Revision) && cur.Spec == p.spec
	for i, fl := range files {
		e, ok := byPath[fl.Path]
		if fl.Archive != nil || !ok || e.Size != fl.Size || !p.d.store.HasBlob(e.Digest) {
			same = false
			continue
		}
		if fl.Digest == "" && fl.Validator != "" && e.Validator == fl.Validator {
			files[i].Digest = e.Digest
			if p.reused == nil {
				p.reused = map[string]bool{}
			}
			p.reused[fl.Path] = true
		}
		if files[i].Digest != e.Digest || fl.Mode&0o777 != e.Mode&0o777 && fl.Mode != 0 {
			same = false
		}
	}
	if same {
		var n int64
		for _, fl := range files {
			n += fl.Size
		}
		p.prog.skipped.Add(n)
		p.prog.filesDone.Store(int32(len(files)))
	}
	return same
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
	release, evicted, err := p.d.space.admit(ctx, p.ds.Name, need, unknown, p.prog)
	for _, v := range evicted {
		p.evicted = append(p.evicted, api.EvictedVersion{Name: v.Name, Revision: v.Revision, Bytes: v.Bytes})
	}
	return release, err
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
				entries[i] = cachestore.Entry{Path: fl.Path, Digest: digest, Size: size, Mode: fl.Mode, Etag: fl.Etag, Streamed: fl.Digest == "" || p.reused[fl.Path], Peers: p.prog.peersOf(fl.Path), Validator: fl.Validator, Transport: p.prog.transportOf(fl.Path)}
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
		Private: private(ds),
	}
	if spec.Private {
		spec.HFRepo, spec.HFRef = "", "" // no world-readable hf/ view of a private repo (tenancy.go)
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
		// Its mode as the desire wants it now (its group may read it; a
		// desire that became private during the pull closes it).
		p.d.modes.of(ds.Name)
	}
	return clusterDigestError(ds, entries, err)
}

// stage records time spent in one stage of the pull
// (modelcache_pull_stage_seconds).
func (p *pull) stage(name string, d time.Duration) {
	p.d.metrics.pullStages.WithLabelValues(name).Observe(d.Seconds())
}

// setPhase shows where the pull is.
func (p *pull) setPhase(ph api.Phase, msg string) {
	p.d.mu.Lock()
	p.st.phase, p.st.message = ph, msg
	p.d.notify()
	p.d.mu.Unlock()
}

// hfRef is the ref the HF view names a hub revision by: the one asked
// for, or, for a commit the cluster pinned, the branch or tag it was
// resolved from (api.Desire.Ref).
func hfRef(ds api.Desire, res *fetchers.Resolved) string {
	if ds.Ref != "" && res.Ref == res.Revision {
		return ds.Ref
	}
	return res.Ref
}
