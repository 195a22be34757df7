package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/csi"
	"github.com/modelcache/modelcache/daemon/capacity"
)

// The daemon as the CSI driver sees it (csi.Backend): a pod's volume
// holds one exact revision, recorded in the index under csiHoldKey(id) so
// the hold outlives restarts, and counted in inUse (csiUses) so eviction
// never takes it and list/inspect show the pod.

const csiHoldPrefix = "csi:"

func csiHoldKey(id string) string { return csiHoldPrefix + id }

// csiBackend is the daemon seen through csi.Backend.
type csiBackend struct{ d *Daemon }

// CSIBackend is what csi.New needs of the daemon (Run uses it; tests too).
func (d *Daemon) CSIBackend() csi.Backend { return csiBackend{d} }

// loadCSIHolds reads the recorded CSI holds into memory (New).
func (d *Daemon) loadCSIHolds() {
	d.csiHolds = map[string]csi.Volume{}
	raw, err := d.store.Holds()
	if err != nil {
		d.log.Error("reading CSI holds from the index", "err", err)
		return
	}
	for k, b := range raw {
		id, ok := strings.CutPrefix(k, csiHoldPrefix)
		if !ok {
			continue
		}
		var v csi.Volume
		if err := json.Unmarshal(b, &v); err != nil || v.ID != id {
			d.log.Error("dropping an unreadable CSI hold from the index", "key", k, "err", err)
			d.store.DeleteHold(k)
			continue
		}
		d.csiHolds[id] = v
	}
	if len(d.csiHolds) > 0 && d.cfg.CSI == nil {
		d.log.Warn("the index records CSI volumes but --csi-socket is off; their revisions stay held until the driver runs and kubelet unpublishes them", "volumes", len(d.csiHolds))
	}
}

// csiUses adds the CSI holds to an in-use map; called with d.mu held.
func (d *Daemon) csiUses(out map[string][]api.Holder) {
	for _, v := range d.csiHolds {
		k := capacity.Key(v.Model, v.Revision)
		out[k] = append(out[k], csiHolder(v))
	}
}

func csiHolder(v csi.Volume) api.Holder {
	if v.PodName != "" {
		return api.Holder{Kind: "pod", ID: v.PodNamespace + "/" + v.PodName, Revision: v.Revision}
	}
	return api.Holder{Kind: "csi", ID: v.ID, Revision: v.Revision}
}

// Hold implements csi.Backend.
func (b csiBackend) Hold(ctx context.Context, v csi.Volume) (string, string, error) {
	d := b.d
	d.mu.Lock()
	if h, ok := d.csiHolds[v.ID]; ok { // kubelet retried a publish that held already
		d.mu.Unlock()
		return h.Revision, d.store.TreePath(d.kindOf(h.Model), h.Model, h.Revision), nil
	}
	d.mu.Unlock()
	rev, kind, err := d.csiRevision(v)
	if err != nil {
		return "", "", err
	}
	if v.KernelCaches == "auto" {
		d.mu.Lock()
		kcs := len(d.desired()[v.Model].KernelCaches)
		d.mu.Unlock()
		if kcs > 0 {
			return "", "", status.Errorf(codes.InvalidArgument, "volumeAttributes.kernelCaches=auto: mounting %s's kernel caches beneath the model is not supported yet; use kernelCaches: none and modelctl env %s for their paths", v.Model, v.Model)
		}
	}
	v.Revision = rev
	raw, err := json.Marshal(v)
	if err != nil {
		return "", "", err
	}
	// Record first, then check the tree: an eviction that chose this
	// revision before the hold counted has removed it by now, or will see
	// the hold.
	d.desireMu.Lock() // index writes of holds are serialised like desires'
	err = d.store.PutHold(csiHoldKey(v.ID), raw)
	if err == nil {
		d.mu.Lock()
		d.csiHolds[v.ID] = v
		d.notify()
		d.mu.Unlock()
	}
	d.desireMu.Unlock()
	if err != nil {
		return "", "", status.Errorf(codes.Internal, "recording the hold of %s@%s: %v", v.Model, rev, err)
	}
	tree := d.store.TreePath(kind, v.Model, rev)
	if _, err := os.Stat(tree); err != nil {
		b.Release(ctx, v.ID)
		return "", "", status.Errorf(codes.Unavailable, "model %s@%s was evicted while being mounted; retrying", v.Model, rev)
	}
	d.store.Touch(v.Model, rev)
	return rev, tree, nil
}

// kindOf is the kind of an artifact's versions (models unless the index
// says otherwise).
func (d *Daemon) kindOf(name string) string {
	if a, err := d.store.Summary(name); err == nil && len(a.Versions) > 0 {
		return a.Versions[0].Kind
	}
	return cachestore.KindModel
}

// csiRevision picks the revision a volume mounts: the one asked for, which
// must be Ready on this node, else the current one once Ready. Only what
// the node already has or declares can be mounted: a pod never makes it
// download anything.
func (d *Daemon) csiRevision(v csi.Volume) (rev, kind string, err error) {
	a, err := d.store.Summary(v.Model)
	if err != nil && !errors.Is(err, cachestore.ErrNotFound) {
		return "", "", status.Errorf(codes.Internal, "artifact %s: %v", v.Model, err)
	}
	d.mu.Lock()
	want := d.desired()
	ds, desired := want[v.Model]
	desired = desired && ds.State != api.StateAbsent
	d.mu.Unlock()
	if a == nil && !desired {
		return "", "", status.Errorf(codes.NotFound, "model %s is not declared on this node (no ModelCache selects it, no models.d file or pull names it); this node can serve: %s", v.Model, d.servable())
	}
	if v.Revision != "" {
		var have []string
		if a != nil {
			for _, x := range a.Versions {
				if x.Revision == v.Revision {
					if x.State != cachestore.StateReady {
						return "", "", status.Errorf(codes.Unavailable, "model %s@%s is %s on this node: %s", v.Model, x.Revision, x.State, x.Message)
					}
					return x.Revision, x.Kind, nil
				}
				if x.State == cachestore.StateReady {
					have = append(have, x.Revision)
				}
			}
		}
		return "", "", status.Errorf(codes.NotFound, "model %s: revision %s is not on this node; it holds %s (leave revision out for the current one)", v.Model, v.Revision, listOr(have, "none Ready"))
	}
	if a != nil {
		for _, x := range a.Versions {
			if x.Revision == a.Current && x.State == cachestore.StateReady {
				return x.Revision, x.Kind, nil
			}
		}
	}
	// Nothing Ready: say what the node is doing.
	view, err := d.view(v.Model, false)
	if err != nil {
		return "", "", status.Errorf(codes.NotFound, "model %s: %v; this node can serve: %s", v.Model, err, d.servable())
	}
	return "", "", notReadyStatus(view)
}

// notReadyStatus: Unavailable (kubelet retries) while there is hope, with
// the progress; FailedPrecondition when the node has given up. Progress
// is in words ("41 percent"): kubelet's events take the message as a
// format string (the driver escapes any other '%').
func notReadyStatus(a *api.Artifact) error {
	switch a.Phase {
	case api.PhaseDownloading:
		msg := fmt.Sprintf("model %s downloading", a.Name)
		if p := a.Progress; p != nil {
			if p.BytesTotal > 0 {
				msg += fmt.Sprintf(" %d percent, %s of %s", (p.BytesDone+p.BytesSkipped)*100/p.BytesTotal, api.FormatBytes(p.BytesDone+p.BytesSkipped), api.FormatBytes(p.BytesTotal))
			} else {
				msg += ", " + api.FormatBytes(p.BytesDone) + " so far"
			}
			if p.BytesPerSecond > 0 {
				msg += fmt.Sprintf(" at %s/s", api.FormatBytes(int64(p.BytesPerSecond)))
			}
		}
		if a.Message != "" {
			msg += " (" + a.Message + ")"
		}
		return status.Error(codes.Unavailable, msg+"; the volume mounts once it is Ready")
	case api.PhaseFailed, api.PhaseIncompatible, api.PhaseEvicted:
		msg := fmt.Sprintf("model %s is %s on this node", a.Name, a.Phase)
		if a.Reason != "" {
			msg += " (" + a.Reason + ")"
		}
		if a.Message != "" {
			msg += ": " + a.Message
		}
		if a.Phase == api.PhaseFailed && a.NextRetry != nil {
			return status.Error(codes.Unavailable, msg+fmt.Sprintf("; the node retries at %s", a.NextRetry.Format("15:04:05")))
		}
		return status.Error(codes.FailedPrecondition, msg+"; fix the ModelCache (modelctl inspect "+a.Name+" says more) and recreate the pod")
	default:
		msg := fmt.Sprintf("model %s is %s on this node", a.Name, a.Phase)
		if a.Message != "" {
			msg += ": " + a.Message
		}
		return status.Error(codes.Unavailable, msg+"; the volume mounts once it is Ready")
	}
}

// servable lists what a volume may name: declared and stored artifacts.
func (d *Daemon) servable() string {
	names := map[string]bool{}
	if arts, err := d.store.ListSummaries(); err == nil {
		for _, a := range arts {
			names[a.Name] = true
		}
	}
	d.mu.Lock()
	for n, ds := range d.desired() {
		if ds.State != api.StateAbsent {
			names[n] = true
		}
	}
	d.mu.Unlock()
	var out []string
	for n := range names {
		out = append(out, n)
	}
	sort.Strings(out)
	if len(out) > 20 {
		out = append(out[:20], fmt.Sprintf("and %d more (modelctl list)", len(out)-20))
	}
	return listOr(out, "nothing yet")
}

func listOr(xs []string, none string) string {
	if len(xs) == 0 {
		return none
	}
	return strings.Join(xs, ", ")
}

// Release implements csi.Backend.
func (b csiBackend) Release(_ context.Context, id string) error {
	d := b.d
	d.desireMu.Lock()
	defer d.desireMu.Unlock()
	if err := d.store.DeleteHold(csiHoldKey(id)); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.csiHolds[id]; ok {
		delete(d.csiHolds, id)
		d.notify()
		d.kick() // an absent artifact the pod let go of may go now
	}
	return nil
}

// Holds implements csi.Backend.
func (b csiBackend) Holds() ([]csi.Volume, error) {
	d := b.d
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]csi.Volume, 0, len(d.csiHolds))
	for _, v := range d.csiHolds {
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// serveCSI runs the CSI driver until ctx ends (Run, when --csi-socket is set).
func (d *Daemon) serveCSI(ctx context.Context) error {
	cfg := *d.cfg.CSI
	if cfg.Logger == nil {
		cfg.Logger = d.log.With("component", "csi")
	}
	if cfg.Version == "" {
		cfg.Version = d.cfg.Version
	}
	drv, err := csi.New(cfg, d.CSIBackend())
	if err != nil {
		return err
	}
	return drv.Serve(ctx)
}
