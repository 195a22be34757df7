package daemon

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/kernels"
	"github.com/modelcache/modelcache/daemon/sources"
	"github.com/modelcache/modelcache/fetchers"
)

type route struct {
	pattern string // "METHOD /path", Go ServeMux syntax
	write   bool   // mutates: needs root, the daemon's uid or the socket group
	h       handler
}

func (d *Daemon) routeTable() []route {
	return []route{
		{"GET /v1/health", false, d.handleHealth},
		{"GET /v1/status", false, viewsOf(d).handleStatus},
		{"GET /v1/usage", false, viewsOf(d).handleUsage},
		{"GET /v1/artifacts", false, viewsOf(d).handleList},
		{"GET /v1/artifacts/{name}", false, viewsOf(d).handleGet},
		{"GET /v1/artifacts/{name}/wait", false, viewsOf(d).handleWait},
		{"GET /v1/artifacts/{name}/env", false, d.handleEnv},
		{"GET /v1/gpu", false, d.handleGPU},
		{"POST /v1/pull", true, d.handlePull},
		{"POST /v1/artifacts/{name}/retry", true, d.handleRetry},
		{"POST /v1/artifacts/{name}/pin", true, d.handlePin(true)},
		{"POST /v1/artifacts/{name}/unpin", true, d.handlePin(false)},
		{"DELETE /v1/artifacts/{name}", true, evictionsOf(d).handleEvict},
		{"POST /v1/artifacts/{name}/lease", true, d.leases.handleLease},
		{"DELETE /v1/artifacts/{name}/lease", true, d.leases.handleRelease},
		{"POST /v1/artifacts/{name}/warm", true, d.warming.handleWarm},
		{"POST /v1/verify", true, d.handleVerify},
		{"POST /v1/gc", true, evictionsOf(d).handleGC},
		{"GET /v1/csi/capture", true, captures{d.csi}.handleCaptureSource},
		{"POST /v1/csi/captured", true, captures{d.csi}.handleCaptured},
		{"GET /v1/csi/kept", false, captures{d.csi}.handleKept},
		{"DELETE /v1/csi/kept", true, captures{d.csi}.handleDropKept},
	}
}

func (d *Daemon) routes() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range d.routeTable() {
		rt := rt
		mux.HandleFunc(rt.pattern, func(w http.ResponseWriter, r *http.Request) {
			sw := &statusWriter{ResponseWriter: w, rc: http.NewResponseController(w), writeTimeout: d.cfg.SocketWriteTimeout, code: 200}
			defer func() { d.metrics.apiRequests.WithLabelValues(rt.pattern, strconv.Itoa(sw.code)).Inc() }()
			if rt.write && !d.mayMutate(r) {
				writeError(sw, d.forbidden(r))
				return
			}
			if err := rt.h(sw, r); err != nil {
				e := toAPIError(err)
				if e.Code == api.CodeInternal {
					d.log.Error("api", "route", rt.pattern, "err", err)
				}
				writeError(sw, e)
			}
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, api.Errorf(api.CodeNotFound, "no route %s %s; this daemon serves /v1/", r.Method, r.URL.Path))
	})
	return mux
}

func (d *Daemon) handleHealth(w http.ResponseWriter, r *http.Request) error {
	if err := d.healthy(); err != nil {
		return api.Errorf(api.CodeUnavailable, "store unhealthy: %v", err)
	}
	return writeJSON(w, map[string]string{"status": "ok"})
}

func (d *Daemon) handleVerify(w http.ResponseWriter, r *http.Request) error {
	var req api.VerifyRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Fsck {
		probs, err := d.store.Fsck()
		if err != nil {
			return err
		}
		return writeJSON(w, api.VerifyResult{Fsck: true, Problems: probs})
	}
	rep, err := d.store.Verify(r.Context(), req.Names, nil)
	if err != nil {
		return err
	}
	d.metrics.verifications.WithLabelValues("ok").Add(float64(rep.BlobsChecked - len(rep.Corrupt) - len(rep.Missing)))
	d.metrics.verifications.WithLabelValues("corrupt").Add(float64(len(rep.Corrupt)))
	d.metrics.verifications.WithLabelValues("missing").Add(float64(len(rep.Missing)))
	out := api.VerifyResult{BlobsChecked: rep.BlobsChecked, BytesChecked: rep.BytesChecked, Corrupt: rep.Corrupt, Missing: rep.Missing, Quarantined: rep.Quarantine}
	if len(rep.Affected) > 0 {
		d.mu.Lock()
		want := d.desires.merged()
		for _, nr := range rep.Affected {
			name, _, _ := strings.Cut(nr, "@")
			if ds, ok := want[name]; ok && ds.State != api.StateAbsent {
				out.Refetching = append(out.Refetching, nr)
			}
		}
		d.notify()
		d.mu.Unlock()
		d.log.Warn("verify found damage", "corrupt", rep.Corrupt, "missing", rep.Missing, "affected", rep.Affected)
		d.kick()
	}
	return writeJSON(w, out)
}

func (d *Daemon) handleGPU(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, kernels.GPUView(d.kernels.GPUs()))
}

func (d *Daemon) handleEnv(w http.ResponseWriter, r *http.Request) error {
	env, err := d.kernels.Env(r.PathValue("name"))
	if err != nil {
		return err
	}
	return writeJSON(w, env)
}

// handlePull is modelctl pull: the desire is validated, saved (unless a
// waiter's first attempt fails for good, dropFailedPull) and pulled; with
// wait=true the reply streams until that pull ends.
func (d *Daemon) handlePull(w http.ResponseWriter, r *http.Request) error {
	var req api.PullRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	ds := req.Desire()
	ds.Origin, ds.Requester = sources.OriginAPI, requester(r)
	ds, err := d.validateDesire(ds)
	if err != nil {
		return err
	}
	ds.Credentialed = d.sources.Credentialed(r.Context(), ds) // private unless --public (tenancy.go)
	d.mu.Lock()
	err = d.pullConflicts(ds)
	if err == nil && !req.Replace {
		err = d.replaces(ds)
	}
	d.mu.Unlock()
	if err != nil {
		return err
	}
	if err := d.sources.CheckSourceAccess(r.Context(), ds); err != nil {
		return err
	}
	// Again, under desires.writeMu: the check above ran unlocked. The index
	// write (an fsync) runs outside the daemon lock.
	d.desires.writeMu.Lock()
	d.mu.Lock()
	err = d.pullConflicts(ds)
	if err == nil && !req.Replace {
		err = d.replaces(ds)
	}
	_, had := d.desires.api[ds.Name]
	d.mu.Unlock()
	// A pull of a name the node knows nothing of: if its first attempt
	// fails for good, nothing of it stays (dropFailedPull).
	_, serr := d.store.Summary(ds.Name)
	fresh := !had && errors.Is(serr, cachestore.ErrNotFound)
	if err == nil {
		err = d.desires.persist(ds.Name, ds)
	}
	if err != nil {
		d.desires.writeMu.Unlock()
		return err
	}
	d.mu.Lock()
	d.desires.api[ds.Name] = ds
	d.desires.publish()
	delete(d.evicted, ds.Name)
	st := d.arts.of(ds.Name)
	if st.cancel == nil || st.spec != fingerprint(ds) {
		st.force = true // an explicit pull re-resolves the source
	}
	// Wait for the next pull to finish: the one this request starts, or the
	// one in flight for the same desire (as fresh as a new one would be).
	since := st.completed
	d.notify()
	d.mu.Unlock()
	d.desires.writeMu.Unlock()
	d.kick()
	if r.URL.Query().Get("wait") != "true" {
		a, err := viewsOf(d).view(ds.Name, false)
		if err != nil {
			return err
		}
		w.WriteHeader(http.StatusAccepted)
		return writeJSON(w, a)
	}
	// The waiter gets the outcome of that pull, even where an older version
	// still satisfies the desire (a refresh that failed is not Ready).
	fp, dropping := fingerprint(ds), false
	var outcome error // set under d.mu by dropFailedPull
	return viewsOf(d).streamUntil(w, r, ds.Name, 0, nil, nil, func(st *artState) (bool, error) {
		if outcome != nil {
			return true, outcome
		}
		if st == nil || st.completed <= since || st.cancel != nil {
			return false, nil
		}
		if st.permanent && st.spec == fp && st.lastErr != nil && fresh && !declared(ds) && st.attempts == 1 {
			if !dropping {
				dropping = true
				go d.dropFailedPull(ds.Name, fp, func(err error) { outcome = err })
			}
			return false, nil
		}
		return true, st.lastErr
	})
}

// handleRetry is modelctl retry: the Failed desire of name, whatever its
// origin (a pull, a models.d file, a ModelCache), is pulled again now, its
// source resolved anew, instead of at its next attempt or never (a
// failure no retry of the same desire could fix: the fix was made
// elsewhere, a permission, a token, a file put in place). With wait=true
// the reply streams until that pull ends.
func (d *Daemon) handleRetry(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	d.mu.Lock()
	ds, ok := d.desires.merged()[name]
	st := d.arts[name]
	switch {
	case !ok || ds.State == api.StateAbsent:
		d.mu.Unlock()
		return api.Errorf(api.CodeNotFound, "artifact %s: nothing desires it, so there is nothing to retry; pull it (modelctl pull URI --name %s)", name, name)
	case st == nil || st.cancel != nil || st.phase != api.PhaseFailed:
		phase := api.PhasePending
		if st != nil {
			phase = st.phase
		}
		if st != nil && st.cancel != nil {
			phase = api.PhaseDownloading
		}
		d.mu.Unlock()
		return api.Errorf(api.CodeConflict, "artifact %s is %s, not Failed: nothing to retry (modelctl wait %s follows it)", name, phase, name)
	}
	st.force = true
	since := st.completed
	d.notify()
	d.mu.Unlock()
	d.log.Info("retry asked", "artifact", name, "origin", ds.Origin, "requester", requester(r))
	d.kick()
	if r.URL.Query().Get("wait") != "true" {
		a, err := viewsOf(d).view(name, false)
		if err != nil {
			return err
		}
		w.WriteHeader(http.StatusAccepted)
		return writeJSON(w, a)
	}
	return viewsOf(d).streamUntil(w, r, name, 0, nil, nil, func(st *artState) (bool, error) {
		if st == nil || st.completed <= since || st.cancel != nil {
			return false, nil
		}
		return true, st.lastErr
	})
}

// dropFailedPull removes the desire of an interactive pull whose first
// attempt failed for good (a 404, a wrong digest, a refused source) and
// that the node held nothing of before: a mistake leaves no Failed row and
// no saved desire. set gets the waiter's error, which says whether the
// desire went; it is called with d.mu held.
func (d *Daemon) dropFailedPull(name, fp string, set func(error)) {
	d.desires.writeMu.Lock()
	defer d.desires.writeMu.Unlock()
	d.mu.Lock()
	ds, ok := d.desires.api[name]
	st := d.arts[name]
	var failure error
	if st != nil {
		failure = st.lastErr
	}
	// Unchanged since the waiter saw it fail: another pull may have asked
	// again or declared the name meanwhile.
	still := ok && fingerprint(ds) == fp && !declared(ds) && st != nil && st.permanent && st.cancel == nil && failure != nil
	d.mu.Unlock()
	var err error
	if still {
		err = d.desires.unpersist(name) // an index write: outside the daemon lock
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case failure == nil:
		set(fmt.Errorf("artifact %s changed while its failure was reported; see modelctl inspect %s", name, name))
	case still && err == nil:
		delete(d.desires.api, name)
		d.desires.publish()
		delete(d.arts, name)
		set(fmt.Errorf("%w; nothing was kept (pull again once fixed, or with --keep to keep the desire and its Failed entry)", failure))
	default:
		set(failure) // the desire stays, Failed: the waiter's view says so
	}
	d.notify()
}

// pullConflict refuses a socket pull of a name the node's configuration
// declares: a models.d desire, or a declared model's kernel cache. Called
// with d.mu held.
func (d *Daemon) pullConflict(name string) error {
	if fd, ok := d.desires.file[name]; ok {
		return api.Errorf(api.CodeConflict, "artifact %s is declared in %s; edit that file instead of pulling it by hand", name, strings.TrimPrefix(fd.Origin, sources.OriginFile))
	}
	if w, ok := d.desires.merged()[name]; ok && w.Serves != "" && w.Origin != sources.OriginAPI {
		return api.Errorf(api.CodeConflict, "artifact %s is the kernel cache of %s, declared in %s; pull under another name", name, w.Serves, w.Origin)
	}
	return nil
}

// replaces refuses a socket pull that would silently change the source of
// an existing desire of the same name (PullRequest.Replace allows it).
// Called with d.mu held.
func (d *Daemon) replaces(ds api.Desire) error {
	old, ok := d.desires.api[ds.Name]
	if !ok || old.State == api.StateAbsent {
		return nil
	}
	was, now := fetchers.RedactURI(old.URI), fetchers.RedactURI(ds.URI)
	if sourceOf(was) == sourceOf(now) { // the same source at another revision, or with a rotated credential
		return nil
	}
	return api.Errorf(api.CodeConflict, "artifact %s is pulled from %s; this pull names %s: add --replace to replace it (the current version is served until the new one is Ready), or pull under another --name",
		ds.Name, was, now)
}

// sourceOf is a redacted URI without what picks a revision of its source:
// a fragment (#sha256=…), a query, an hf or OCI @revision, an OCI tag, an
// NGC :version. Two URIs of one source are one repo, bucket path or URL.
func sourceOf(uri string) string {
	uri, _, _ = strings.Cut(uri, "#")
	uri, _, _ = strings.Cut(uri, "?")
	scheme, rest, ok := strings.Cut(uri, "://")
	if !ok {
		return uri
	}
	switch scheme {
	case "hf", "oci":
		rest, _, _ = strings.Cut(rest, "@")
	}
	switch scheme {
	case "oci", "ngc": // a :tag or :version after the last slash (a registry's :port comes before it)
		if i := strings.LastIndex(rest, "/"); i >= 0 {
			if j := strings.Index(rest[i:], ":"); j >= 0 {
				rest = rest[:i+j]
			}
		}
	}
	return scheme + "://" + rest
}

// pullConflicts checks the desire's name and the names of the kernel
// caches it lists. Called with d.mu held.
func (d *Daemon) pullConflicts(ds api.Desire) error {
	if err := d.pullConflict(ds.Name); err != nil {
		return err
	}
	for i := range ds.KernelCaches {
		if err := d.pullConflict(ds.KernelCacheName(i)); err != nil {
			return err
		}
	}
	return nil
}

func (d *Daemon) handlePin(pin bool) handler {
	return func(w http.ResponseWriter, r *http.Request) error {
		name := r.PathValue("name")
		d.desires.writeMu.Lock()
		d.mu.Lock()
		ds, isAPI := d.desires.api[name]
		d.mu.Unlock()
		if isAPI {
			ds.Pin = pin
			if err := d.desires.persist(name, ds); err != nil {
				d.desires.writeMu.Unlock()
				return err
			}
			d.mu.Lock()
			d.desires.api[name] = ds
			d.desires.publish()
			d.mu.Unlock()
		}
		d.desires.writeMu.Unlock()
		err := d.store.SetPinned(name, "", pin)
		if err != nil && !(isAPI && errors.Is(err, cachestore.ErrNotFound)) {
			return err
		}
		a, err := viewsOf(d).view(name, false)
		if err != nil {
			return err
		}
		return writeJSON(w, a)
	}
}
