package daemon

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/kernels"
	"github.com/modelcache/modelcache/daemon/sources"
)

// views are the read side of the daemon (list, inspect, status, usage
// and the streams of them): they join the desires, the artifacts' states,
// the store's records and what is in use, and change nothing.
type views struct {
	*shared              // the pull states, pods and evictions noted, under mu
	desires   *desireSet // read under mu
	cfg       Config
	log       *slog.Logger
	store     *cachestore.Store
	space     *space
	warming   *warming
	started   time.Time
	inUse     func() map[string][]api.Holder // takes mu
	mayMutate func(*http.Request) bool
}

// viewsOf is the daemon's read side.
func viewsOf(d *Daemon) views {
	return views{shared: &d.shared, desires: d.desires, cfg: d.cfg, log: d.log, store: d.store, space: d.space,
		warming: d.warming, started: d.started, inUse: d.inUse, mayMutate: d.mayMutate}
}

func (vw views) handleStatus(w http.ResponseWriter, r *http.Request) error {
	s, err := vw.status()
	if err != nil {
		return err
	}
	return writeJSON(w, s)
}

func (vw views) status() (*api.Status, error) {
	d := vw
	list, err := vw.list()
	if err != nil {
		return nil, err
	}
	s := api.Status{
		Version: d.cfg.Version, Root: d.store.Root(), Socket: d.cfg.Socket, ModelsDir: d.cfg.ModelsDir,
		Started: d.started, Phases: map[api.Phase]int{}, DirectIO: d.cfg.DirectIO, Credentials: sources.Ambient(),
	}
	for _, a := range list {
		s.Phases[a.Phase]++
		if a.Phase == api.PhaseDownloading {
			s.PullsInFlight++
		}
	}
	s.StoreBytes, _, _ = d.store.BlobStats()
	_, s.FSFreeBytes, _ = d.store.FSStat()
	d.mu.Lock()
	s.ModelsDirError = append([]string(nil), d.desires.fileErrors...)
	d.mu.Unlock()
	s.ReservedBytes = d.space.reserved()
	if pr, err := d.space.evictor.Pressure(); err == nil {
		s.DiskPressure = pr.OverQuota || pr.AboveHigh
	}
	s.QuotaBytes, s.HighWatermark, s.LowWatermark = d.cfg.Capacity.QuotaBytes, d.cfg.Capacity.HighPercent, d.cfg.Capacity.LowPercent
	if le := d.space.lastEviction.Load(); le != nil {
		ev := &api.Eviction{At: le.at, Failed: le.rep.Failed, BytesFreed: le.rep.BytesFreed, ShortBytes: le.rep.Short}
		for _, v := range le.rep.Evicted {
			ev.Evicted = append(ev.Evicted, fmt.Sprintf("%s@%s (%s)", v.Name, v.Revision, v.Reason))
		}
		s.LastEviction = ev
	}
	s.FSCapacityBytes, _, _ = d.store.FSStat()
	return &s, nil
}

func (vw views) handleUsage(w http.ResponseWriter, r *http.Request) error {
	d := vw
	u, err := d.store.Usage()
	if err != nil {
		return err
	}
	out := api.Usage{Root: d.store.Root(), StoreBytes: u.StoreBytes, Blobs: u.Blobs, FSCapacityBytes: u.FSCapacity, FSFreeBytes: u.FSFree}
	// A kernel cache counts with the model it serves, too.
	serves := map[string]string{}
	if arts, err := d.store.ListSummaries(); err == nil {
		for i := range arts {
			if info := kernels.Info(kernels.CurrentVersion(&arts[i])); info != nil && info.Serves != "" {
				serves[arts[i].Name] = info.Serves
			}
		}
	}
	kernels := map[string]int64{}
	for _, a := range u.Artifacts {
		if m := serves[a.Name]; m != "" {
			kernels[m] += a.Bytes
		}
	}
	for _, a := range u.Artifacts {
		out.Artifacts = append(out.Artifacts, api.ArtifactUsage{Name: a.Name, Bytes: a.Bytes, UniqueBytes: a.Unique, SharedBytes: a.Shared,
			Serves: serves[a.Name], KernelCacheBytes: kernels[a.Name]})
	}
	return writeJSON(w, out)
}

func (vw views) handleList(w http.ResponseWriter, r *http.Request) error {
	fields := r.URL.Query().Get("fields")
	if fields != "" && fields != "row" {
		return api.Errorf(api.CodeInvalid, "fields=%q: the one value is row (what modelctl list's table shows); leave it out for every field", fields)
	}
	if fields == "row" {
		// Each view becomes its row as it is made: 10,000 full views
		// kept until the last is made are megabytes more garbage per
		// list, collected while the next lists are answered.
		rows, err := collectViews(vw, (*api.Artifact).Row, func(r *api.ArtifactRow) string { return r.Name })
		if err != nil {
			return err
		}
		return writeJSONArray(w, rows)
	}
	list, err := vw.list()
	if err != nil {
		return err
	}
	return writeJSONArray(w, list)
}

func (vw views) handleGet(w http.ResponseWriter, r *http.Request) error {
	a, err := vw.view(r.PathValue("name"), true)
	if err != nil {
		return err
	}
	if a.Desire != nil && private(*a.Desire) && !vw.mayMutate(r) {
		hidePrivate(a)
	}
	if a.Phase == api.PhaseReady && a.Revision != "" { // a walk of the tree's pages: inspect's only
		a.Resident = vw.warming.resident(kindOf(vw.store, a.Name), a.Name, a.Revision)
	}
	return writeJSON(w, a)
}

// list joins desires, in-memory state and the index into one view per
// name: the summary of each (no versions, no files; inspect has those).
func (vw views) list() ([]api.Artifact, error) {
	return collectViews(vw, func(a *api.Artifact) api.Artifact { return *a }, func(a *api.Artifact) string { return a.Name })
}

// collectViews makes list's view of each name, keeps conv of it, and
// returns them sorted by name.
func collectViews[T any](vw views, conv func(*api.Artifact) T, name func(*T) string) ([]T, error) {
	d := vw
	arts, err := d.store.ListSummaries()
	if err != nil {
		return nil, err
	}
	uses := d.inUse()
	d.mu.Lock()
	defer d.mu.Unlock()
	want := d.desires.merged()
	out := make([]T, 0, len(arts)+len(want))
	add := func(name string, a *cachestore.Artifact) {
		v := vw.viewLocked(name, a, want, viewSummary)
		v.Desire = nil
		v.InUse = holdersOf(uses, name)
		out = append(out, conv(&v))
	}
	seen := make(map[string]bool, len(arts)+len(want))
	for i := range arts {
		seen[arts[i].Name] = true
		add(arts[i].Name, &arts[i])
	}
	for n, ds := range want {
		if !seen[n] && ds.State != api.StateAbsent {
			seen[n] = true
			add(n, nil)
		}
	}
	for n := range d.evicted {
		if !seen[n] {
			add(n, nil)
		}
	}
	sort.Slice(out, func(i, j int) bool { return name(&out[i]) < name(&out[j]) })
	return out, nil
}

// view returns one name; ErrNotFound when neither desired nor stored.
func (vw views) view(name string, files bool) (*api.Artifact, error) {
	d := vw
	a, err := d.store.Get(name)
	if err != nil && !errors.Is(err, cachestore.ErrNotFound) {
		return nil, err
	}
	uses := d.inUse()
	d.mu.Lock()
	defer d.mu.Unlock()
	want := d.desires.merged()
	if _, ok := want[name]; !ok && a == nil && d.evicted[name].At.IsZero() {
		return nil, api.Errorf(api.CodeNotFound, "artifact %s: not in the cache and not desired; pull it with: modelctl pull URI --name %s", name, name)
	}
	detail := viewVersions
	if files {
		detail = viewFiles
	}
	v := vw.viewLocked(name, a, want, detail)
	v.InUse = holdersOf(uses, name)
	return &v, nil
}

// viewDetail is how much of an artifact a view carries.
type viewDetail int

const (
	viewSummary  viewDetail = iota // list: no versions
	viewVersions                   // inspect: every version
	viewFiles                      // inspect with each version's files and the metadata
)

// viewLocked builds the API view, its URIs and messages redacted; called
// with d.mu held.
func (vw views) viewLocked(name string, a *cachestore.Artifact, want map[string]api.Desire, detail viewDetail) api.Artifact {
	d := vw
	out := api.Artifact{Name: name, Kind: api.KindModel, Phase: api.PhasePending}
	if ds, ok := want[name]; ok {
		ds := ds
		out.Desire, out.URI, out.Pinned = &ds, ds.URI, ds.Pin
		out.Entry = api.EntryAdHoc
		if declared(ds) {
			out.Entry = api.EntryDeclared
		}
		if ds.Kind == api.KindKernelCache {
			out.Kind = api.KindKernelCache
		}
	}
	cur := versionsView(&out, a, detail)
	if cur != nil {
		currentView(&out, cur, d.store.TreePath(cur.Kind, name, "current"))
	}
	st := d.arts[name]
	if out.Desire != nil && out.Desire.Stage && cur != nil && cur.State == cachestore.StateReady {
		// A rollout's prefetch: the current revision serves (the phase
		// says so); the pull's state is the next revision's.
		out.Next = vw.nextView(*out.Desire, a, st)
		st = nil
	}
	if st != nil {
		pullView(&out, st, cur)
	} else if out.Desire == nil && cur != nil && cur.State != cachestore.StateReady {
		out.Message = cur.Message + " (no desire to re-fetch from: pull it again)"
	}
	if note, ok := d.evicted[name]; ok && out.Desire == nil && cur == nil {
		n := note
		out.Phase, out.Evicted, out.Reason = api.PhaseEvicted, &n, n.Reason
		out.Message = fmt.Sprintf("ad-hoc entry evicted at %s for disk space; pull it again to bring it back", n.At.Format(time.RFC3339))
		if n.For != "" {
			out.Message = fmt.Sprintf("ad-hoc entry evicted at %s to make room for %s; pull it again (with --keep to keep it) to bring it back", n.At.Format(time.RFC3339), n.For)
		}
	}
	redactView(&out) // every local user reads views: no credentials in them
	return out
}

// versionsView fills in the versions of a stored artifact (detail
// permitting) and returns its current one, or nil.
func versionsView(out *api.Artifact, a *cachestore.Artifact, detail viewDetail) *cachestore.Version {
	var cur *cachestore.Version
	if a != nil {
		for i := range a.Versions {
			v := a.Versions[i]
			if v.Revision == a.Current {
				cur = &a.Versions[i]
			}
			if detail == viewSummary {
				continue
			}
			av := api.Version{
				Revision: v.Revision, State: string(v.State), Message: v.Message, ManifestDigest: v.ManifestDigest,
				Bytes: v.Bytes, Pinned: v.Pinned, Created: v.Created, LastUsed: v.LastUsed, Source: v.Source,
			}
			if detail == viewFiles {
				for _, e := range v.Manifest {
					av.Files = append(av.Files, api.File{Path: e.Path, Digest: e.Digest, Size: e.Size, Streamed: e.Streamed, Peers: e.Peers, Transport: e.Transport})
				}
			}
			out.Versions = append(out.Versions, av)
		}
	}
	if cur != nil && detail == viewFiles && cur.Metadata != nil {
		m := api.Metadata(*cur.Metadata)
		out.Metadata = &m
	}
	return cur
}

// currentView fills in what the current version says: kind, revision,
// bytes, source, times, and its phase (path is its tree).
func currentView(out *api.Artifact, cur *cachestore.Version, path string) {
	out.Kind, out.Revision, out.ManifestDigest, out.Bytes, out.Pinned = cur.Kind, cur.Revision, cur.ManifestDigest, cur.Bytes, cur.Pinned
	out.Source = cur.Source
	out.KernelCache = kernels.Info(cur)
	if !cur.LastUsed.IsZero() {
		lu := cur.LastUsed
		out.LastUsed = &lu
	}
	if !cur.Created.IsZero() {
		cr := cur.Created
		out.Created = &cr
	}
	if out.URI == "" {
		out.URI = cur.Source
	}
	switch cur.State {
	case cachestore.StateReady:
		out.Phase = api.PhaseReady
		out.Path = path
	case cachestore.StateMissing: // a re-fetch is due
		out.Phase, out.Message = api.PhasePending, cur.Message
	default:
		out.Phase, out.Message = api.PhaseFailed, cur.Message
	}
}

// pullView fills in what the pull of the artifact is doing or last did.
func pullView(out *api.Artifact, st *artState, cur *cachestore.Version) {
	switch {
	case st.cancel != nil:
		out.Phase, out.Message, out.Progress = st.phase, st.message, st.prog.view()
	case st.phase == api.PhaseFailed || st.phase == api.PhaseIncompatible:
		out.Phase, out.Message, out.Reason = st.phase, st.message, st.reason
		if st.kc != nil {
			out.KernelCache = st.kc // what this attempt found: signature, compatibility
		}
	case cur == nil || cur.State != cachestore.StateReady:
		if st.message != "" {
			out.Message = st.message
		}
	case out.Desire != nil && out.Desire.State == api.StateAbsent && st.message != "":
		out.Message = st.message // why an absent artifact is still here ("kept while in use by …")
	}
	out.Attempts = st.attempts
	out.LastPull = st.last
	if !st.nextRetry.IsZero() && st.phase == api.PhaseFailed {
		t := st.nextRetry
		out.NextRetry = &t
	}
}

// nextView is the revision a staged desire prefetches: Ready once a
// version of it is, else the pull's phase. Called with d.mu held.
func (vw views) nextView(ds api.Desire, a *cachestore.Artifact, st *artState) *api.NextRevision {
	fp := fingerprint(ds)
	n := &api.NextRevision{URI: ds.URI, Revision: ds.Revision, Phase: api.PhasePending}
	for _, v := range a.Versions {
		if v.State == cachestore.StateReady && v.Spec == fp {
			n.Phase, n.Revision, n.ManifestDigest = api.PhaseReady, v.Revision, v.ManifestDigest
			return n
		}
	}
	switch {
	case st == nil:
	case st.cancel != nil:
		n.Phase, n.Message, n.Progress = st.phase, st.message, st.prog.view()
	case st.phase == api.PhaseFailed || st.phase == api.PhaseIncompatible:
		n.Phase, n.Message, n.Reason = st.phase, st.message, st.reason
	}
	return n
}

// settled reports whether a waiter may stop, and with which error.
func settledErr(a *api.Artifact) error {
	if a.Phase == api.PhaseFailed {
		return api.Errorf(api.CodeFailed, "artifact %s failed: %s", a.Name, a.Message)
	}
	if a.Phase == api.PhaseEvicted {
		return api.Errorf(api.CodeFailed, "artifact %s: %s", a.Name, a.Message)
	}
	if a.Phase == api.PhaseIncompatible {
		return api.Errorf(api.CodeFailed, "artifact %s is not for this node: %s", a.Name, a.Message)
	}
	return nil
}
