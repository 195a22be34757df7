package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/fanout"
	"github.com/modelcache/modelcache/daemon/sources"
	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/k8ssync"
)

// declared: the node's configuration declares the desire (a ModelCache,
// a models.d file, a model's kernel cache) or its requester did (pull
// --pin, pull --keep); the rest are ad-hoc entries, which admission may
// evict to make room (docs/capacity.md: Who may evict what).
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

	// access is what the merged desires say of each artifact, for the
	// peer port (package fanout), which reads it without the daemon lock:
	// publish replaces it after each change of the maps.
	access fanout.AccessTable

	// fileStamps are the models.d files' mtimes at the last load: a file
	// touched since retries its Failed desires (modelsdir.go).
	fileStamps map[string]time.Time
}

// publish gives the peer port what the desires now say of each artifact
// (fanout.Access); called with the daemon lock held after each change of
// the maps.
func (s *desireSet) publish() {
	want := s.merged()
	m := make(map[string]fanout.Access, len(want))
	for n, ds := range want {
		a := fanout.Access{Public: !private(ds)}
		if len(ds.AllowedNamespaces) > 0 {
			a.ModelCache, _ = k8ssync.ModelCacheOf(ds)
		}
		m[n] = a
	}
	s.access.Set(m)
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
			Serves: model.Name, State: model.State, Pin: model.Pin, Origin: model.Origin, AllowedNamespaces: model.AllowedNamespaces,
			LocalGroup: model.LocalGroup, Public: model.Public, Credentialed: credentialed(model)}
	}
}

// clusterKey prefixes the index keys of desires from the cluster; a colon
// is never part of an artifact name, so they cannot meet API desires.
const clusterKey = "cluster:"
