package daemon

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"k8s.io/client-go/rest"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/daemon/capacity"
	"github.com/modelcache/modelcache/daemon/kernels"
	"github.com/modelcache/modelcache/fetchers"
	ngcfetcher "github.com/modelcache/modelcache/fetchers/ngc"
	"github.com/modelcache/modelcache/k8ssync"
)

// clusterNode is the daemon as k8ssync sees it (k8ssync.Node): the
// cluster's desires and pod holders go in, views and resolutions come out.
type clusterNode struct{ d *Daemon }

// SetClusterDesires replaces the desires that come from ModelCache objects
// and persists them, so a restart without the API server still knows
// them. Credentials stay in memory only. A file or API desire of the same
// name wins.
//
// Each desire is validated on its own: one the daemon refuses is left out
// and shown as Failed (InvalidSpec, with the reason) while the others
// apply; the error returned names every refused one.
func (c clusterNode) SetClusterDesires(want map[string]api.Desire, creds map[string]map[string]string) error {
	d := c.d
	// desires.writeMu keeps other writers of desires out while the index is
	// written (fsyncs) without the daemon lock; desires.cluster is replaced
	// only under both, so reading it under desires.writeMu is safe.
	d.desires.writeMu.Lock()
	defer d.desires.writeMu.Unlock()
	changed := d.sources.SetCredentials(creds)
	d.mu.Lock()
	retry := false
	for name, st := range d.arts {
		// Credentials that changed (a rotated token in the Secret) may
		// cure a failed pull, an AccessDenied too: retry it now.
		if st.phase == api.PhaseFailed && st.cancel == nil && changed[name] {
			st.permanent, st.nextRetry, retry = false, time.Time{}, true
		}
	}
	old := d.desires.cluster
	d.mu.Unlock()
	if retry {
		d.kick()
	}
	valid := make(map[string]api.Desire, len(want))
	rejected := map[string]string{}
	var errs []error
	for name, ds := range want {
		ds.Credentialed = d.sources.Credentialed(context.Background(), ds) // private unless spec.public (tenancy.go)
		if o, ok := old[name]; ok && reflect.DeepEqual(o, ds) {
			valid[name] = ds
			continue
		}
		_, err := d.validateDesire(ds)
		if err == nil {
			err = d.sources.CheckClusterSource(ds)
		}
		if err != nil {
			rejected[name] = fmt.Sprintf("refused the ModelCache's desire: %v", err)
			errs = append(errs, fmt.Errorf("desire %s from the cluster: %w", name, err))
			continue
		}
		valid[name] = ds
	}
	d.mu.Lock()
	if !reflect.DeepEqual(rejected, d.desires.rejected) {
		d.desires.rejected = rejected
		d.notify()
	}
	d.mu.Unlock()
	if reflect.DeepEqual(valid, old) {
		return errors.Join(errs...)
	}
	for name, ds := range valid {
		if o, ok := old[name]; ok && reflect.DeepEqual(o, ds) {
			continue
		}
		if err := d.desires.persist(clusterKey+name, ds); err != nil {
			return err
		}
	}
	for name := range old {
		if _, ok := valid[name]; !ok {
			if err := d.desires.unpersist(clusterKey + name); err != nil {
				return err
			}
		}
	}
	d.mu.Lock()
	retryOnNewClusterDigest(d.arts, old, valid)
	d.desires.cluster = valid
	d.desires.publish()
	d.notify()
	d.mu.Unlock()
	d.kick()
	return errors.Join(errs...)
}

// Artifacts is the list view (phases, revisions, bytes, holders, the last
// pull's speed).
func (c clusterNode) Artifacts() ([]api.Artifact, error) { return viewsOf(c.d).list() }

// StatusNow is the daemon's status.
func (c clusterNode) StatusNow() (*api.Status, error) { return viewsOf(c.d).status() }

// GPUs is the node's inventory.
func (c clusterNode) GPUs() api.GPUInventory { return kernels.GPUView(c.d.kernels.GPUs()) }

// Root is the store root.
func (c clusterNode) Root() string { return c.d.store.Root() }

// Changed returns a channel closed at the next change of any artifact.
func (c clusterNode) Changed() <-chan struct{} { return c.d.Changed() }

// SetPodHolders records which artifacts running pods use (from the
// cluster): name → holders. They count as in use like leases. names maps
// the UID of each pod on this node to its "namespace/name": a CSI hold
// found again in the mount table knows only the pod's UID, and is shown
// under the pod's name once the cluster names it.
func (c clusterNode) SetPodHolders(h map[string][]api.Holder, names map[string]string) {
	d := c.d
	d.mu.Lock()
	defer d.mu.Unlock()
	if reflect.DeepEqual(h, d.podHolders) && reflect.DeepEqual(names, d.podNames) {
		return
	}
	d.podHolders, d.podNames = h, names
	d.notify()
	d.kick() // an absent artifact a pod let go of may go now
}

// syncConfig is the configuration of the daemon's sync with the cluster
// (nil: standalone): its logger, and the peer port it advertises.
func (c clusterNode) syncConfig() *k8ssync.Config {
	if c.d.cfg.Cluster == nil {
		return nil
	}
	cfg := *c.d.cfg.Cluster
	if cfg.Log == nil {
		cfg.Log = c.d.log.With("component", "k8ssync")
	}
	cfg.PeerAddress = c.d.fanout.Advertised()
	if c.d.cfg.Peer != nil {
		cfg.OriginConcurrency = c.d.cfg.Peer.OriginConcurrency // recorded as the leader (status.resolved[].originNodes)
	}
	return &cfg
}

// SetPeerNodes takes the nodes k8ssync learned from the ModelCaches'
// status.peers (the elected daemon publishes them; no daemon watches
// every ModelCacheNode) and this node's own: the peers a pull asks for
// the blobs of a revision the cluster resolved, and the nodes that want
// it (daemon/fanout).
func (c clusterNode) SetPeerNodes(nodes []k8ssync.ModelCacheNode) {
	if c.d.fanout != nil {
		c.d.fanout.SetNodes(nodes)
	}
}

// kept names the versions a coordinated rollout keeps besides the
// current ones (capacity.Evictor.Kept): the revision a staged desire
// prefetched, and the revisions a desire retains (the previous one, for
// spec.rollout.retainOld).
func (d *Daemon) kept() map[string]string {
	d.mu.Lock()
	want := d.desires.merged()
	cluster := d.desires.cluster
	d.mu.Unlock()
	out := map[string]string{}
	for name, ds := range want {
		for _, r := range ds.Retain {
			out[capacity.Key(name, r)] = "retained after a rollout (spec.rollout.retainOld)"
		}
		if !ds.Stage {
			if _, ok := cluster[name]; !ok {
				continue
			}
		}
		// What the desire wants now, staged or waiting for the move of
		// current after the flip: an eviction pass between the flip and
		// that move must not take it (the move itself waits for a pass
		// to finish: activate).
		a, err := d.store.Summary(name)
		if err != nil {
			continue
		}
		fp := fingerprint(ds)
		for _, v := range a.Versions {
			if v.Spec == fp && v.Revision != a.Current {
				out[capacity.Key(name, v.Revision)] = "prefetched for a rollout"
			}
		}
	}
	return out
}

// Resolve pins a desire's source once for the whole cluster (k8ssync's
// elected daemon calls it, with the ModelCache Secret's credentials): the
// immutable revision, and the URI that names exactly it where the scheme
// has one (pinnedURI). Nothing is fetched beyond what resolution reads.
func (c clusterNode) Resolve(ctx context.Context, ds api.Desire, creds map[string]string) (revision, pinned string, err error) {
	d := c.d
	src, err := parseSource(ds.URI)
	if err != nil {
		return "", "", err
	}
	f, err := d.sources.FetcherWith(ds, src.scheme, creds)
	if err != nil {
		return "", "", err
	}
	res, err := f.Resolve(ctx, fetchers.Source{URI: ds.URI, Include: ds.Include, Exclude: ds.Exclude, KernelCache: ds.Kind == api.KindKernelCache, As: d.sources.ReadAs(ds)})
	if err != nil {
		return "", "", redactedError{err}
	}
	return res.Revision, pinnedURI(src, res), nil
}

// pinnedURI is the URI that names exactly the revision res resolved to,
// where the scheme has such a form: hf://org/repo@<commit>,
// oci://registry/repo@sha256:<hex>, ngc://org[/team]/model:<version>.
// Other schemes (s3, http, file) have none: the URI stays as given and
// the cluster's folder checksum (api.Desire.ClusterDigest) pins the bytes.
func pinnedURI(src source, res *fetchers.Resolved) string {
	if res.Revision == "" {
		return src.uri
	}
	switch src.scheme {
	case "hf":
		if res.Repo != "" {
			return "hf://" + res.Repo + "@" + res.Revision
		}
	case "oci":
		ref := strings.TrimPrefix(src.uri, "oci://")
		ref, _, _ = strings.Cut(ref, "@")
		if i := strings.LastIndexByte(ref, ':'); i > strings.LastIndexByte(ref, '/') {
			ref = ref[:i] // the tag
		}
		return "oci://" + ref + "@sha256:" + res.Revision
	case "ngc":
		r, err := ngcfetcher.ParseURI(src.uri)
		if err == nil {
			r.Version = res.Revision
			return r.String()
		}
	}
	return src.uri
}

// kube is the API server's client config (the peer port's TokenReviews
// and node selections), nil outside a cluster.
func (d *Daemon) kube() *rest.Config {
	if d.cfg.Cluster == nil {
		return nil
	}
	return d.cfg.Cluster.Kube
}

// retryOnNewClusterDigest clears the "not retried" of a pull that failed
// SourceChanged on the cluster's folder checksum when the cluster's
// record of that checksum changes (the elected daemon dropped a forged
// one, or the nodes agreed on another): the next reconcile pulls again,
// from the blobs already held. Called with the daemon lock held.
func retryOnNewClusterDigest(arts pullStates, old, now map[string]api.Desire) {
	for name, ds := range now {
		o, ok := old[name]
		if !ok || (o.Digest == ds.Digest && o.ClusterDigest == ds.ClusterDigest) {
			continue
		}
		if st := arts[name]; st != nil && st.phase == api.PhaseFailed && st.reason == api.ReasonSourceChanged && st.cancel == nil {
			st.permanent, st.nextRetry = false, time.Time{}
		}
	}
}

// clusterDigestMoved says whether the cluster's desire of ds's name
// (among cluster, the cluster's desires) now records another folder
// checksum than ds was pulled with. Called with the daemon lock held.
func clusterDigestMoved(cluster map[string]api.Desire, ds api.Desire) bool {
	cd, ok := cluster[ds.Name]
	return ok && ds.ClusterDigest && (cd.Digest != ds.Digest || !cd.ClusterDigest)
}
