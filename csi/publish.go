package csi

import (
	"context"
	"errors"
	"path/filepath"
	"sort"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// NodePublishVolume bind-mounts the held revision read-only at the target.
func (d *Driver) NodePublishVolume(ctx context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	v, err := d.volumeFrom(req)
	if err != nil {
		return nil, err
	}
	defer d.targets.lock(v.Target)()
	t, err := d.openTarget(v.Target)
	if err != nil {
		return nil, err
	}
	defer t.Close()
	mounted, err := t.mounted()
	if err != nil {
		return nil, d.targetError(v.Target, err)
	}
	if mounted {
		// Published before (kubelet retries): the same volume is a success;
		// anything else mounted there is not ours to stack on.
		return nil, d.publishedBefore(v)
	}
	if err := d.heldElsewhere(ctx, v); err != nil {
		return nil, err
	}
	rev, tree, err := d.backend.Hold(ctx, v)
	if err != nil {
		if _, ok := status.FromError(err); !ok {
			err = status.Error(codes.Internal, err.Error())
		}
		return nil, err
	}
	mount := d.mount
	if v.Writable > 0 {
		mount = func(t *target, tree string) error { return d.mountWritable(t, tree, v) }
	}
	if err := mount(t, tree); err != nil {
		if rerr := d.backend.Release(ctx, v.ID); rerr != nil {
			d.log.Error("csi: releasing a hold after a failed mount", "volume", v.ID, "err", rerr)
		}
		if errors.Is(err, errMounted) {
			return nil, status.Errorf(codes.AlreadyExists, "target_path %q: %v", v.Target, err)
		}
		return nil, status.Errorf(codes.Internal, "mounting %s@%s at %s: %v", v.Model, rev, v.Target, err)
	}
	d.log.Info("csi: published", "volume", v.ID, "artifact", v.Model, "revision", rev, "pod", v.PodNamespace+"/"+v.PodName, "target", v.Target)
	return &csipb.NodePublishVolumeResponse{}, nil
}

// publishedBefore answers a publish whose target is mounted already:
// nil (success) when the mount is this volume's, AlreadyExists otherwise.
func (d *Driver) publishedBefore(v Volume) error {
	held, err := d.backend.Holds()
	if err != nil {
		return status.Errorf(codes.Internal, "reading holds: %v", err)
	}
	for _, h := range held {
		if h.ID == v.ID && h.Target == v.Target {
			if h.Model != v.Model || (v.Revision != "" && v.Revision != h.Revision) {
				return status.Errorf(codes.AlreadyExists, "volume %s is already published at %s with %s@%s", v.ID, v.Target, h.Model, h.Revision)
			}
			return nil
		}
	}
	return status.Errorf(codes.AlreadyExists, "target_path %q: something else is mounted there", v.Target)
}

// heldElsewhere refuses a volume ID held for another target that is
// still mounted (FailedPrecondition): an inline volume has one target,
// and a second mount under its one hold would be left unheld when the
// first target is unpublished. A hold whose target is no longer mounted
// is released, and the publish holds afresh for its own target.
func (d *Driver) heldElsewhere(ctx context.Context, v Volume) error {
	held, err := d.backend.Holds()
	if err != nil {
		return status.Errorf(codes.Internal, "reading holds: %v", err)
	}
	for _, h := range held {
		if h.ID != v.ID || h.Target == v.Target {
			continue
		}
		if mounted, err := d.targetMounted(h.Target); err != nil || mounted {
			return status.Errorf(codes.FailedPrecondition, "volume %s is published at %s; one volume mounts at one target (unpublish it there first)", v.ID, h.Target)
		}
		if err := d.backend.Release(ctx, h.ID); err != nil {
			return status.Errorf(codes.Internal, "releasing the hold of volume %s, no longer mounted at %s: %v", h.ID, h.Target, err)
		}
	}
	return nil
}

// mount creates the target directory (its parent exists: kubelet made
// it) and bind-mounts tree there read-only; on failure nothing is left.
func (d *Driver) mount(t *target, tree string) error {
	created, err := t.mkdir()
	if err != nil {
		return err
	}
	d.mountMu.Lock()
	err = t.bindReadOnly(d.log, tree)
	d.mountMu.Unlock()
	if err != nil && created {
		t.rmdir()
	}
	return err
}

// NodeUnpublishVolume unmounts the target, removes it and releases the
// hold; a target already gone is a success.
func (d *Driver) NodeUnpublishVolume(ctx context.Context, req *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if id == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id is empty")
	}
	if target == "" {
		return nil, status.Error(codes.InvalidArgument, "target_path is empty")
	}
	if err := d.validTarget(target); err != nil {
		return nil, err
	}
	defer d.targets.lock(target)()
	t, err := d.openTarget(target)
	switch {
	case status.Code(err) == codes.NotFound: // its parent is gone: nothing is mounted there
	case err != nil:
		return nil, err
	default:
		defer t.Close()
		// Each round unmounts the mount on top (a stack left by an older
		// driver comes off whole).
		for i := 0; ; i++ {
			more, err := t.unmountTop()
			if err != nil {
				return nil, d.targetError(target, err)
			}
			if !more {
				break
			}
			if i == 100 {
				return nil, status.Errorf(codes.Internal, "target_path %q: still mounted after %d unmounts", target, i+1)
			}
		}
		if err := t.rmdir(); err != nil {
			return nil, status.Errorf(codes.Internal, "removing %s: %v", target, err)
		}
	}
	d.keepLayer(ctx, id)
	if err := d.removeLayer(id); err != nil { // a writable kernel cache's layer goes with the volume
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	if err := d.backend.Release(ctx, id); err != nil {
		return nil, status.Errorf(codes.Internal, "releasing the hold of volume %s: %v", id, err)
	}
	// A hold rediscovered from the mount table may carry another ID than
	// kubelet's (its vol_data.json was gone): the target names it too.
	held, err := d.backend.Holds()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "reading holds: %v", err)
	}
	for _, h := range held {
		if h.Target == target && h.ID != id {
			if err := d.backend.Release(ctx, h.ID); err != nil {
				return nil, status.Errorf(codes.Internal, "releasing the hold of volume %s at %s: %v", h.ID, target, err)
			}
		}
	}
	d.log.Info("csi: unpublished", "volume", id, "target", target)
	return &csipb.NodeUnpublishVolumeResponse{}, nil
}

// volumeFrom validates a publish request into a Volume.
func (d *Driver) volumeFrom(req *csipb.NodePublishVolumeRequest) (Volume, error) {
	v := Volume{ID: req.GetVolumeId(), Target: req.GetTargetPath()}
	if v.ID == "" {
		return v, status.Error(codes.InvalidArgument, "volume_id is empty")
	}
	if v.Target == "" {
		return v, status.Error(codes.InvalidArgument, "target_path is empty")
	}
	capa := req.GetVolumeCapability()
	if capa == nil {
		return v, status.Error(codes.InvalidArgument, "volume_capability is missing")
	}
	if capa.GetBlock() != nil {
		return v, status.Error(codes.InvalidArgument, "volume_capability: block access is not supported; "+DriverName+" mounts a read-only directory")
	}
	if req.GetStagingTargetPath() != "" {
		return v, status.Error(codes.InvalidArgument, "staging_target_path: "+DriverName+" does not stage volumes")
	}
	if err := d.validTarget(v.Target); err != nil {
		return v, err
	}
	attrs := req.GetVolumeContext()
	fields := map[string]*string{AttrModelCache: &v.Model, AttrRevision: &v.Revision, AttrKernelCaches: &v.KernelCaches, AttrWarm: &v.Warm,
		attrPodName: &v.PodName, attrPodNamespace: &v.PodNamespace, attrPodUID: &v.PodUID}
	var unknown []string
	var writable string
	fields[AttrKernelCacheWritable] = &writable
	for k, val := range attrs {
		if f, ok := fields[k]; ok {
			*f = val
			continue
		}
		switch k {
		case attrEphemeral:
			if val != "true" {
				return v, status.Errorf(codes.InvalidArgument, "%s=%q: %s serves inline ephemeral volumes only (volumeLifecycleModes: [Ephemeral]); declare the volume in the pod's spec.volumes[].csi", attrEphemeral, val, DriverName)
			}
		default:
			if !strings.HasPrefix(k, attrKubelet) {
				unknown = append(unknown, k)
			}
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return v, status.Errorf(codes.InvalidArgument, "volumeAttributes: unknown %s; %s takes %s, %s, %s, %s and %s", strings.Join(unknown, ", "), DriverName, AttrModelCache, AttrRevision, AttrKernelCaches, AttrKernelCacheWritable, AttrWarm)
	}
	if v.Model == "" {
		return v, status.Errorf(codes.InvalidArgument, "volumeAttributes.%s is missing: name the ModelCache (or local artifact) to mount", AttrModelCache)
	}
	if len(v.Model) > 253 || strings.ContainsAny(v.Model, "/\\:@\x00") || v.Model == "." || v.Model == ".." {
		return v, status.Errorf(codes.InvalidArgument, "volumeAttributes.%s %q: not an artifact name", AttrModelCache, v.Model)
	}
	if v.Revision != "" && (len(v.Revision) > 256 || strings.ContainsAny(v.Revision, "/\\\x00") || v.Revision == "." || v.Revision == ".." || v.Revision == "current") {
		return v, status.Errorf(codes.InvalidArgument, "volumeAttributes.%s %q: not a revision (give a commit, digest or version the node holds, or leave it out for the current one)", AttrRevision, v.Revision)
	}
	switch v.KernelCaches {
	case "", "none":
		v.KernelCaches = "none"
	case "auto":
	default:
		return v, status.Errorf(codes.InvalidArgument, "volumeAttributes.%s %q: use auto or none", AttrKernelCaches, v.KernelCaches)
	}
	var err error
	if v.Writable, err = parseWritable(writable); err != nil {
		return v, status.Error(codes.InvalidArgument, err.Error())
	}
	if v.Writable > 0 && req.GetReadonly() {
		return v, status.Errorf(codes.InvalidArgument, "volumeAttributes.%s with readOnly: true: a writable kernel cache needs the volume writable; leave readOnly out (the store's files stay read-only beneath)", AttrKernelCacheWritable)
	}
	switch v.Warm {
	case "", "true":
		v.Warm = "true"
	case "false":
	default:
		return v, status.Errorf(codes.InvalidArgument, "volumeAttributes.%s %q: use \"true\" (the default: the node reads the model into memory ahead of the pod) or \"false\"", AttrWarm, v.Warm)
	}
	return v, nil
}

// validTarget: absolute, clean (no ".."), strictly under the pods
// directory, by its name; openTarget then resolves it.
func (d *Driver) validTarget(target string) error {
	if !filepath.IsAbs(target) || filepath.Clean(target) != target || strings.Contains(target, "/../") {
		return status.Errorf(codes.InvalidArgument, "target_path %q: want a clean absolute path under %s", target, d.cfg.PodsDir)
	}
	if !under(d.cfg.PodsDir, target) {
		return status.Errorf(codes.InvalidArgument, "target_path %q: not under kubelet's pods directory %s", target, d.cfg.PodsDir)
	}
	return nil
}

// openTarget resolves a valid target's parent once, beneath the pods
// directory and through no symlink (target); every later step uses the
// descriptor. NotFound when the parent is missing (kubelet makes it).
func (d *Driver) openTarget(path string) (*target, error) {
	t, err := openTarget(d.cfg.PodsDir, path)
	if err != nil {
		return nil, d.targetError(path, err)
	}
	return t, nil
}

// targetError maps the kernel's answer about a target to the code
// kubelet sees.
func (d *Driver) targetError(path string, err error) error {
	var pe *podsDirError
	switch {
	case errors.As(err, &pe):
		return status.Errorf(codes.FailedPrecondition, "pods directory %s: %v", d.cfg.PodsDir, pe.err)
	case errors.Is(err, unix.ENOENT):
		return status.Errorf(codes.NotFound, "target_path %q: its parent does not exist", path)
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.EXDEV):
		return status.Errorf(codes.InvalidArgument, "target_path %q: resolves outside kubelet's pods directory %s, or through a symlink (%v)", path, d.cfg.PodsDir, err)
	}
	return status.Errorf(codes.Internal, "target_path %q: %v", path, err)
}

// targetMounted says whether something is mounted at path, resolved as
// publish resolves it; false when it or its parent is gone.
func (d *Driver) targetMounted(path string) (bool, error) {
	t, err := openTarget(d.cfg.PodsDir, path)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer t.Close()
	return t.mounted()
}

func under(dir, p string) bool {
	rel, err := filepath.Rel(dir, p)
	return err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../")
}
