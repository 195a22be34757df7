package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/capacity"
	"github.com/modelcache/modelcache/daemon/sources"
)

// evictions is how artifacts leave: modelctl evict and gc, desires set
// absent, ad-hoc entries evicted for space. It changes the daemon's
// desires and artifact states (d) and the store; the passes that choose
// victims are space's.
type evictions struct {
	*shared            // the pull states and evictions noted, under mu
	desires *desireSet // its writers' lock, then mu
	log     *slog.Logger
	metrics *metrics
	store   *cachestore.Store
	space   *space
	warming *warming
	inUse   func() map[string][]api.Holder // takes mu
	kick    func()                         // asks the reconciler for a pass
}

// evictionsOf is the daemon's way out.
func evictionsOf(d *Daemon) evictions {
	return evictions{shared: &d.shared, desires: d.desires, log: d.log, metrics: d.metrics, store: d.store, space: d.space,
		warming: d.warming, inUse: d.inUse, kick: d.kick}
}

func (e evictions) evictAbsent(ctx context.Context, name string) {
	d := e
	// say sets the artifact's message (and phase) under the lock, if it is
	// still desired absent: the desire may have changed meanwhile.
	say := func(phase api.Phase, msg string, log bool) {
		d.mu.Lock()
		defer d.mu.Unlock()
		st := d.arts[name]
		if ds, ok := d.desires.merged()[name]; st == nil || !ok || ds.State != api.StateAbsent || st.message == msg {
			return
		}
		if phase != "" {
			st.phase = phase
		}
		st.message = msg
		if log {
			d.log.Warn("evict absent artifact", "artifact", name, "err", msg)
		}
		d.notify()
	}
	if _, err := d.store.Summary(name); errors.Is(err, cachestore.ErrNotFound) {
		say(api.PhasePending, "absent", false)
		return
	}
	// What a lease, a process or a pod holds stays until they let go
	// (reconcile scanned /proc for this pass's absent artifacts).
	if hs := holdersOf(d.inUse(), name); len(hs) > 0 {
		msg := fmt.Sprintf("desired absent; kept while in use by %s %s", hs[0].Kind, hs[0].ID)
		if len(hs) > 1 {
			msg += fmt.Sprintf(" and %d more", len(hs)-1)
		}
		say("", msg, false)
		return
	}
	revs, err := d.store.Evict(ctx, name, "", false)
	if err != nil {
		say("", fmt.Sprintf("desired absent but not evicted: %v", err), true)
		return
	}
	d.warming.evicted(name, revs...)
	d.log.Info("evicted absent artifact", "artifact", name, "revisions", revs)
	d.metrics.evictions.WithLabelValues(capacity.ReasonAbsent).Add(float64(len(revs)))
	say(api.PhasePending, "absent", false)
	go e.gc(context.WithoutCancel(ctx))
}

func (e evictions) gc(ctx context.Context) {
	d := e
	if rep, err := d.store.GC(ctx); err != nil {
		d.log.Warn("gc", "err", err)
	} else if rep.BlobsRemoved > 0 {
		d.log.Info("gc", "blobs_removed", rep.BlobsRemoved, "bytes_freed", rep.BytesFreed)
	}
}

// evictRequest is one modelctl evict: what it found before it changed
// anything.
type evictRequest struct {
	name, rev string
	force     bool
	hadDesire bool     // a socket desire names it
	noted     bool     // an ad-hoc entry evicted for space: evicting it clears the note
	kernels   []string // the kernel caches the model's desire lists go with it
}

// revisionByPrefix is the revision of name that rev names in full or as
// the unique prefix list and inspect show (12 characters); an error lists
// the revisions when none or several match.
func revisionByPrefix(store *cachestore.Store, name, rev string) (string, error) {
	a, err := store.Summary(name)
	if err != nil {
		return rev, nil // the evict says what is missing
	}
	var all, match []string
	for _, v := range a.Versions {
		all = append(all, v.Revision)
		if v.Revision == rev {
			return rev, nil
		}
		if strings.HasPrefix(v.Revision, rev) {
			match = append(match, v.Revision)
		}
	}
	switch {
	case len(match) == 1:
		return match[0], nil
	case len(match) > 1:
		return "", api.Errorf(api.CodeInvalid, "artifact %s: revision %q is the prefix of %d revisions (%s); give more of it", name, rev, len(match), strings.Join(match, ", "))
	}
	return "", api.Errorf(api.CodeNotFound, "artifact %s has no revision %q; its revisions are %s (a unique prefix will do)", name, rev, strings.Join(all, ", "))
}

func (e evictions) handleEvict(w http.ResponseWriter, r *http.Request) error {
	d := e
	q := evictRequest{name: r.PathValue("name"), rev: r.URL.Query().Get("revision"), force: r.URL.Query().Get("force") == "true"}
	if q.rev != "" {
		rev, err := revisionByPrefix(d.store, q.name, q.rev)
		if err != nil {
			return err
		}
		q.rev = rev
	}
	// Every refusal comes before anything changes: a refused evict leaves
	// the desire and a pull in flight alone.
	if err := e.refusal(&q); err != nil {
		return err
	}
	if q.rev == "" {
		if err := e.forget(r.Context(), q); err != nil {
			return err
		}
	}
	res := api.EvictResult{Name: q.name, Revisions: []string{}}
	revs, err := d.store.Evict(r.Context(), q.name, q.rev, q.force)
	switch {
	case errors.Is(err, cachestore.ErrNotFound) && (q.hadDesire || q.noted) && q.rev == "":
	case err != nil:
		return err
	default:
		res.Revisions = revs
		d.metrics.evictions.WithLabelValues(capacity.ReasonManual).Add(float64(len(revs)))
		d.warming.evicted(q.name, revs...)
	}
	if q.rev == "" {
		d.mu.Lock()
		delete(d.arts, q.name)
		d.notify()
		d.mu.Unlock()
	}
	res.Revisions = append(res.Revisions, e.evictKernels(r.Context(), q)...)
	gc, err := d.store.GC(r.Context())
	if err != nil {
		return err
	}
	res.GC = api.GCResult{BlobsRemoved: gc.BlobsRemoved, BytesFreed: gc.BytesFreed, BlobsKept: gc.BlobsKept}
	d.log.Info("evicted", "artifact", q.name, "revisions", res.Revisions, "bytes_freed", gc.BytesFreed)
	return writeJSON(w, res)
}

// refusal fills in q and says why the evict may not go ahead: a models.d
// file declares the artifact, something holds it, or (without --force)
// it is pinned.
func (e evictions) refusal(q *evictRequest) error {
	d := e
	name, rev := q.name, q.rev
	d.mu.Lock()
	if fd, ok := d.desires.file[name]; ok && fd.State != api.StateAbsent && rev == "" {
		d.mu.Unlock()
		return api.Errorf(api.CodeConflict, "artifact %s is declared in %s; set state: absent there or remove the file", name, strings.TrimPrefix(fd.Origin, sources.OriginFile))
	}
	_, q.hadDesire = d.desires.api[name]
	_, q.noted = d.evicted[name]
	if rev == "" {
		for n, ds := range d.desires.merged() {
			if ds.Serves == name {
				q.kernels = append(q.kernels, n)
			}
		}
	}
	d.mu.Unlock()
	if err := d.space.scan(); err != nil {
		d.log.Warn("in-use scan before evict", "err", err)
	}
	var held []string
	for k, h := range d.inUse() {
		if n, r := splitKey(k); n == name && (rev == "" || r == rev) {
			for _, x := range h {
				held = append(held, x.Kind+" "+x.ID+" on "+r)
			}
		}
	}
	if len(held) > 0 {
		sort.Strings(held)
		return api.Errorf(api.CodeInUse, "artifact %s is in use (%s); it cannot be evicted, even with --force, until they let go", name, strings.Join(held, ", "))
	}
	if q.force {
		return nil
	}
	if a, err := d.store.Summary(name); err == nil {
		for _, v := range a.Versions {
			if v.Pinned && (rev == "" || v.Revision == rev) {
				return fmt.Errorf("artifact %s@%s: %w; unpin it first (modelctl unpin %s) or evict with --force", name, v.Revision, cachestore.ErrPinned, name)
			}
		}
	}
	return nil
}

// forget drops the desire and cancels its pull in one step, so that the
// cancelled pull's end cannot start another one that commits after the
// evict with no desire left; then it waits for that pull to finish.
func (e evictions) forget(ctx context.Context, q evictRequest) error {
	d := e
	var inFlight chan struct{}
	d.desires.writeMu.Lock()
	if q.hadDesire {
		if err := d.desires.unpersist(q.name); err != nil { // an index write: outside the daemon lock
			d.desires.writeMu.Unlock()
			return err
		}
	}
	d.mu.Lock()
	delete(d.desires.api, q.name)
	d.desires.publish()
	delete(d.evicted, q.name)
	if st := d.arts[q.name]; st != nil && st.cancel != nil {
		st.cancel()
		inFlight = st.done
	}
	d.notify()
	d.mu.Unlock()
	d.desires.writeMu.Unlock()
	if inFlight == nil {
		return nil
	}
	select {
	case <-inFlight:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// evictKernels evicts the kernel caches that go with an evicted model and
// returns their name@revision.
func (e evictions) evictKernels(ctx context.Context, q evictRequest) []string {
	d := e
	var out []string
	sort.Strings(q.kernels)
	for _, k := range q.kernels {
		revs, err := d.store.Evict(ctx, k, "", q.force)
		if err != nil && !errors.Is(err, cachestore.ErrNotFound) {
			d.log.Warn("evict a kernel cache of an evicted model", "artifact", k, "model", q.name, "err", err)
		}
		for _, rv := range revs {
			out = append(out, k+"@"+rv)
		}
		d.warming.evicted(k, revs...)
		d.metrics.evictions.WithLabelValues(capacity.ReasonManual).Add(float64(len(revs)))
		d.mu.Lock()
		delete(d.arts, k)
		d.mu.Unlock()
	}
	return out
}

func (e evictions) handleGC(w http.ResponseWriter, r *http.Request) error {
	d := e
	gc := d.store.GC
	dry := r.URL.Query().Get("dryRun") == "true"
	if dry {
		gc = d.store.GCDryRun
	}
	rep, err := gc(r.Context())
	if err != nil {
		return err
	}
	return writeJSON(w, api.GCResult{BlobsRemoved: rep.BlobsRemoved, BytesFreed: rep.BytesFreed, BlobsKept: rep.BlobsKept, Removed: rep.Removed, DryRun: dry, IngestsRemoved: rep.IngestsRemoved, IngestBytesFreed: rep.IngestBytesFreed})
}

// noteEvicted tells the artifacts that a pass evicted for space why
// they are gone (an ad-hoc entry's note says why: dropAdHoc), and pulls
// declared ones again when there is room.
func (e evictions) noteEvicted(vs []capacity.Victim) {
	d := e
	d.mu.Lock()
	want := d.desires.merged()
	for _, v := range vs {
		if v.Reason != capacity.ReasonSpace || v.AdHoc {
			continue
		}
		if st := d.arts[v.Name]; st != nil {
			st.message = "evicted for disk space (" + v.Revision + "); pulled again when there is room"
		}
		if ds, ok := want[v.Name]; ok && declared(ds) {
			d.log.Warn("disk pressure evicted a declared artifact; it is pulled again when there is room", "artifact", v.Name, "revision", v.Revision, "bytes", v.Bytes)
		}
	}
	d.notify()
	d.mu.Unlock()
	d.kick()
}

// maxEvictionNotes bounds the notes kept of evicted ad-hoc entries (in
// memory only: a restart forgets them); the oldest go first.
const maxEvictionNotes = 1000

// dropAdHoc removes the desire of an ad-hoc entry about to be evicted
// for space (forName names the pull it makes room for, "" under
// pressure) and leaves a note in its place, shown by list and inspect
// until the name is pulled again or evicted by hand. An entry declared
// meanwhile (pinned, kept) stays. Called under evictMu.
func (e evictions) dropAdHoc(v capacity.Victim, forName string) error {
	d := e
	d.desires.writeMu.Lock()
	defer d.desires.writeMu.Unlock()
	d.mu.Lock()
	ds, ok := d.desires.api[v.Name]
	d.mu.Unlock()
	if ok && declared(ds) {
		return fmt.Errorf("%s was declared meanwhile", v.Name)
	}
	if ok {
		if err := d.desires.unpersist(v.Name); err != nil { // an index write: outside the daemon lock
			return err
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.desires.api, v.Name)
	d.desires.publish()
	if st := d.arts[v.Name]; st != nil && st.cancel != nil {
		st.cancel() // a refresh in flight goes with the entry
	}
	delete(d.arts, v.Name)
	if len(d.evicted) >= maxEvictionNotes {
		oldest := ""
		for n, note := range d.evicted {
			if oldest == "" || note.At.Before(d.evicted[oldest].At) {
				oldest = n
			}
		}
		delete(d.evicted, oldest)
	}
	d.evicted[v.Name] = api.EvictionNote{At: time.Now().UTC(), For: forName, Reason: v.Reason}
	d.notify()
	if forName != "" {
		d.log.Info("evicted an ad-hoc entry to make room", "artifact", v.Name, "revision", v.Revision, "for", forName, "bytes", v.Bytes)
	} else {
		d.log.Warn("disk pressure evicted an ad-hoc entry", "artifact", v.Name, "revision", v.Revision, "bytes", v.Bytes)
	}
	return nil
}
