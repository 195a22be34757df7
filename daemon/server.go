package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/capacity"
	"github.com/modelcache/modelcache/fetchers"
	ocifetcher "github.com/modelcache/modelcache/fetchers/oci"
)

type credKey struct{}

// peerContext records the peer on each connection: read once at accept
// by the peerListener, or here for a bare unix conn.
func peerContext(ctx context.Context, c net.Conn) context.Context {
	var p *peer
	switch c := c.(type) {
	case *peerConn:
		p = c.cred
	case *net.UnixConn:
		p = peerCred(c)
	}
	if p == nil {
		return ctx
	}
	return context.WithValue(ctx, credKey{}, p)
}

func peerOf(r *http.Request) *peer {
	p, _ := r.Context().Value(credKey{}).(*peer)
	return p
}

// mayMutate: root, the daemon's own uid, or a member of the socket group
// (primary or supplementary, as the socket recorded them at connect).
func (d *Daemon) mayMutate(r *http.Request) bool {
	p := peerOf(r)
	if p == nil {
		return false
	}
	if p.Uid == 0 || int(p.Uid) == os.Geteuid() {
		return true
	}
	return d.gid >= 0 && p.inGroup(d.gid)
}

// requester is the identity of the request's peer: its uid, gid and
// supplementary groups. A peer without credentials (never on a unix
// socket) is nobody.
func requester(r *http.Request) *api.Requester {
	p := peerOf(r)
	if p == nil {
		return &api.Requester{UID: nobody, GID: nobody}
	}
	return &api.Requester{UID: p.Uid, GID: p.Gid, Groups: p.Groups}
}

// nobody is the identity of a desire whose requester is unknown (one
// persisted before requesters were recorded): it reads only what every
// local user may read.
const nobody = 65534

type handler func(w http.ResponseWriter, r *http.Request) error

type route struct {
	pattern string // "METHOD /path", Go ServeMux syntax
	write   bool   // mutates: needs root, the daemon's uid or the socket group
	h       handler
}

func (d *Daemon) routeTable() []route {
	return []route{
		{"GET /v1/health", false, d.handleHealth},
		{"GET /v1/status", false, d.handleStatus},
		{"GET /v1/usage", false, d.handleUsage},
		{"GET /v1/artifacts", false, d.handleList},
		{"GET /v1/artifacts/{name}", false, d.handleGet},
		{"GET /v1/artifacts/{name}/wait", false, d.handleWait},
		{"GET /v1/artifacts/{name}/env", false, d.handleEnv},
		{"GET /v1/gpu", false, d.handleGPU},
		{"POST /v1/pull", true, d.handlePull},
		{"POST /v1/artifacts/{name}/pin", true, d.handlePin(true)},
		{"POST /v1/artifacts/{name}/unpin", true, d.handlePin(false)},
		{"DELETE /v1/artifacts/{name}", true, d.handleEvict},
		{"POST /v1/artifacts/{name}/lease", true, d.handleLease},
		{"DELETE /v1/artifacts/{name}/lease", true, d.handleRelease},
		{"POST /v1/verify", true, d.handleVerify},
		{"POST /v1/gc", true, d.handleGC},
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

func (d *Daemon) forbidden(r *http.Request) *api.Error {
	who := "this peer"
	if cred := peerOf(r); cred != nil {
		who = fmt.Sprintf("uid %d", cred.Uid)
	}
	how := "run it as root"
	if d.gid >= 0 {
		how = fmt.Sprintf("run it as root (sudo) or join group %s (sudo usermod -aG %s $USER, then log in again)", d.cfg.SocketGroup, d.cfg.SocketGroup)
	}
	return api.Errorf(api.CodeForbidden, "%s may read the cache but not change it; %s", who, how)
}

// statusWriter records the status code for the metrics and gives every
// write its own deadline, writeTimeout from that write: a peer that stops
// reading loses its connection, a stream that keeps writing lives on.
type statusWriter struct {
	http.ResponseWriter
	rc           *http.ResponseController // of the ResponseWriter
	writeTimeout time.Duration            // 0: none
	code         int
}

func (s *statusWriter) renew() {
	if s.writeTimeout > 0 {
		s.rc.SetWriteDeadline(time.Now().Add(s.writeTimeout))
	}
}

func (s *statusWriter) WriteHeader(c int) { s.code = c; s.ResponseWriter.WriteHeader(c) }

func (s *statusWriter) Write(p []byte) (int, error) {
	s.renew()
	return s.ResponseWriter.Write(p)
}

// FlushError sends what is buffered; an error means the peer is gone or
// stopped reading (and the request's context is cancelled).
func (s *statusWriter) FlushError() error {
	s.renew()
	return s.rc.Flush()
}

func (s *statusWriter) Flush() { s.FlushError() }

// Unwrap lets http.ResponseController reach the server's writer.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// toAPIError is the one place that maps errors to codes and statuses.
func toAPIError(err error) *api.Error {
	var e *api.Error
	switch {
	case errors.As(err, &e):
		return e
	case errors.Is(err, cachestore.ErrNotFound), errors.Is(err, fetchers.ErrNotFound):
		return api.Errorf(api.CodeNotFound, "%v", err)
	case errors.Is(err, fetchers.ErrUnauthorized):
		return api.Errorf(api.CodeForbidden, "%v", err)
	case errors.Is(err, cachestore.ErrPinned):
		return api.Errorf(api.CodePinned, "%v", err)
	case errors.Is(err, cachestore.ErrDigestMismatch):
		return api.Errorf(api.CodeDigestMismatch, "%v", err)
	case errors.Is(err, cachestore.ErrInvalidName), errors.Is(err, cachestore.ErrInvalidPath),
		errors.Is(err, cachestore.ErrInvalidDigest), errors.Is(err, fetchers.ErrBadSource), errors.Is(err, fetchers.ErrUnsupported):
		return api.Errorf(api.CodeInvalid, "%v", err)
	case errors.Is(err, context.DeadlineExceeded):
		return api.Errorf(api.CodeTimeout, "%v", err)
	}
	return api.Errorf(api.CodeInternal, "%v", err)
}

// writeError sends e with the credentials in any URL of its message
// redacted: every local user may read the socket.
func writeError(w http.ResponseWriter, e *api.Error) {
	out := *e
	if out.Status == 0 {
		out.Status = api.HTTPStatus(out.Code)
	}
	out.Message = fetchers.RedactText(out.Message)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(out.Status)
	json.NewEncoder(w).Encode(&out)
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(v)
}

// decode reads a bounded JSON body, rejecting unknown fields.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return api.Errorf(api.CodeInvalid, "request body: %v", err)
	}
	return nil
}

func (d *Daemon) handleHealth(w http.ResponseWriter, r *http.Request) error {
	if err := d.healthy(); err != nil {
		return api.Errorf(api.CodeUnavailable, "store unhealthy: %v", err)
	}
	return writeJSON(w, map[string]string{"status": "ok"})
}

func (d *Daemon) handleStatus(w http.ResponseWriter, r *http.Request) error {
	s, err := d.status()
	if err != nil {
		return err
	}
	return writeJSON(w, s)
}

func (d *Daemon) status() (*api.Status, error) {
	list, err := d.list()
	if err != nil {
		return nil, err
	}
	s := api.Status{
		Version: d.cfg.Version, Root: d.store.Root(), Socket: d.cfg.Socket, ModelsDir: d.cfg.ModelsDir,
		Started: d.started, Phases: map[api.Phase]int{}, DirectIO: d.cfg.DirectIO,
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
	s.ModelsDirError = append([]string(nil), d.fileErrors...)
	d.mu.Unlock()
	s.ReservedBytes = d.reserved()
	if pr, err := d.evictor.Pressure(); err == nil {
		s.DiskPressure = pr.OverQuota || pr.AboveHigh
	}
	s.QuotaBytes, s.HighWatermark, s.LowWatermark = d.cfg.Capacity.QuotaBytes, d.cfg.Capacity.HighPercent, d.cfg.Capacity.LowPercent
	if le := d.lastEviction.Load(); le != nil {
		ev := &api.Eviction{At: le.at, Failed: le.rep.Failed, BytesFreed: le.rep.BytesFreed, ShortBytes: le.rep.Short}
		for _, v := range le.rep.Evicted {
			ev.Evicted = append(ev.Evicted, fmt.Sprintf("%s@%s (%s)", v.Name, v.Revision, v.Reason))
		}
		s.LastEviction = ev
	}
	s.FSCapacityBytes, _, _ = d.store.FSStat()
	return &s, nil
}

func (d *Daemon) handleUsage(w http.ResponseWriter, r *http.Request) error {
	u, err := d.store.Usage()
	if err != nil {
		return err
	}
	out := api.Usage{Root: d.store.Root(), StoreBytes: u.StoreBytes, Blobs: u.Blobs, FSCapacityBytes: u.FSCapacity, FSFreeBytes: u.FSFree}
	// A kernel cache counts with the model it serves, too.
	serves := map[string]string{}
	if arts, err := d.store.ListSummaries(); err == nil {
		for i := range arts {
			if info := kernelCacheInfo(currentVersion(&arts[i])); info != nil && info.Serves != "" {
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

func (d *Daemon) handleList(w http.ResponseWriter, r *http.Request) error {
	list, err := d.list()
	if err != nil {
		return err
	}
	return writeJSON(w, list)
}

func (d *Daemon) handleGet(w http.ResponseWriter, r *http.Request) error {
	a, err := d.view(r.PathValue("name"), true)
	if err != nil {
		return err
	}
	return writeJSON(w, a)
}

// list joins desires, in-memory state and the index into one view per
// name: the summary of each (no versions, no files; inspect has those).
func (d *Daemon) list() ([]api.Artifact, error) {
	arts, err := d.store.ListSummaries()
	if err != nil {
		return nil, err
	}
	uses := d.inUse()
	d.mu.Lock()
	defer d.mu.Unlock()
	want := d.desired()
	seen := map[string]bool{}
	out := make([]api.Artifact, 0, len(arts)+len(want))
	for i := range arts {
		seen[arts[i].Name] = true
		out = append(out, d.viewLocked(arts[i].Name, &arts[i], want, false))
	}
	for name, ds := range want {
		if !seen[name] && ds.State != api.StateAbsent {
			out = append(out, d.viewLocked(name, nil, want, false))
		}
	}
	for i := range out {
		out[i].Versions, out[i].Desire = nil, nil
		out[i].InUse = holdersOf(uses, out[i].Name)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// view returns one name; ErrNotFound when neither desired nor stored.
func (d *Daemon) view(name string, files bool) (*api.Artifact, error) {
	a, err := d.store.Get(name)
	if err != nil && !errors.Is(err, cachestore.ErrNotFound) {
		return nil, err
	}
	uses := d.inUse()
	d.mu.Lock()
	defer d.mu.Unlock()
	want := d.desired()
	if _, ok := want[name]; !ok && a == nil {
		return nil, api.Errorf(api.CodeNotFound, "artifact %s: not in the cache and not desired; pull it with: modelctl pull URI --name %s", name, name)
	}
	v := d.viewLocked(name, a, want, files)
	v.InUse = holdersOf(uses, name)
	return &v, nil
}

// viewLocked builds the API view, its URIs and messages redacted; called
// with d.mu held.
func (d *Daemon) viewLocked(name string, a *cachestore.Artifact, want map[string]api.Desire, files bool) api.Artifact {
	out := api.Artifact{Name: name, Kind: cachestore.KindModel, Phase: api.PhasePending}
	if ds, ok := want[name]; ok {
		ds := ds
		out.Desire, out.URI, out.Pinned = &ds, ds.URI, ds.Pin
		if ds.Kind == api.KindKernelCache {
			out.Kind = api.KindKernelCache
		}
	}
	var cur *cachestore.Version
	if a != nil {
		for i := range a.Versions {
			v := a.Versions[i]
			if v.Revision == a.Current {
				cur = &a.Versions[i]
			}
			av := api.Version{
				Revision: v.Revision, State: string(v.State), Message: v.Message, ManifestDigest: v.ManifestDigest,
				Bytes: v.Bytes, Pinned: v.Pinned, Created: v.Created, LastUsed: v.LastUsed, Source: v.Source,
			}
			if files {
				for _, e := range v.Manifest {
					av.Files = append(av.Files, api.File{Path: e.Path, Digest: e.Digest, Size: e.Size})
				}
			}
			out.Versions = append(out.Versions, av)
		}
	}
	if cur != nil && files && cur.Metadata != nil {
		m := api.Metadata(*cur.Metadata)
		out.Metadata = &m
	}
	if cur != nil {
		out.Kind, out.Revision, out.ManifestDigest, out.Bytes, out.Pinned = cur.Kind, cur.Revision, cur.ManifestDigest, cur.Bytes, cur.Pinned
		out.KernelCache = kernelCacheInfo(cur)
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
			out.Path = filepath.Join(d.store.TreePath(cur.Kind, name, ""), "current")
		case cachestore.StateMissing: // a re-fetch is due
			out.Phase, out.Message = api.PhasePending, cur.Message
		default:
			out.Phase, out.Message = api.PhaseFailed, cur.Message
		}
	}
	if st := d.arts[name]; st != nil {
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
		}
		out.Attempts = st.attempts
		out.LastPull = st.last
		if !st.nextRetry.IsZero() && st.phase == api.PhaseFailed {
			t := st.nextRetry
			out.NextRetry = &t
		}
	} else if out.Desire == nil && cur != nil && cur.State != cachestore.StateReady {
		out.Message = cur.Message + " (no desire to re-fetch from: pull it again)"
	}
	redactView(&out) // every local user reads views: no credentials in them
	return out
}

// settled reports whether a waiter may stop, and with which error.
func settledErr(a *api.Artifact) error {
	if a.Phase == api.PhaseFailed {
		return api.Errorf(api.CodeFailed, "artifact %s failed: %s", a.Name, a.Message)
	}
	if a.Phase == api.PhaseIncompatible {
		return api.Errorf(api.CodeFailed, "artifact %s is not for this node: %s", a.Name, a.Message)
	}
	return nil
}

func (d *Daemon) handlePull(w http.ResponseWriter, r *http.Request) error {
	var req api.PullRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	ds := req.Desire()
	ds.Origin, ds.Requester = originAPI, requester(r)
	ds, err := d.validateDesire(ds)
	if err != nil {
		return err
	}
	d.mu.Lock()
	err = d.pullConflicts(ds)
	d.mu.Unlock()
	if err != nil {
		return err
	}
	if err := d.checkSourceAccess(r.Context(), ds); err != nil {
		return err
	}
	d.mu.Lock()
	if err := d.pullConflicts(ds); err != nil { // again: the check above ran unlocked
		d.mu.Unlock()
		return err
	}
	if err := d.persistDesire(ds.Name, ds); err != nil {
		d.mu.Unlock()
		return err
	}
	d.apiDesires[ds.Name] = ds
	st := d.arts[ds.Name]
	if st == nil {
		st = &artState{phase: api.PhasePending}
		d.arts[ds.Name] = st
	}
	if st.cancel == nil || st.spec != fingerprint(ds) {
		st.force = true // an explicit pull re-resolves the source
	}
	// Wait for the next pull to finish: the one this request starts, or the
	// one in flight for the same desire (as fresh as a new one would be).
	since := st.completed
	d.notify()
	d.mu.Unlock()
	d.kick()
	if r.URL.Query().Get("wait") != "true" {
		a, err := d.view(ds.Name, false)
		if err != nil {
			return err
		}
		w.WriteHeader(http.StatusAccepted)
		return writeJSON(w, a)
	}
	// The waiter gets the outcome of that pull, even where an older version
	// still satisfies the desire (a refresh that failed is not Ready).
	return d.streamUntil(w, r, ds.Name, 0, func(st *artState) (bool, error) {
		if st == nil || st.completed <= since || st.cancel != nil {
			return false, nil
		}
		return true, st.lastErr
	})
}

// pullConflict refuses a socket pull of a name the node's configuration
// declares: a models.d desire, or a declared model's kernel cache. Called
// with d.mu held.
func (d *Daemon) pullConflict(name string) error {
	if fd, ok := d.fileDesires[name]; ok {
		return api.Errorf(api.CodeConflict, "artifact %s is declared in %s; edit that file instead of pulling it by hand", name, strings.TrimPrefix(fd.Origin, originFile))
	}
	if w, ok := d.desired()[name]; ok && w.Serves != "" && w.Origin != originAPI {
		return api.Errorf(api.CodeConflict, "artifact %s is the kernel cache of %s, declared in %s; pull under another name", name, w.Serves, w.Origin)
	}
	return nil
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

// validateDesire checks a desire from the API or a file and fills defaults.
func (d *Daemon) validateDesire(ds api.Desire) (api.Desire, error) {
	if err := cachestore.ValidateName(ds.Name); err != nil {
		return ds, api.Errorf(api.CodeInvalid, "%v", err)
	}
	if ds.URI == "" {
		return ds, api.Errorf(api.CodeInvalid, "artifact %s: no source URI", ds.Name)
	}
	if _, err := d.fetchers.For(ds.URI); err != nil {
		return ds, api.Errorf(api.CodeInvalid, "artifact %s: %v", ds.Name, err)
	}
	if ds.Digest != "" {
		nd, err := cachestore.NormalizeDigest(ds.Digest)
		if err != nil {
			return ds, api.Errorf(api.CodeInvalid, "artifact %s: --digest %v", ds.Name, err)
		}
		ds.Digest = nd
	}
	switch ds.State {
	case "":
		ds.State = api.StatePresent
	case api.StatePresent, api.StateAbsent:
	default:
		return ds, api.Errorf(api.CodeInvalid, "artifact %s: state %q; want present or absent", ds.Name, ds.State)
	}
	for _, g := range append(append([]string(nil), ds.Include...), ds.Exclude...) {
		if _, err := fetchers.CompileGlob(g); err != nil {
			return ds, api.Errorf(api.CodeInvalid, "artifact %s: %v", ds.Name, err)
		}
	}
	return ds, validateKernelCaches(ds, d.cfg.KernelCacheSignaturePolicy)
}

// validateKernelCaches checks the kernel cache parts of a desire: the kind,
// oci:// sources, names, and signature policies. Over the socket keys and
// trusted roots must be their content (modelctl reads --key and
// --trusted-root files), so no client makes the daemon open a path of its
// choosing, and a policy may not go below the node's floor; a models.d
// file or a ModelCache is the node's configuration and may do both.
func validateKernelCaches(ds api.Desire, floor string) error {
	bad := func(f string, a ...any) error {
		return api.Errorf(api.CodeInvalid, "artifact %s: %s", ds.Name, fmt.Sprintf(f, a...))
	}
	fromSocket := ds.Origin == originAPI
	checkPolicy := func(what string, p *api.SignaturePolicy) error {
		if p == nil {
			return nil
		}
		if p.Policy != "" && p.Policy != api.PolicyRequired && p.Policy != api.PolicyOff {
			return bad("%s: signature policy %q: use required or off", what, p.Policy)
		}
		if fromSocket && p.Policy == api.PolicyOff && floor != api.PolicyOff {
			return api.Errorf(api.CodeForbidden, "artifact %s: %s: this node requires signed kernel caches "+
				"(modelcached --kernel-cache-signature-policy=%s) and a pull may tighten that, never turn it off; "+
				"sign the image (cosign sign --key cosign.key IMAGE) and pull with --key cosign.pub, or declare it in models.d", ds.Name, what, api.PolicyRequired)
		}
		for _, k := range p.Keys {
			if fromSocket && !strings.Contains(k, "-----BEGIN") {
				return bad("%s: a key over the socket must be PEM text (modelctl pull --key FILE sends it so)", what)
			}
		}
		if fromSocket && p.TrustedRoot != "" && !ocifetcher.IsInlineTrustedRoot(p.TrustedRoot) {
			return bad("%s: a trusted root over the socket must be its content, a trusted_root.json or PEM CA bundle (modelctl pull --trusted-root FILE sends it so)", what)
		}
		if (p.Identity != "" || p.IdentityRegexp != "") && p.TrustedRoot == "" {
			return bad("%s: keyless verification needs trustedRoot (a trusted_root.json or PEM CA bundle)", what)
		}
		return nil
	}
	oci := func(u string) bool { return strings.HasPrefix(u, "oci://") }
	switch ds.Kind {
	case "", api.KindModel:
		if ds.Signature != nil {
			return bad("a signature policy applies to kernel caches; put it under kernelCaches")
		}
	case api.KindKernelCache:
		if !oci(ds.URI) {
			return bad("a kernel cache is an OCI image; write oci://<registry>/<repo>:<tag>")
		}
		if len(ds.KernelCaches) > 0 {
			return bad("kernelCaches belong to a model, not to a kernel cache")
		}
		if err := checkPolicy("kernel cache", ds.Signature); err != nil {
			return err
		}
	default:
		return bad("kind %q: use model or kernelcache", ds.Kind)
	}
	for i, kc := range ds.KernelCaches {
		if !oci(kc.URI) {
			return bad("kernelCaches[%d]: %q is not an oci:// image", i, kc.URI)
		}
		if err := cachestore.ValidateName(ds.KernelCacheName(i)); err != nil {
			return bad("kernelCaches[%d]: %v", i, err)
		}
		if err := checkPolicy(fmt.Sprintf("kernelCaches[%d]", i), kc.Signature); err != nil {
			return err
		}
	}
	return nil
}

func (d *Daemon) handleWait(w http.ResponseWriter, r *http.Request) error {
	var timeout time.Duration
	if t := r.URL.Query().Get("timeout"); t != "" {
		var err error
		if timeout, err = time.ParseDuration(t); err != nil || timeout < 0 {
			return api.Errorf(api.CodeInvalid, "timeout %q: want a duration such as 10m", t)
		}
	}
	return d.streamUntil(w, r, r.PathValue("name"), timeout, func(st *artState) (bool, error) { return st == nil || st.cancel == nil, nil })
}

// streamHeartbeat is the longest a stream goes without a line: a pending
// artifact is written again, so every stream keeps writing.
const streamHeartbeat = time.Second

// streamUntil writes the artifact as JSON lines on every change and every
// streamHeartbeat until it is Ready or Failed and done(state) holds, the
// timeout passes or the client goes. Each line renews the connection's
// write deadline (statusWriter), so a stream lives as long as its peer
// reads it; a peer that closes the connection cancels the request (the
// server watches the read side once the body is read), and a peer that
// stops reading fails a write SocketWriteTimeout after the socket's
// buffers fill.
func (d *Daemon) streamUntil(w http.ResponseWriter, r *http.Request, name string, timeout time.Duration, done func(*artState) (bool, error)) error {
	// Read what is left of the body (a decoded request leaves at most a
	// newline; the read timeout still bounds it): at its end the server
	// starts watching the connection for the client going away.
	io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
	ctx := r.Context()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	rc := http.NewResponseController(w)
	tick := time.NewTicker(streamHeartbeat)
	defer tick.Stop()
	for {
		d.mu.Lock()
		changed := d.changed
		fin, pullErr := done(d.arts[name])
		d.mu.Unlock()
		a, err := d.view(name, false)
		if err != nil {
			var e *api.Error
			if !errors.As(err, &e) || e.Code != api.CodeNotFound {
				enc.Encode(api.Event{Error: toAPIError(err)})
				return nil
			}
			a = &api.Artifact{Name: name, Phase: api.PhasePending, Message: "not desired yet; waiting for a pull or a desire"}
		}
		settled := a.Phase == api.PhaseReady || a.Phase == api.PhaseFailed || a.Phase == api.PhaseIncompatible
		if fin && pullErr != nil {
			msg := fmt.Sprintf("pull of %s failed: %v", name, pullErr)
			if a.Path != "" { // an older version is Ready
				msg += fmt.Sprintf(" (revision %s is still served)", a.Revision)
			}
			enc.Encode(api.Event{Artifact: a, Error: api.Errorf(api.CodeFailed, "%s", msg)})
			rc.Flush()
			return nil
		}
		if fin && settled {
			if err := settledErr(a); err != nil {
				enc.Encode(api.Event{Artifact: a, Error: toAPIError(err)})
			} else {
				enc.Encode(api.Event{Artifact: a, Done: true})
			}
			rc.Flush()
			return nil
		}
		if err := enc.Encode(api.Event{Artifact: a}); err != nil {
			return nil // the client went away
		}
		if err := rc.Flush(); err != nil {
			return nil // the client went away or stopped reading
		}
		select {
		case <-ctx.Done():
			if r.Context().Err() == nil {
				enc.Encode(api.Event{Artifact: a, Error: api.Errorf(api.CodeTimeout, "artifact %s is still %s after %s", name, a.Phase, timeout)})
			}
			return nil
		case <-changed:
		case <-tick.C:
		}
	}
}

func (d *Daemon) handlePin(pin bool) handler {
	return func(w http.ResponseWriter, r *http.Request) error {
		name := r.PathValue("name")
		d.mu.Lock()
		ds, isAPI := d.apiDesires[name]
		if isAPI {
			ds.Pin = pin
			if err := d.persistDesire(name, ds); err != nil {
				d.mu.Unlock()
				return err
			}
			d.apiDesires[name] = ds
		}
		d.mu.Unlock()
		err := d.store.SetPinned(name, "", pin)
		if err != nil && !(isAPI && errors.Is(err, cachestore.ErrNotFound)) {
			return err
		}
		a, err := d.view(name, false)
		if err != nil {
			return err
		}
		return writeJSON(w, a)
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
	var kernels []string // the kernel caches the model's desire lists go with it
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
	if err := d.scan(); err != nil {
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
		d.mu.Lock()
		if hadDesire {
			if err := d.store.DeleteDesire(name); err != nil {
				d.mu.Unlock()
				return err
			}
			delete(d.apiDesires, name)
		}
		if st := d.arts[name]; st != nil && st.cancel != nil {
			st.cancel()
			inFlight = st.done
		}
		d.notify()
		d.mu.Unlock()
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
	case errors.Is(err, cachestore.ErrNotFound) && hadDesire && rev == "":
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
		want := d.desired()
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

// maxLeaseTTL bounds a lease: a holder that dies stops protecting the
// artifact within this long.
const maxLeaseTTL = time.Hour

func (d *Daemon) handleLease(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	var req api.LeaseRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	ttl, err := time.ParseDuration(req.TTL)
	if err != nil || ttl <= 0 || ttl > maxLeaseTTL {
		return api.Errorf(api.CodeInvalid, "lease ttl %q: want a duration between 1s and %s, renewed before it ends", req.TTL, maxLeaseTTL)
	}
	if req.Holder == "" || len(req.Holder) > 253 {
		return api.Errorf(api.CodeInvalid, "lease holder %q: want a non-empty id of at most 253 bytes (a pod, a job, a host:pid)", req.Holder)
	}
	a, err := d.store.Summary(name)
	if err != nil {
		return err
	}
	if len(a.Versions) == 0 || a.Versions[0].Revision != a.Current || a.Versions[0].State != cachestore.StateReady {
		return api.Errorf(api.CodeConflict, "artifact %s has no Ready version to lease; wait for it first (modelctl wait %s)", name, name)
	}
	d.mu.Lock()
	ls := d.leases[name]
	if ls == nil {
		ls = map[string]*lease{}
		d.leases[name] = ls
	}
	l, ok := ls[req.Holder]
	if !ok || time.Now().After(l.expires) {
		l = &lease{rev: a.Current} // a renewal keeps the revision first leased
		ls[req.Holder] = l
	}
	l.expires = time.Now().Add(ttl)
	out := api.Lease{Name: name, Revision: l.rev, Holder: req.Holder, Expires: l.expires}
	d.notify()
	d.mu.Unlock()
	d.store.Touch(name, out.Revision)
	return writeJSON(w, out)
}

func (d *Daemon) handleRelease(w http.ResponseWriter, r *http.Request) error {
	name, holder := r.PathValue("name"), r.URL.Query().Get("holder")
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.leases[name][holder]; !ok {
		return api.Errorf(api.CodeNotFound, "artifact %s: no lease held by %q", name, holder)
	}
	delete(d.leases[name], holder)
	d.notify()
	return writeJSON(w, map[string]string{"released": holder})
}

func (d *Daemon) handleGPU(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, d.gpus)
}

func (d *Daemon) handleEnv(w http.ResponseWriter, r *http.Request) error {
	env, err := d.env(r.PathValue("name"))
	if err != nil {
		return err
	}
	return writeJSON(w, env)
}
