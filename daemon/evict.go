package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/capacity"
)

func (d *Daemon) evictAbsent(ctx context.Context, name string) {
	// say sets the artifact's message (and phase) under the lock, if it is
	// still desired absent: the desire may have changed meanwhile.
	say := func(phase api.Phase, msg string, log bool) {
		d.mu.Lock()
		defer d.mu.Unlock()
		st := d.arts[name]
		if ds, ok := d.desired()[name]; st == nil || !ok || ds.State != api.StateAbsent || st.message == msg {
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
	d.log.Info("evicted absent artifact", "artifact", name, "revisions", revs)
	d.metrics.evictions.WithLabelValues(capacity.ReasonAbsent).Add(float64(len(revs)))
	say(api.PhasePending, "absent", false)
	go d.gc(context.WithoutCancel(ctx))
}

func (d *Daemon) gc(ctx context.Context) {
	if rep, err := d.store.GC(ctx); err != nil {
		d.log.Warn("gc", "err", err)
	} else if rep.BlobsRemoved > 0 {
		d.log.Info("gc", "blobs_removed", rep.BlobsRemoved, "bytes_freed", rep.BytesFreed)
	}
}

func (d *Daemon) handleEvict(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	rev := r.URL.Query().Get("revision")
	force := r.URL.Query().Get("force") == "true"
	d.mu.Lock()
	if fd, ok := d.fileDesires[name]; ok && fd.State != api.StateAbsent && rev == "" {
		d.mu.Unlock()
		return api.Errorf(api.CodeConflict, "artifact %s is declared in %s; set state: absent there or remove the file", name, strings.TrimPrefix(fd.Origin, originFile))
	}
	_, hadDesire := d.apiDesires[name]
	_, noted := d.evicted[name] // an ad-hoc entry evicted for space: evicting it clears the note
	var kernels []string        // the kernel caches the model's desire lists go with it
	if rev == "" {
		for n, ds := range d.desired() {
			if ds.Serves == name {
				kernels = append(kernels, n)
			}
		}
	}
	d.mu.Unlock()
	// Every refusal comes before anything changes: a refused evict leaves
	// the desire and a pull in flight alone.
	if err := d.space.scan(); err != nil {
		d.log.Warn("in-use scan before evict", "err", err)
	}
	if hs := d.inUse(); true {
		var held []string
		for k, h := range hs {
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
	}
	if !force {
		if a, err := d.store.Summary(name); err == nil {
			for _, v := range a.Versions {
				if v.Pinned && (rev == "" || v.Revision == rev) {
					return fmt.Errorf("artifact %s@%s: %w; unpin it first (modelctl unpin %s) or evict with --force", name, v.Revision, cachestore.ErrPinned, name)
				}
			}
		}
	}
	// The desire goes and its pull is cancelled in one step, so that the
	// cancelled pull's end cannot start another one that commits after the
	// evict with no desire left.
	var inFlight chan struct{}
	if rev == "" {
		d.desireMu.Lock()
		if hadDesire {
			if err := d.store.DeleteDesire(name); err != nil { // an index write: outside the daemon lock
				d.desireMu.Unlock()
				return err
			}
		}
		d.mu.Lock()
		delete(d.apiDesires, name)
		delete(d.evicted, name)
		if st := d.arts[name]; st != nil && st.cancel != nil {
			st.cancel()
			inFlight = st.done
		}
		d.notify()
		d.mu.Unlock()
		d.desireMu.Unlock()
	}
	if inFlight != nil {
		// Let the cancelled pull finish, so it cannot commit after the evict.
		select {
		case <-inFlight:
		case <-r.Context().Done():
			return r.Context().Err()
		}
	}
	res := api.EvictResult{Name: name, Revisions: []string{}}
	revs, err := d.store.Evict(r.Context(), name, rev, force)
	switch {
	case errors.Is(err, cachestore.ErrNotFound) && (hadDesire || noted) && rev == "":
	case err != nil:
		return err
	default:
		res.Revisions = revs
		d.metrics.evictions.WithLabelValues(capacity.ReasonManual).Add(float64(len(revs)))
	}
	if rev == "" {
		d.mu.Lock()
		delete(d.arts, name)
		d.notify()
		d.mu.Unlock()
	}
	sort.Strings(kernels)
	for _, k := range kernels {
		revs, err := d.store.Evict(r.Context(), k, "", force)
		if err != nil && !errors.Is(err, cachestore.ErrNotFound) {
			d.log.Warn("evict a kernel cache of an evicted model", "artifact", k, "model", name, "err", err)
		}
		for _, rv := range revs {
			res.Revisions = append(res.Revisions, k+"@"+rv)
		}
		d.metrics.evictions.WithLabelValues(capacity.ReasonManual).Add(float64(len(revs)))
		d.mu.Lock()
		delete(d.arts, k)
		d.mu.Unlock()
	}
	gc, err := d.store.GC(r.Context())
	if err != nil {
		return err
	}
	res.GC = api.GCResult{BlobsRemoved: gc.BlobsRemoved, BytesFreed: gc.BytesFreed, BlobsKept: gc.BlobsKept}
	d.log.Info("evicted", "artifact", name, "revisions", res.Revisions, "bytes_freed", gc.BytesFreed)
	return writeJSON(w, res)
}

func (d *Daemon) handleGC(w http.ResponseWriter, r *http.Request) error {
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
func (d *Daemon) noteEvicted(vs []capacity.Victim) {
	d.mu.Lock()
	want := d.desired()
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
func (d *Daemon) dropAdHoc(v capacity.Victim, forName string) error {
	d.desireMu.Lock()
	defer d.desireMu.Unlock()
	d.mu.Lock()
	ds, ok := d.apiDesires[v.Name]
	d.mu.Unlock()
	if ok && declared(ds) {
		return fmt.Errorf("%s was declared meanwhile", v.Name)
	}
	if ok {
		if err := d.store.DeleteDesire(v.Name); err != nil { // an index write: outside the daemon lock
			return err
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.apiDesires, v.Name)
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
