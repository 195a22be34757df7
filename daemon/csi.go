package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"golang.org/x/sync/singleflight"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/csi"
	"github.com/modelcache/modelcache/daemon/capacity"
	"github.com/modelcache/modelcache/daemon/kernels"
)

// The daemon as the CSI driver sees it (csi.Backend): a pod's volume
// holds one exact revision, recorded in the index under csiHoldKey(id) so
// the hold outlives restarts, and counted in inUse (csiUses) so eviction
// never takes it and list/inspect show the pod.

const csiHoldPrefix = "csi:"

func csiHoldKey(id string) string { return csiHoldPrefix + id }

// csiVolumes is the daemon seen through csi.Backend: the volumes pods
// hold, each one exact revision (and its kernel caches' with
// kernelCaches: auto). It reads the store and the GPUs, asks the rest of
// the daemon (host) for desires and views; the holds are its own.
type csiVolumes struct {
	// Set once in New, read without a lock.
	cfg     Config
	log     *slog.Logger
	store   *cachestore.Store
	records *cachestore.Records
	kernels *kernels.Set
	warming *warming
	writeMu *sync.Mutex // the desires' writers' (desires.writeMu): hold records are written under it
	host    volumeHost
	// kept: the writable layers kept past their volumes for capture
	// (kept.go); nil without --csi-socket.
	kept *keptLayers
	// flight: one Hold per volume id at a time, outside every other lock.
	flight singleflight.Group

	mu    sync.Mutex // guards holds; taken after the daemon lock, nothing under it
	holds map[string]csi.Volume
}

// volumeHost is what the volumes ask of the rest of the daemon. Each
// takes the daemon lock itself: none is called with a lock of the
// volumes held.
type volumeHost struct {
	desired func() map[string]api.Desire             // the merged desires
	changed func()                                   // wakes the daemon's waiters
	kick    func()                                   // asks the reconciler for a pass
	view    func(name string) (*api.Artifact, error) // the artifact as a socket reader sees it
}

// held is the hold of a volume id, if any.
func (c *csiVolumes) held(id string) (csi.Volume, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	v, ok := c.holds[id]
	return v, ok
}

// load reads the recorded CSI holds into memory (New).
func (c *csiVolumes) load() {
	c.holds = map[string]csi.Volume{}
	raw, err := c.records.Holds()
	if err != nil {
		c.log.Error("reading CSI holds from the index", "err", err)
		return
	}
	for k, b := range raw {
		id, ok := strings.CutPrefix(k, csiHoldPrefix)
		if !ok {
			continue
		}
		var v csi.Volume
		if err := json.Unmarshal(b, &v); err != nil || v.ID != id {
			c.log.Error("dropping an unreadable CSI hold from the index", "key", k, "err", err)
			c.records.DeleteHold(k)
			continue
		}
		c.holds[id] = v
	}
	c.rediscover()
	if len(c.holds) > 0 && c.cfg.CSI == nil {
		c.log.Warn("the index records CSI volumes but --csi-socket is off; their revisions stay held until the driver runs and kubelet unpublishes them", "volumes", len(c.holds))
	}
}

// rediscoverCSIMounts holds again what pods still mount when the records
// of it are gone (the index and the copies under holds/ both lost, or a
// mount older than the records): every mount under kubelet's pods
// directory that shows a version's tree of this store, found in the mount
// table (csi.FindBinds), becomes a hold of that version, under the
// volume ID kubelet recorded in vol_data.json beside it. The pod's name
// is not in the mount table; the holder shows as "pod uid <uid>" until the
// cluster sync names the pod of that UID (SetPodHolders), and the hold
// lasts until kubelet unpublishes the volume. A mount of a hold's composed tree whose record
// is lost cannot say which versions it shows; it is logged and left.
// Called from New, before anything can evict.
func (c *csiVolumes) rediscover() {
	if c.cfg.CSI == nil {
		return
	}
	pods := c.cfg.CSI.PodsDir
	if pods == "" {
		pods = csi.DefaultPodsDir
	}
	binds, err := csi.FindBinds(pods, c.store.Root())
	if err != nil {
		c.log.Error("csi: reading the mount table for volumes the records lost", "err", err)
		return
	}
	held := map[string]bool{}
	for _, v := range c.holds {
		held[filepath.Clean(v.Target)] = true
	}
	for _, b := range binds {
		v := b.Volume
		if held[filepath.Clean(v.Target)] {
			continue
		}
		parts, ok := cachestore.InTrees(b.Rel)
		if !ok || len(parts) != 2 {
			c.log.Warn("csi: a pod mounts a directory of the store that no hold record names; left as it is", "target", v.Target, "dir", b.Rel)
			continue
		}
		v.Model, v.Revision, v.KernelCaches = parts[0], parts[1], "none"
		if _, ok := readyVersion(c.store, v.Model, v.Revision); !ok {
			c.log.Warn("csi: a pod mounts a tree the index has no Ready version of; not held", "target", v.Target, "artifact", v.Model, "revision", v.Revision)
			continue
		}
		raw, err := json.Marshal(v)
		if err == nil {
			err = c.records.PutHold(csiHoldKey(v.ID), raw)
		}
		if err != nil {
			c.log.Error("csi: recording the hold of a rediscovered volume", "volume", v.ID, "err", err)
			continue
		}
		c.holds[v.ID] = v
		held[filepath.Clean(v.Target)] = true
		c.log.Warn("csi: a pod's volume had no hold record; found in the mount table and held again", "volume", v.ID, "target", v.Target, "pod_uid", v.PodUID, "artifact", v.Model, "revision", v.Revision)
	}
}

// readyVersion finds name@rev Ready in the index.
func readyVersion(st cachestore.Inspector, name, rev string) (cachestore.Version, bool) {
	if a, err := st.Summary(name); err == nil {
		for _, x := range a.Versions {
			if x.Revision == rev && x.State == cachestore.StateReady {
				return x, true
			}
		}
	}
	return cachestore.Version{}, false
}

// csiUses adds the CSI holds to an in-use map, each holder once per
// version (a pod with two volumes of a model, or a volume whose record
// was found again under another ID, is one pod); names maps pod UIDs to
// namespace/name (csiHolder).
func (c *csiVolumes) uses(out map[string][]api.Holder, names map[string]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, v := range c.holds {
		h := csiHolder(v, names)
		k := capacity.Key(v.Model, v.Revision)
		out[k] = appendHolder(out[k], h)
		for _, kc := range v.Kernels {
			h.Revision = kc.Revision
			k := capacity.Key(kc.Name, kc.Revision)
			out[k] = appendHolder(out[k], h)
		}
	}
}

// csiHolder is the holder a CSI hold shows: the pod by namespace/name
// (from the publish, or for a hold found again in the mount table, from
// names: pod UID → namespace/name, as the cluster knows the node's pods),
// else by UID, else the volume.
func csiHolder(v csi.Volume, names map[string]string) api.Holder {
	if v.PodName != "" {
		return api.Holder{Kind: "pod", ID: v.PodNamespace + "/" + v.PodName, Revision: v.Revision}
	}
	if n, ok := names[v.PodUID]; ok && v.PodUID != "" {
		return api.Holder{Kind: "pod", ID: n, Revision: v.Revision}
	}
	if v.PodUID != "" {
		return api.Holder{Kind: "pod", ID: "uid " + v.PodUID, Revision: v.Revision}
	}
	return api.Holder{Kind: "csi", ID: v.ID, Revision: v.Revision}
}

// Hold implements csi.Backend. Concurrent calls for one volume ID share
// one run (a kubelet retry while the first composes a tree waits for it
// rather than mounting a tree not built yet); calls for other volumes do
// not wait for it: composing a large tree holds no lock they take.
func (c *csiVolumes) Hold(ctx context.Context, v csi.Volume) (string, string, error) {
	type result struct{ rev, tree string }
	r, err, _ := c.flight.Do(v.ID, func() (any, error) {
		rev, tree, err := c.hold(ctx, v)
		return result{rev, tree}, err
	})
	if err != nil {
		return "", "", err
	}
	return r.(result).rev, r.(result).tree, nil
}

func (c *csiVolumes) hold(ctx context.Context, v csi.Volume) (string, string, error) {
	if h, ok := c.held(v.ID); ok { // kubelet retried a publish that held already
		return h.Revision, c.tree(h), nil
	}
	rev, kind, priv, err := c.revision(v)
	if err != nil {
		return "", "", err
	}
	v.Revision, v.Private = rev, priv
	if v.KernelCaches == "auto" {
		// The model's kernel caches on their way: the volume waits for
		// them (kubelet retries, and the pod's events say why), so that
		// the pod does not start without what it would compile.
		pending, notes := kernelCacheWait(v.Model, c.host.desired(), c.host.view)
		if len(pending) > 0 {
			return "", "", status.Errorf(codes.Unavailable, "model %s is Ready but its kernel caches are not yet: %s; a volume with kernelCaches: auto waits for them (kernelCaches: none mounts the model alone)", v.Model, strings.Join(pending, ", "))
		}
		for _, n := range notes {
			c.log.Info("csi: kernelCaches=auto: "+n, "volume", v.ID, "artifact", v.Model)
		}
		for _, kc := range c.kernels.ModelKernelCaches(v.Model) {
			v.Kernels = append(v.Kernels, csi.KernelCache{Name: kc.Name, Revision: kc.Revision})
		}
		if len(v.Kernels) == 0 {
			c.log.Info("csi: kernelCaches=auto: no Ready kernel cache compatible with this node's GPUs serves the model; the volume shows the model without kernels/",
				"volume", v.ID, "artifact", v.Model, "gpus", len(c.kernels.GPUs().Devices))
		}
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return "", "", err
	}
	// Record first, then check the trees: an eviction that chose one of
	// these versions before the hold counted has removed it by now, or
	// will see the hold.
	c.writeMu.Lock() // index writes of holds are serialised like desires'
	err = c.records.PutHold(csiHoldKey(v.ID), raw)
	if err == nil {
		c.mu.Lock()
		c.holds[v.ID] = v
		c.mu.Unlock()
		c.host.changed()
	}
	c.writeMu.Unlock()
	if err != nil {
		return "", "", status.Errorf(codes.Internal, "recording the hold of %s@%s: %v", v.Model, rev, err)
	}
	tree := c.store.TreePath(kind, v.Model, rev)
	if len(v.Kernels) > 0 || v.Private { // a private version's own tree is 0700 (tenancy.go)
		tree, err = c.compose(ctx, v)
	} else if _, serr := os.Stat(tree); serr != nil {
		err = status.Errorf(codes.Unavailable, "model %s@%s was evicted while being mounted; retrying", v.Model, rev)
	}
	if err != nil {
		c.Release(ctx, v.ID)
		return "", "", err
	}
	c.store.Touch(v.Model, rev)
	for _, kc := range v.Kernels {
		c.store.Touch(kc.Name, kc.Revision)
	}
	c.warming.volume(v)
	return rev, tree, nil
}

// csiTree is the directory a held volume mounts: its revision's tree, or
// the volume's own composed tree when it shows kernel caches too or the
// artifact is private.
func (c *csiVolumes) tree(v csi.Volume) string {
	st := c.store
	if len(v.Kernels) > 0 || v.Private {
		return st.HoldTreePath(csiHoldKey(v.ID))
	}
	return st.TreePath(kindOf(st, v.Model), v.Model, v.Revision)
}

// composeCSITree builds the tree of a volume with kernelCaches: auto: the
// model's files at its root and each kernel cache's under
// kernels/<name>/, in the hold's own directory of the store
// (holds/<sha256(key)>/tree), which goes with the hold.
//
// Why a tree of hardlinks and not an overlayfs of the revision's tree and
// the kernel caches': the revision's tree is immutable and shared, so the
// composition has to live elsewhere either way, and overlayfs would need
// a lower directory holding kernels/<name> (itself a composed tree, or
// more mounts), an options string that bounds the number of layers to one
// page, and a mount of its own (own device) to clean up after a crash,
// which the mount table could no longer tie back to the store when the
// records are lost. Hardlinks cost one link per file (no copy: the same
// read-only inodes as the blobs; BenchmarkHoldTree: tens of milliseconds
// for a thousand files), and the tree is then bind-mounted exactly as a
// plain revision is (read-only, nosuid, nodev). The price is one link
// count per file per volume: filesystems cap it (ext4 at 65000), which
// bounds the number of kernelCaches: auto volumes of one model per node
// far above what a node runs.
func (c *csiVolumes) compose(ctx context.Context, v csi.Volume) (string, error) {
	parts := []cachestore.TreePart{{Name: v.Model, Revision: v.Revision}}
	for _, kc := range v.Kernels {
		parts = append(parts, cachestore.TreePart{Dir: "kernels/" + kc.Name, Name: kc.Name, Revision: kc.Revision})
	}
	tree, err := c.store.HoldTree(ctx, csiHoldKey(v.ID), parts)
	switch {
	case err == nil:
		return tree, nil
	case errors.Is(err, cachestore.ErrNotFound):
		return "", status.Errorf(codes.Unavailable, "model %s@%s or one of its kernel caches was evicted while being mounted; retrying: %v", v.Model, v.Revision, err)
	case errors.Is(err, cachestore.ErrInvalidPath): // the model's own files clash with kernels/<name>/
		return "", status.Errorf(codes.FailedPrecondition, "volumeAttributes.kernelCaches=auto: %v; the model has files of its own under kernels/: use kernelCaches: none and modelctl env %s for the kernel caches' paths", err, v.Model)
	default:
		return "", status.Errorf(codes.Internal, "composing the tree of %s@%s with its kernel caches: %v", v.Model, v.Revision, err)
	}
}

// kindOf is the kind of an artifact's versions (models unless the index
// says otherwise).
func kindOf(st cachestore.Inspector, name string) string {
	if a, err := st.Summary(name); err == nil && len(a.Versions) > 0 {
		return a.Versions[0].Kind
	}
	return cachestore.KindModel
}

// csiRevision picks the revision a volume mounts and says whether the
// artifact is private. Only what a present desire declares can be
// mounted (a pod never makes the node download anything, and holds
// nothing its owner let go of), and a private artifact only by a pod of
// a namespace its desire allows (PermissionDenied, naming the model and
// the pod's namespace only). The revision asked for must be one the
// desire still declares (the current one, the cluster's target, one it
// retains) and Ready; without one, the current one once Ready.
func (c *csiVolumes) revision(v csi.Volume) (rev, kind string, priv bool, err error) {
	a, err := c.store.Summary(v.Model)
	if err != nil && !errors.Is(err, cachestore.ErrNotFound) {
		return "", "", false, status.Errorf(codes.Internal, "artifact %s: %v", v.Model, err)
	}
	ds, desired := c.host.desired()[v.Model]
	desired = desired && ds.State != api.StateAbsent
	if !desired {
		return "", "", false, status.Errorf(codes.NotFound, "model %s is not declared on this node (no ModelCache selects it, no models.d file or pull names it); pods of namespace %q can mount: %s", v.Model, v.PodNamespace, c.servable(v.PodNamespace))
	}
	if !mayMount(ds, v.PodNamespace) {
		if v.PodNamespace == "" {
			return "", "", false, status.Errorf(codes.PermissionDenied, "model %s is private and the pod's namespace is unknown: the CSIDriver %s needs podInfoOnMount: true", v.Model, csi.DriverName)
		}
		return "", "", false, status.Errorf(codes.PermissionDenied, "model %s is private (fetched with credentials); pods of namespace %q may not mount it: its owner must allow %q (ModelCache spec.allowedNamespaces for a Secret of the daemon's namespace, else the ModelCacheCredentials' allowedNamespaces)", v.Model, v.PodNamespace, v.PodNamespace)
	}
	priv = private(ds)
	if v.Revision != "" {
		var have []string
		if a != nil {
			for _, x := range a.Versions {
				if !declaredRevision(ds, a, x.Revision) {
					continue
				}
				if x.Revision == v.Revision {
					if x.State != cachestore.StateReady {
						return "", "", false, status.Errorf(codes.Unavailable, "model %s@%s is %s on this node: %s", v.Model, x.Revision, x.State, x.Message)
					}
					return x.Revision, x.Kind, priv, nil
				}
				if x.State == cachestore.StateReady {
					have = append(have, x.Revision)
				}
			}
		}
		return "", "", false, status.Errorf(codes.NotFound, "model %s: revision %s is not one its owner declares on this node; it declares %s (leave revision out for the current one)", v.Model, v.Revision, listOr(have, "none Ready"))
	}
	if a != nil {
		for _, x := range a.Versions {
			if x.Revision == a.Current && x.State == cachestore.StateReady {
				return x.Revision, x.Kind, priv, nil
			}
		}
	}
	// Nothing Ready: say what the node is doing.
	view, err := c.host.view(v.Model)
	if err != nil {
		return "", "", false, status.Errorf(codes.NotFound, "model %s: %v; pods of namespace %q can mount: %s", v.Model, err, v.PodNamespace, c.servable(v.PodNamespace))
	}
	return "", "", false, notReadyStatus(view)
}

// declaredRevision says whether ds still declares rev of artifact a: its
// current revision, the cluster's revision (a rollout's target) or one
// it retains (spec.rollout.retainOld).
func declaredRevision(ds api.Desire, a *cachestore.Artifact, rev string) bool {
	return rev == a.Current || (ds.Revision != "" && rev == ds.Revision) || slices.Contains(ds.Retain, rev)
}

// Release implements csi.Backend. The composed tree goes first, outside
// desires.writeMu: removing a tree of many files takes as long as making it,
// and every Hold takes desires.writeMu.
func (c *csiVolumes) Release(_ context.Context, id string) error {
	c.warming.let(csiHoldKey(id))
	c.store.RemoveHoldTree(csiHoldKey(id))
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if err := c.records.DeleteHold(csiHoldKey(id)); err != nil {
		return err
	}
	c.mu.Lock()
	_, ok := c.holds[id]
	delete(c.holds, id)
	c.mu.Unlock()
	if ok {
		c.host.changed()
		c.host.kick() // an absent artifact the pod let go of may go now
	}
	return nil
}

// Holds implements csi.Backend.
func (c *csiVolumes) Holds() ([]csi.Volume, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]csi.Volume, 0, len(c.holds))
	for _, v := range c.holds {
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// serveCSI runs the CSI driver until ctx ends (Run, when --csi-socket is set).
func (c *csiVolumes) serve(ctx context.Context) error {
	cfg := *c.cfg.CSI
	if cfg.Logger == nil {
		cfg.Logger = c.log.With("component", "csi")
	}
	if cfg.Version == "" {
		cfg.Version = c.cfg.Version
	}
	drv, err := csi.New(cfg, c)
	if err != nil {
		return err
	}
	return drv.Serve(ctx)
}
