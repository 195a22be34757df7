package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/google/renameio/v2"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/csi"
)

// Kept layers: a writable kernel cache volume of a model that allows
// capture (captureKernelCaches) is kept at unpublish when its pod wrote
// files not yet captured, so that modelctl kernelcache capture can take
// it after the pod is gone. The kept layer is the daemon's, in its own
// area of the store root (<root>/kept/<sha256(volume id)[:12]>/: tree/
// and layer.json; 0700, never mounted into a pod): tree/ holds what the
// pod wrote anywhere in its volume (copied by keptcopy.go, following no
// link) and, under kernels/<name>/, the files of the kernel caches it was
// given that it neither removed nor rewrote (hardlinks of the store's
// read-only files): the volume's kernel caches as the pod saw them. A
// kept layer goes once captured (Client.Captured), when dropped, or past
// the limits: older than MaxAge, and the oldest first while there are
// more than MaxLayers or their bytes pass MaxBytes. A layer larger than
// MaxBytes by itself is not kept (the log says so).

// KeptLimits bound the writable layers kept for capture. Zero fields
// take the defaults.
type KeptLimits struct {
	MaxBytes  int64         // all kept layers together (default 4 GiB)
	MaxLayers int           // default 16
	MaxAge    time.Duration // default 7 days
}

// Defaults of KeptLimits.
const (
	DefaultKeptBytes  = 4 << 30
	DefaultKeptLayers = 16
	DefaultKeptAge    = 7 * 24 * time.Hour
)

func (l KeptLimits) withDefaults() KeptLimits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultKeptBytes
	}
	if l.MaxLayers <= 0 {
		l.MaxLayers = DefaultKeptLayers
	}
	if l.MaxAge <= 0 {
		l.MaxAge = DefaultKeptAge
	}
	return l
}

const (
	keptDir       = "kept"
	keptTree      = "tree"
	keptRecord    = "layer.json"
	keptTmpPrefix = ".tmp-"
)

// keptLayers is the kept layers' component. Its methods are safe for
// concurrent use; mu is taken under no other lock and none is taken
// under it.
type keptLayers struct {
	dir    string
	limits KeptLimits
	log    *slog.Logger
	now    func() time.Time

	mu sync.Mutex
	// captured: published volumes captured (at what time): at unpublish
	// their layer is kept only for files the pod wrote after.
	captured map[string]time.Time
}

// newKeptLayers opens the kept layers under root, removing what a keep
// interrupted by a crash left, and the layers past the limits.
func newKeptLayers(root string, limits KeptLimits, log *slog.Logger) *keptLayers {
	k := &keptLayers{dir: filepath.Join(root, keptDir), limits: limits.withDefaults(), log: log, now: time.Now, captured: map[string]time.Time{}}
	if err := os.MkdirAll(k.dir, 0o700); err != nil {
		log.Error("kept layers: making their directory", "dir", k.dir, "err", err)
	}
	os.Chmod(k.dir, 0o700)
	es, _ := os.ReadDir(k.dir)
	for _, e := range es {
		if strings.HasPrefix(e.Name(), keptTmpPrefix) {
			os.RemoveAll(filepath.Join(k.dir, e.Name()))
		}
	}
	k.mu.Lock()
	k.prune()
	k.mu.Unlock()
	return k
}

func (k *keptLayers) path(id string) string {
	sum := sha256.Sum256([]byte(id))
	return filepath.Join(k.dir, hex.EncodeToString(sum[:12]))
}

// keptLower is a tree the volume showed beneath its upper layer.
type keptLower struct {
	dir  string // where the volume showed it: kernels/<name>
	tree string // the store's tree
}

// keep copies volume v's upper directory (and what it started from:
// lowers) into a kept layer, when it holds files written since the last
// capture; then the limits are applied.
func (k *keptLayers) keep(v csi.Volume, upper string, lowers []keptLower, caches []api.CaptureCache) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	tmp, err := os.MkdirTemp(k.dir, keptTmpPrefix)
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	tree := filepath.Join(tmp, keptTree)
	c, err := copyUpper(upper, tree, k.limits.MaxBytes)
	if errors.Is(err, errKeptTooLarge) {
		k.log.Warn("kept layers: the volume's writable layer is not kept for capture: "+err.Error(), "volume", v.ID, "artifact", v.Model, "max_bytes", k.limits.MaxBytes)
		return nil
	}
	if err != nil {
		return err
	}
	if c.files == 0 || !c.newest.After(k.captured[v.ID]) {
		delete(k.captured, v.ID)
		return nil // nothing compiled, or nothing since its capture
	}
	delete(k.captured, v.ID)
	rec := api.KeptLayer{Volume: v.ID, Model: v.Model, KeptAt: k.now().UTC(), Bytes: c.bytes, Files: c.files, Caches: caches, Refused: c.refused}
	if v.PodName != "" {
		rec.Pod = v.PodNamespace + "/" + v.PodName
	}
	for _, l := range lowers {
		n, err := c.linkLower(l.tree, tree, l.dir)
		if err != nil {
			return fmt.Errorf("the kernel cache the volume was given (%s): %w", l.dir, err)
		}
		rec.Bytes += n
	}
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := renameio.WriteFile(filepath.Join(tmp, keptRecord), raw, 0o600, renameio.WithTempDir(tmp)); err != nil {
		return err
	}
	dst := k.path(v.ID)
	os.RemoveAll(dst) // the same volume kept before
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	k.log.Info("kept layers: kept a volume's writable layer for capture", "volume", v.ID, "artifact", v.Model, "pod", rec.Pod, "files", c.files, "bytes", rec.Bytes, "refused", len(c.refused))
	k.prune()
	return nil
}

// list reads the kept layers, oldest first; a directory without a
// readable record is removed. k.mu is held.
func (k *keptLayers) list() []api.KeptLayer {
	es, _ := os.ReadDir(k.dir)
	var out []api.KeptLayer
	for _, e := range es {
		if strings.HasPrefix(e.Name(), keptTmpPrefix) {
			continue
		}
		dir := filepath.Join(k.dir, e.Name())
		var rec api.KeptLayer
		raw, err := os.ReadFile(filepath.Join(dir, keptRecord))
		if err == nil {
			err = json.Unmarshal(raw, &rec)
		}
		if err != nil || rec.Volume == "" || k.path(rec.Volume) != dir {
			k.log.Warn("kept layers: removing a directory without a readable record", "dir", dir, "err", err)
			os.RemoveAll(dir)
			continue
		}
		out = append(out, rec)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].KeptAt.Equal(out[j].KeptAt) {
			return out[i].KeptAt.Before(out[j].KeptAt)
		}
		return out[i].Volume < out[j].Volume
	})
	return out
}

// prune removes the layers past MaxAge, then the oldest while there are
// more than MaxLayers or their bytes pass MaxBytes; it returns what is
// left. k.mu is held.
func (k *keptLayers) prune() []api.KeptLayer {
	all := k.list()
	var total int64
	for _, l := range all {
		total += l.Bytes
	}
	now := k.now()
	for len(all) > 0 {
		l := all[0]
		var why string
		switch {
		case now.Sub(l.KeptAt) > k.limits.MaxAge:
			why = "older than the kept layers' age limit"
		case len(all) > k.limits.MaxLayers:
			why = "the oldest, past the kept layers' count limit"
		case total > k.limits.MaxBytes:
			why = "the oldest, past the kept layers' size limit"
		default:
			return all
		}
		k.remove(l, why)
		total -= l.Bytes
		all = all[1:]
	}
	return all
}

func (k *keptLayers) remove(l api.KeptLayer, why string) {
	if err := os.RemoveAll(k.path(l.Volume)); err != nil {
		k.log.Error("kept layers: removing", "volume", l.Volume, "err", err)
		return
	}
	k.log.Info("kept layers: removed a kept layer: "+why, "volume", l.Volume, "artifact", l.Model, "pod", l.Pod, "kept_at", l.KeptAt)
}

// Layers lists the kept layers within the limits, oldest first.
func (k *keptLayers) Layers() []api.KeptLayer {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.prune()
}

// find is the kept layers named by q: a volume ID, namespace/pod, or a
// model.
func (k *keptLayers) find(q string) []api.KeptLayer {
	var out []api.KeptLayer
	for _, l := range k.Layers() {
		if l.Volume == q || l.Pod == q || l.Model == q {
			out = append(out, l)
		}
	}
	return out
}

// tree is where kept layer id's files are.
func (k *keptLayers) tree(id string) string { return filepath.Join(k.path(id), keptTree) }

// captured records that volume id was captured: its kept layer goes; a
// published volume's layer is kept at unpublish only for what the pod
// writes after now. It says whether a kept layer went.
func (k *keptLayers) markCaptured(id string, published bool) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if published {
		k.captured[id] = k.now()
		return false
	}
	for _, l := range k.list() {
		if l.Volume == id {
			k.remove(l, "captured")
			return true
		}
	}
	return false
}

// drop removes kept layer id; false when there is none.
func (k *keptLayers) drop(id string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, l := range k.list() {
		if l.Volume == id {
			k.remove(l, "dropped by the node's admin")
			return true
		}
	}
	return false
}

// KeepLayer implements csi.LayerKeeper: the layer of a writable volume
// of a model whose desire allows capture is kept (keptLayers.keep).
func (c *csiVolumes) KeepLayer(_ context.Context, id, upper string) error {
	v, ok := c.held(id)
	if !ok || v.Writable == 0 || c.kept == nil {
		return nil
	}
	if ds, ok := c.host.desired()[v.Model]; !ok || !ds.CaptureKernelCaches {
		return nil
	}
	var lowers []keptLower
	for _, kc := range v.Kernels {
		lowers = append(lowers, keptLower{dir: "kernels/" + kc.Name, tree: c.store.TreePath(cachestore.KindKernelCache, kc.Name, kc.Revision)})
	}
	return c.kept.keep(v, upper, lowers, captureCaches(c.store, v))
}
