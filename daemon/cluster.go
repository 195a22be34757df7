package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/daemon/capacity"
	"github.com/modelcache/modelcache/fetchers"
	hffetcher "github.com/modelcache/modelcache/fetchers/hf"
	httpfetcher "github.com/modelcache/modelcache/fetchers/http"
	ocifetcher "github.com/modelcache/modelcache/fetchers/oci"
)

// clusterKey prefixes the index keys of desires from the cluster; a colon
// is never part of an artifact name, so they cannot meet API desires.
const clusterKey = "cluster:"

// The daemon as k8ssync sees it (k8ssync.Node).

// SetClusterDesires replaces the desires that come from ModelCache objects
// and persists them, so a restart without the API server still knows
// them. Credentials stay in memory only. A file or API desire of the same
// name wins.
//
// Each desire is validated on its own: one the daemon refuses is left out
// and shown as Failed (InvalidSpec, with the reason) while the others
// apply; the error returned names every refused one.
func (d *Daemon) SetClusterDesires(want map[string]api.Desire, creds map[string]map[string]string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.creds = creds
	valid := make(map[string]api.Desire, len(want))
	rejected := map[string]string{}
	var errs []error
	for name, ds := range want {
		if old, ok := d.clusterDesires[name]; ok && reflect.DeepEqual(old, ds) {
			valid[name] = ds
			continue
		}
		if _, err := d.validateDesire(ds); err != nil {
			rejected[name] = fmt.Sprintf("refused the ModelCache's desire: %v", err)
			errs = append(errs, fmt.Errorf("desire %s from the cluster: %w", name, err))
			continue
		}
		valid[name] = ds
	}
	if !reflect.DeepEqual(rejected, d.clusterRejected) {
		d.clusterRejected = rejected
		d.notify()
	}
	want = valid
	if reflect.DeepEqual(want, d.clusterDesires) {
		return errors.Join(errs...)
	}
	for name, ds := range want {
		if old, ok := d.clusterDesires[name]; ok && reflect.DeepEqual(old, ds) {
			continue
		}
		if err := d.persistDesire(clusterKey+name, ds); err != nil {
			return err
		}
	}
	for name := range d.clusterDesires {
		if _, ok := want[name]; !ok {
			if err := d.store.DeleteDesire(clusterKey + name); err != nil {
				return err
			}
		}
	}
	d.clusterDesires = want
	d.notify()
	d.kick()
	return errors.Join(errs...)
}

// Artifacts is the list view (phases, revisions, bytes, holders, the last
// pull's speed).
func (d *Daemon) Artifacts() ([]api.Artifact, error) { return d.list() }

// StatusNow is the daemon's status.
func (d *Daemon) StatusNow() (*api.Status, error) { return d.status() }

// GPUs is the node's inventory.
func (d *Daemon) GPUs() api.GPUInventory { return d.gpus }

// Root is the store root.
func (d *Daemon) Root() string { return d.store.Root() }

// Changed returns a channel closed at the next change of any artifact.
func (d *Daemon) Changed() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.changed
}

// SetPodHolders records which artifacts running pods use (from the
// cluster): name → holders. They count as in use like leases.
func (d *Daemon) SetPodHolders(h map[string][]api.Holder) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if reflect.DeepEqual(h, d.podHolders) {
		return
	}
	d.podHolders = h
	d.notify()
	d.kick() // an absent artifact a pod let go of may go now
}

// podUses adds pod holders to an in-use map (name@rev keys); a pod holds
// the version that is current (what its mount resolves to). Called with
// d.mu held.
func (d *Daemon) podUses(out map[string][]capacity.Holder) {
	for name, hs := range d.podHolders {
		a, err := d.store.Summary(name)
		if err != nil || a.Current == "" {
			continue
		}
		for _, h := range hs {
			k := capacity.Key(name, a.Current)
			out[k] = append(out[k], capacity.Holder{Kind: h.Kind, ID: h.ID, Revision: a.Current})
		}
	}
}

// credentialsFor returns the in-memory credentials of a cluster desire.
func (d *Daemon) credentialsFor(name string) map[string]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c, ok := d.creds[name]; ok {
		return c
	}
	// A kernel cache that a ModelCache lists uses the model's credentials:
	// only one the daemon expanded from that model's own desire, for the
	// URI the model names. Nothing from the socket can claim them.
	want := d.desired()
	if ds, ok := want[name]; ok && ds.Serves != "" {
		if model, ok := want[ds.Serves]; ok && model.Origin == ds.Origin && listsKernelCache(model, name, ds.URI) {
			return d.creds[ds.Serves]
		}
	}
	return nil
}

func isClusterKey(k string) (string, bool) { return strings.CutPrefix(k, clusterKey) }

// fetcherFor returns the fetcher of a desire: the shared one, or one
// made with the desire's credentials from a Secret (HF_TOKEN;
// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN;
// .dockerconfigjson; NGC_API_KEY), kept while the credentials stay the same.
func (d *Daemon) fetcherFor(ds api.Desire) (fetchers.Fetcher, error) {
	creds := d.credentialsFor(ds.Name)
	if ds.CredentialsFile != "" && strings.HasPrefix(ds.Origin, originFile) {
		var err error
		if creds, err = readCredentialsFile(ds.CredentialsFile); err != nil {
			return nil, fetchers.Permanent(fmt.Errorf("credentials of %s: %w", ds.Name, err))
		}
	}
	scheme, err := fetchers.Scheme(ds.URI)
	if err != nil || len(creds) == 0 {
		return d.fetchers.For(ds.URI)
	}
	b, _ := json.Marshal(creds)
	sum := sha256.Sum256(append([]byte(scheme+"\x00"), b...))
	key := hex.EncodeToString(sum[:])
	d.mu.Lock()
	f, ok := d.credFetchers[key]
	d.mu.Unlock()
	if ok {
		return f, nil
	}
	switch scheme {
	case "hf":
		tok := creds["HF_TOKEN"]
		if tok == "" {
			return d.fetchers.For(ds.URI)
		}
		hub, err := d.newHub(hffetcher.WithToken(tok))
		if err != nil {
			return nil, err
		}
		f = hub
	case "s3":
		if creds["AWS_ACCESS_KEY_ID"] == "" {
			return d.fetchers.For(ds.URI)
		}
		f = d.newS3().WithStaticCredentials(creds["AWS_ACCESS_KEY_ID"], creds["AWS_SECRET_ACCESS_KEY"], creds["AWS_SESSION_TOKEN"])
	case "oci":
		cfg := creds[".dockerconfigjson"]
		if cfg == "" {
			return d.fetchers.For(ds.URI)
		}
		kc, err := ocifetcher.DockerConfigKeychain([]byte(cfg))
		if err != nil {
			return nil, fetchers.Permanent(fmt.Errorf("credentials of %s: %w", ds.Name, err))
		}
		f = ocifetcher.New(append(d.ociOpts, ocifetcher.WithKeychain(kc))...)
	case "ngc":
		if f, err = d.ngcWithCredentials(creds); err != nil {
			return nil, err
		} else if f == nil {
			return d.fetchers.For(ds.URI)
		}
	case "http", "https":
		auth := creds["HTTP_AUTHORIZATION"]
		if auth == "" {
			return d.fetchers.For(ds.URI)
		}
		f = d.newHTTP(httpfetcher.WithAuthorization(auth))
	default:
		return d.fetchers.For(ds.URI)
	}
	d.mu.Lock()
	d.credFetchers[key] = f
	d.mu.Unlock()
	return f, nil
}
