package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/sources"
	"github.com/modelcache/modelcache/fetchers"
	ocifetcher "github.com/modelcache/modelcache/fetchers/oci"
)

// declared: the node's configuration declares the desire (a ModelCache,
// a models.d file, a model's kernel cache) or its requester did (pull
// --pin, pull --keep); the rest are ad-hoc entries, which admission may
// evict to make room (docs/operator.md: Who may evict what).
func declared(ds api.Desire) bool {
	return ds.Origin != sources.OriginAPI || ds.Pin || ds.Keep || ds.Serves != ""
}

// fingerprint identifies what a desire asks the store for; a change of it
// means a new pull.
func fingerprint(ds api.Desire) string {
	// The URI as stored: a credential that changes (a rotated token, a
	// new presigned signature) is not a new spec, and one lost in a
	// restart (never written to disk) does not make the desire look new.
	digest := ds.Digest
	if ds.ClusterDigest {
		digest = "" // recorded by the cluster after this node may have committed (api.Desire)
	}
	parts := []any{fetchers.RedactURI(ds.URI), digest, ds.Include, ds.Exclude}
	if ds.Kind == api.KindKernelCache { // models keep the fingerprint they always had
		parts = append(parts, ds.Kind, ds.Signature)
	}
	if ds.Revision != "" {
		// The cluster's revision of a source without a pinned form (an S3
		// prefix, a URL): a new one is a new spec. Stage and Retain are
		// not: a staged version becomes current without a pull.
		parts = append(parts, ds.Revision)
	}
	b, _ := json.Marshal(parts)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// desireSet is what the node is asked to hold, by origin: the socket's
// desires (persisted under their names), the models dir's (file,
// with the problems found in it) and the cluster's (persisted under
// cluster:<name>; rejected holds those refused, with why).
//
// writeMu serialises changes with their index writes; the maps change
// only with writeMu and the daemon lock both held, and are read with the
// daemon lock held (readers join them with the artifacts' states).
type desireSet struct {
	records *cachestore.Records
	writeMu sync.Mutex

	api, file, cluster map[string]api.Desire
	rejected           map[string]string
	fileErrors         []string
}

func newDesireSet(records *cachestore.Records) *desireSet {
	return &desireSet{records: records, api: map[string]api.Desire{}, file: map[string]api.Desire{}, cluster: map[string]api.Desire{}}
}

// merged merges the origins: a file desire wins over a cluster one,
// which wins over an API one. Called with the daemon lock held.
func (s *desireSet) merged() map[string]api.Desire {
	out := make(map[string]api.Desire, len(s.api)+len(s.file)+len(s.cluster))
	for n, ds := range s.api {
		out[n] = ds
	}
	for n, ds := range s.cluster {
		out[n] = ds
	}
	for n, ds := range s.file {
		out[n] = ds
	}
	// Expand in name order: where two models name the same kernel cache,
	// the same one wins every time (a declared model over a socket one,
	// then the first by name), so pulls do not flip between them.
	var models []string
	for n, ds := range out {
		if len(ds.KernelCaches) > 0 {
			models = append(models, n)
		}
	}
	sort.Strings(models)
	for _, n := range models {
		expandKernelCaches(out, out[n])
	}
	return out
}

// loadDesires reads the desires the index keeps (socket pulls and the
// cluster's last known set) into memory (New).
func (s *desireSet) load(log *slog.Logger) error {
	raw, err := s.records.Desires()
	if err != nil {
		return err
	}
	for name, b := range raw {
		var ds api.Desire
		if err := json.Unmarshal(b, &ds); err != nil {
			log.Error("dropping an unreadable desire from the index", "artifact", name, "err", err)
			continue
		}
		if n, ok := isClusterKey(name); ok {
			s.cluster[n] = ds
			continue
		}
		s.api[name] = trustSocketDesire(ds, log)
	}
	return nil
}

// persistDesire writes ds to the index under key with its credentials
// redacted: a secret carried in a source URI lives only in memory, for
// fetching. After a restart such a desire cannot fetch until it is pulled
// again (lostCredentials says so).
func (s *desireSet) persist(key string, ds api.Desire) error {
	raw, err := json.Marshal(redactDesire(ds))
	if err != nil {
		return err
	}
	return s.records.PutDesire(key, raw)
}

// unpersist removes the desire under key from the index.
func (s *desireSet) unpersist(key string) error { return s.records.DeleteDesire(key) }

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
		a, err := views{d}.view(ds.Name, false)
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
	return views{d}.streamUntil(w, r, ds.Name, 0, nil, func(st *artState) (bool, error) {
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

// validateDesire checks a desire from the API or a file and fills defaults.
func (d *Daemon) validateDesire(ds api.Desire) (api.Desire, error) {
	if err := cachestore.ValidateName(ds.Name); err != nil {
		return ds, api.Errorf(api.CodeInvalid, "%v", err)
	}
	if ds.URI == "" {
		return ds, api.Errorf(api.CodeInvalid, "artifact %s: no source URI", ds.Name)
	}
	if err := checkURISizes(ds); err != nil {
		return ds, err
	}
	if err := d.sources.Known(ds.URI); err != nil {
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
	if ds.LocalGroup != "" {
		if _, err := localGroupID(ds.LocalGroup); err != nil {
			return ds, api.Errorf(api.CodeInvalid, "artifact %s: localGroup: %v", ds.Name, err)
		}
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
	fromSocket := ds.Origin == sources.OriginAPI
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
			d.mu.Unlock()
		}
		d.desires.writeMu.Unlock()
		err := d.store.SetPinned(name, "", pin)
		if err != nil && !(isAPI && errors.Is(err, cachestore.ErrNotFound)) {
			return err
		}
		a, err := views{d}.view(name, false)
		if err != nil {
			return err
		}
		return writeJSON(w, a)
	}
}

func isClusterKey(k string) (string, bool) { return strings.CutPrefix(k, clusterKey) }

// expandKernelCaches adds the kernel cache desires a model desire lists;
// they follow the model's state and pin. Called with d.mu held.
func expandKernelCaches(out map[string]api.Desire, model api.Desire) {
	for i, kc := range model.KernelCaches {
		name := model.KernelCacheName(i)
		if prev, taken := out[name]; taken && (model.Origin == sources.OriginAPI || prev.Origin != sources.OriginAPI) {
			continue // an explicit desire of that name wins, unless a socket pull took a declared model's name
		}
		out[name] = api.Desire{Name: name, URI: kc.URI, Kind: api.KindKernelCache, Signature: kc.Signature,
			Serves: model.Name, State: model.State, Pin: model.Pin, Origin: model.Origin, AllowedNamespaces: model.AllowedNamespaces}
	}
}

// clusterKey prefixes the index keys of desires from the cluster; a colon
// is never part of an artifact name, so they cannot meet API desires.
const clusterKey = "cluster:"
