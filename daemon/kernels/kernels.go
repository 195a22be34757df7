package kernels

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/fetchers"
	ocifetcher "github.com/modelcache/modelcache/fetchers/oci"
	"github.com/modelcache/modelcache/gpu"
	"github.com/modelcache/modelcache/gpu/mcv"
	"github.com/prometheus/client_golang/prometheus"
)

const maxManifest = 64 << 20

// Dir is a cache directory of an MCV image (mcv.Dir): the variable a
// framework reads it from, where its manifest lies, and the image labels
// that give its size, its entry count and its GPU summary.
type Dir = mcv.Dir

// Dirs are the cache directories of an MCV image (mcv.Dirs: the layout
// modelctl kernelcache builds by).
var Dirs = mcv.Dirs

// IncompatibleError: a kernel cache none of this node's GPUs can run.
type IncompatibleError struct{ Report gpu.Report }

func (e *IncompatibleError) Error() string {
	return "incompatible with this node's GPUs: " + e.Report.Reason
}

// SignatureError: the image's signature is missing or not trusted.
type SignatureError struct{ Err error }

func (e *SignatureError) Error() string { return e.Err.Error() }
func (e *SignatureError) Unwrap() error { return e.Err }

// Store is what a Set reads of the content store: blobs (a kernel cache's
// manifest), an artifact's versions, and where their trees are.
type Store interface {
	OpenBlob(d string) (*os.File, error)
	Summary(name string) (*cachestore.Artifact, error)
	TreePath(kind, name, rev string) string
	Root() string
}

// Config is what a Set needs of the daemon's configuration.
type Config struct {
	// GPUInventory, when set, names a simulated inventory (a file) read
	// instead of NVML.
	GPUInventory string
	// SignaturePolicy is the node's kernel cache signature policy
	// (required when ""): the default, and the floor of a socket desire.
	SignaturePolicy string
	// Signatures counts signature checks by result (verified, unsigned,
	// invalid, error, skipped); Compat counts compatibility checks
	// (compatible, incompatible). Both are the daemon's metrics.
	Signatures, Compat *prometheus.CounterVec
}

// Set is the node's GPUs and what decides a kernel cache for them: its
// signature under the node's policy, its compatibility, and which Ready
// caches serve a model (for env and CSI volumes).
type Set struct {
	// Set once in New, read without a lock.
	gpus  gpu.Inventory
	cfg   Config
	store Store
	// desired is the merged desire set (it takes the daemon lock).
	desired func() map[string]api.Desire
}

// New reads the node's GPUs: NVML, or the simulated inventory
// cfg.GPUInventory names. log may be nil (silent).
func New(cfg Config, log *slog.Logger, st Store, desired func() map[string]api.Desire) (*Set, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	k := &Set{cfg: cfg, store: st, desired: desired}
	if cfg.GPUInventory != "" {
		var err error
		if k.gpus, err = gpu.Load(cfg.GPUInventory); err != nil {
			return nil, err
		}
	} else {
		k.gpus = gpu.Detect()
	}
	inv := k.gpus
	log.Info("gpu inventory", "source", inv.Source, "devices", len(inv.Devices), "driver", inv.DriverVersion, "cuda", inv.CUDADriverVersion, "reason", inv.Reason)
	return k, nil
}

// GPUs is the node's inventory, read once in New.
func (k *Set) GPUs() gpu.Inventory { return k.gpus }

// CheckCompat records in info whether this node's GPUs run one of ts; an
// IncompatibleError when none does.
func (k *Set) CheckCompat(info *api.KernelCacheInfo, ts []gpu.Target) error {
	rep := gpu.Check(k.gpus, ts)
	info.Compatibility = CompatView(rep)
	if rep.Compatible {
		k.cfg.Compat.WithLabelValues("compatible").Inc()
		return nil
	}
	k.cfg.Compat.WithLabelValues("incompatible").Inc()
	return &IncompatibleError{rep}
}

// VerifySignature applies the desire's policy to the pinned digest.
func (k *Set) VerifySignature(ctx context.Context, ds api.Desire, digest string, of *ocifetcher.Fetcher) (*api.SignatureCheck, error) {
	p := ds.Signature
	if p == nil {
		p = &api.SignaturePolicy{}
	}
	chk := &api.SignatureCheck{Policy: EffectivePolicy(k.cfg.SignaturePolicy, ds, p.Policy), Digest: digest, At: time.Now().UTC()}
	if chk.Policy == api.PolicyOff {
		k.cfg.Signatures.WithLabelValues("skipped").Inc()
		return chk, nil
	}
	pol, err := signaturePolicy(*p)
	if err == nil {
		var r *ocifetcher.SignatureResult
		if r, err = of.VerifySignature(ctx, ds.URI, digest, pol); err == nil {
			chk.Verified, chk.Format, chk.Signer = true, r.Format, r.Signer
			k.cfg.Signatures.WithLabelValues("verified").Inc()
			return chk, nil
		}
	}
	switch {
	case errors.Is(err, ocifetcher.ErrUnsigned):
		k.cfg.Signatures.WithLabelValues("unsigned").Inc()
	case errors.Is(err, ocifetcher.ErrBadSignature):
		k.cfg.Signatures.WithLabelValues("invalid").Inc()
	default: // the registry could not be asked: retried like any fetch
		k.cfg.Signatures.WithLabelValues("error").Inc()
		return chk, fmt.Errorf("signature of %s: %w", digest, err)
	}
	return chk, fetchers.Permanent(&SignatureError{err})
}

// ReadManifest reads the GPU targets of a kernel cache manifest (the
// entry e of an extracted tree), at most 64 MiB.
func (k *Set) ReadManifest(e cachestore.Entry) ([]gpu.Target, error) {
	if e.Size > maxManifest {
		return nil, fmt.Errorf("manifest of %d bytes is larger than %d", e.Size, maxManifest)
	}
	f, err := k.store.OpenBlob(e.Digest)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxManifest))
	if err != nil {
		return nil, err
	}
	return gpu.ParseManifest(b)
}
