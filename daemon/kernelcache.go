package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/sources"
	"github.com/modelcache/modelcache/fetchers"
	ocifetcher "github.com/modelcache/modelcache/fetchers/oci"
	"github.com/modelcache/modelcache/gpu"
)

const (
	maxKernelCacheManifest   = 64 << 20
	kernelCacheRetryOnChange = "the node's GPUs or the desire must change for a new attempt"
)

// incompatibleError: a kernel cache none of this node's GPUs can run.
type incompatibleError struct{ report gpu.Report }

func (e *incompatibleError) Error() string {
	return "incompatible with this node's GPUs: " + e.report.Reason
}

// signatureError: the image's signature is missing or not trusted.
type signatureError struct{ err error }

func (e *signatureError) Error() string { return e.err.Error() }
func (e *signatureError) Unwrap() error { return e.err }

// kernelCacheDirs are the cache directories of an MCV image and the
// variable a framework reads each from.
var kernelCacheDirs = []struct{ dir, env, manifest, sizeLabel, countLabel, summary string }{
	{gpu.TritonCacheDir, "TRITON_CACHE_DIR", gpu.TritonManifestDir, gpu.LabelTritonCacheSize, gpu.LabelTritonEntryCount, gpu.LabelTritonSummary},
	{gpu.VLLMCacheDir, "VLLM_CACHE_ROOT", gpu.VLLMManifestDir, gpu.LabelVLLMCacheSize, gpu.LabelVLLMEntryCount, gpu.LabelVLLMSummary},
	{gpu.TorchInductorCacheDir, "TORCHINDUCTOR_CACHE_DIR", "", "", "", ""},
}

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

// kernels is the node's GPUs and what decides a kernel cache for them:
// its signature under the node's policy, its compatibility, and which
// Ready caches serve a model (for env and CSI volumes).
type kernels struct {
	// Set once in New, read without a lock.
	gpus    gpu.Inventory
	floor   string // --kernel-cache-signature-policy
	store   *cachestore.Store
	metrics *metrics
	// desired is the merged desire set (it takes the daemon lock).
	desired func() map[string]api.Desire
}

// newKernels reads the node's GPUs: NVML, or the simulated inventory
// --gpu-inventory names.
func newKernels(cfg Config, log *slog.Logger, st *cachestore.Store, desired func() map[string]api.Desire) (*kernels, error) {
	k := &kernels{floor: cfg.KernelCacheSignaturePolicy, store: st, desired: desired}
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

// kernelCacheBefore runs after the image is resolved and before any layer
// is fetched: the signature first (nothing of an untrusted image is
// downloaded), then the summary label against the GPUs (an image for other
// GPUs is not downloaded either).
func (p *pull) kernelCacheBefore(ctx context.Context) (*api.KernelCacheInfo, error) {
	d, ds, res, f := p.d, p.ds, p.res, p.f
	info := &api.KernelCacheInfo{Serves: ds.Serves}
	if p.src.scheme != "oci" {
		return info, fetchers.Permanent(fmt.Errorf("%s: a kernel cache is an OCI image; write oci://<registry>/<repo>:<tag>", ds.URI))
	}
	digest := "sha256:" + res.Revision
	of, ok := f.(*ocifetcher.Fetcher)
	if !ok {
		of = d.sources.OCI()
	}
	chk, err := d.kernels.verifySignature(ctx, ds, digest, of)
	info.Signature = chk
	if err != nil {
		return info, err
	}
	var ts []gpu.Target
	for _, k := range kernelCacheDirs {
		if s := res.Labels[k.summary]; k.summary != "" && s != "" {
			t, err := gpu.ParseSummary(s)
			if err != nil {
				d.log.Warn("kernel cache summary label unreadable; deciding from the manifest after extraction", "artifact", ds.Name, "err", err)
				return info, nil
			}
			ts = append(ts, t...)
		}
	}
	if len(ts) > 0 {
		if err := d.kernels.checkCompat(info, ts); err != nil {
			return info, err
		}
	}
	return info, nil
}

func (k *kernels) checkCompat(info *api.KernelCacheInfo, ts []gpu.Target) error {
	rep := gpu.Check(k.gpus, ts)
	info.Compatibility = compatView(rep)
	if rep.Compatible {
		k.metrics.compatChecks.WithLabelValues("compatible").Inc()
		return nil
	}
	k.metrics.compatChecks.WithLabelValues("incompatible").Inc()
	return &incompatibleError{rep}
}

// verifySignature applies the desire's policy to the pinned digest.
func (k *kernels) verifySignature(ctx context.Context, ds api.Desire, digest string, of *ocifetcher.Fetcher) (*api.SignatureCheck, error) {
	p := ds.Signature
	if p == nil {
		p = &api.SignaturePolicy{}
	}
	chk := &api.SignatureCheck{Policy: effectivePolicy(k.floor, ds, p.Policy), Digest: digest, At: time.Now().UTC()}
	if chk.Policy == api.PolicyOff {
		k.metrics.signatures.WithLabelValues("skipped").Inc()
		return chk, nil
	}
	pol, err := signaturePolicy(*p)
	if err == nil {
		var r *ocifetcher.SignatureResult
		if r, err = of.VerifySignature(ctx, ds.URI, digest, pol); err == nil {
			chk.Verified, chk.Format, chk.Signer = true, r.Format, r.Signer
			k.metrics.signatures.WithLabelValues("verified").Inc()
			return chk, nil
		}
	}
	switch {
	case errors.Is(err, ocifetcher.ErrUnsigned):
		k.metrics.signatures.WithLabelValues("unsigned").Inc()
	case errors.Is(err, ocifetcher.ErrBadSignature):
		k.metrics.signatures.WithLabelValues("invalid").Inc()
	default: // the registry could not be asked: retried like any fetch
		k.metrics.signatures.WithLabelValues("error").Inc()
		return chk, fmt.Errorf("signature of %s: %w", digest, err)
	}
	return chk, fetchers.Permanent(&signatureError{err})
}

// effectivePolicy is the policy a kernel cache desire is checked under.
// The node's policy (--kernel-cache-signature-policy) is the default and,
// for a desire from the socket, the floor: a pull may ask for required
// where the node says off, never for off where the node says required
// (validateDesire refuses that; a desire persisted before the floor
// existed is raised here). models.d and the cluster are the node's
// configuration and set their own.
func effectivePolicy(floor string, ds api.Desire, asked string) string {
	if floor == "" {
		floor = api.PolicyRequired
	}
	switch {
	case asked == "":
		return floor
	case asked == api.PolicyOff && ds.Origin == sources.OriginAPI:
		return floor
	}
	return asked
}

// signaturePolicy turns the wire policy into the verifier's: keys given
// as paths (models.d only) are read from the node, bounded.
func signaturePolicy(p api.SignaturePolicy) (ocifetcher.SignaturePolicy, error) {
	switch p.Policy {
	case "", api.PolicyRequired, api.PolicyOff:
	default:
		return ocifetcher.SignaturePolicy{}, fmt.Errorf("%w: signature policy %q: use required or off", ocifetcher.ErrBadSignature, p.Policy)
	}
	out := ocifetcher.SignaturePolicy{Identity: p.Identity, IdentityRegexp: p.IdentityRegexp, Issuer: p.Issuer, IssuerRegexp: p.IssuerRegexp, TrustedRoot: p.TrustedRoot}
	for _, k := range p.Keys {
		if strings.Contains(k, "-----BEGIN") {
			out.PublicKeys = append(out.PublicKeys, []byte(k))
			continue
		}
		b, err := fetchers.ReadConfigFile(k, ocifetcher.MaxTrustedRoot)
		if err != nil {
			return out, fmt.Errorf("%w: public key: %v", ocifetcher.ErrBadSignature, err)
		}
		out.PublicKeys = append(out.PublicKeys, b)
	}
	return out, nil
}

// kernelCacheAfter checks the extracted tree before it is committed: it
// must hold a cache directory, its manifest decides compatibility per GPU,
// and its bytes must match what the image's labels promise.
func (p *pull) kernelCacheAfter(m cachestore.Manifest) error {
	d, info, res, started := p.d, p.kc, p.res, p.fetched
	var ts []gpu.Target
	manifests := 0
	for _, k := range kernelCacheDirs {
		var bytes int64
		found := false
		for _, e := range m {
			if strings.HasPrefix(e.Path, k.dir+"/") {
				found = true
				bytes += e.Size
			}
			if k.manifest != "" && e.Path == k.manifest+"/"+gpu.ManifestFile {
				t, err := d.kernels.readKernelManifest(e)
				if err != nil {
					return fetchers.Permanent(fmt.Errorf("%s: %w", e.Path, err))
				}
				ts = append(ts, t...)
				manifests++
				if n := gpu.ParseSize(res.Labels[k.countLabel]); n >= 0 && int(n) != len(t) {
					return fetchers.Permanent(fmt.Errorf("%s lists %d entries but the image label %s says %d", e.Path, len(t), k.countLabel, n))
				}
			}
		}
		if !found {
			continue
		}
		info.Dirs = append(info.Dirs, k.dir)
		info.CacheBytes += bytes
		if want := gpu.ParseSize(res.Labels[k.sizeLabel]); k.sizeLabel != "" && want >= 0 && want != bytes {
			return fetchers.Permanent(fmt.Errorf("extracted %d bytes under %s/ but the image label %s says %d: the image is inconsistent; rebuild it", bytes, k.dir, k.sizeLabel, want))
		}
	}
	if len(info.Dirs) == 0 {
		return fetchers.Permanent(fmt.Errorf("the image holds no %s/, %s/ or %s/ directory: not a kernel cache image (MCV layout)", gpu.TritonCacheDir, gpu.VLLMCacheDir, gpu.TorchInductorCacheDir))
	}
	info.Entries = len(ts)
	info.ExtractSeconds = time.Since(started).Seconds()
	if manifests > 0 {
		return d.kernels.checkCompat(info, ts)
	}
	if info.Compatibility == nil {
		return fetchers.Permanent(fmt.Errorf("the image has no %s/%s and no summary label: compatibility cannot be decided", gpu.TritonManifestDir, gpu.ManifestFile))
	}
	return nil
}

func (k *kernels) readKernelManifest(e cachestore.Entry) ([]gpu.Target, error) {
	if e.Size > maxKernelCacheManifest {
		return nil, fmt.Errorf("manifest of %d bytes is larger than %d", e.Size, maxKernelCacheManifest)
	}
	f, err := k.store.OpenBlob(e.Digest)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxKernelCacheManifest))
	if err != nil {
		return nil, err
	}
	return gpu.ParseManifest(b)
}

// kernelCacheInfo reads what a version recorded of its checks.
func kernelCacheInfo(v *cachestore.Version) *api.KernelCacheInfo {
	if v == nil || v.Kind != cachestore.KindKernelCache || len(v.Annotations) == 0 {
		return nil
	}
	var info api.KernelCacheInfo
	if json.Unmarshal(v.Annotations, &info) != nil {
		return nil
	}
	return &info
}

// env is what a framework needs to use an artifact: for a kernel cache the
// cache directories; for a model its path, the HF cache view when it came
// from a hub, and the directories of its Ready, compatible kernel caches.
func (k *kernels) env(name string) (map[string]string, error) {
	a, err := k.store.Summary(name)
	if err != nil {
		return nil, err
	}
	cur := currentVersion(a)
	if cur == nil {
		return nil, fmt.Errorf("%s: %w: no Ready version yet (modelctl wait %s)", name, cachestore.ErrNotFound, name)
	}
	out := map[string]string{}
	if cur.Kind == cachestore.KindKernelCache {
		if info := kernelCacheInfo(cur); info != nil {
			kernelEnv(k.store.TreePath(cachestore.KindKernelCache, name, ""), info, out)
		}
		return out, nil
	}
	out["MODEL_PATH"] = k.store.TreePath(cur.Kind, name, "current")
	if cur.HFRepo != "" {
		out["HF_HUB_CACHE"] = filepath.Join(k.store.Root(), "hf")
		out["HF_HUB_OFFLINE"] = "1"
	}
	for _, kc := range k.modelKernelCaches(name) {
		kernelEnv(k.store.TreePath(cachestore.KindKernelCache, kc.Name, ""), kc.Info, out)
	}
	return out, nil
}

func (k *kernels) handleGPU(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, gpuView(k.gpus))
}

func (k *kernels) handleEnv(w http.ResponseWriter, r *http.Request) error {
	env, err := k.env(r.PathValue("name"))
	if err != nil {
		return err
	}
	return writeJSON(w, env)
}

// servedKernelCache is a Ready kernel cache version that serves a model.
type servedKernelCache struct {
	Name, Revision string
	Info           *api.KernelCacheInfo
}

// modelKernelCaches chooses the kernel caches a model is served with (by
// modelctl env and by a CSI volume with kernelCaches: auto): each kernel
// cache declared for the model whose current version is Ready (so it was
// signed as its policy asks and compatible with this node's GPUs when
// pulled) and was pulled for that model (one someone else pulled under
// the same name before the model was declared is not served), by name.
func (k *kernels) modelKernelCaches(model string) []servedKernelCache {
	var names []string
	for n, ds := range k.desired() {
		if ds.Kind == api.KindKernelCache && ds.Serves == model {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var out []servedKernelCache
	for _, n := range names {
		a, err := k.store.Summary(n)
		if err != nil {
			continue
		}
		cur := currentVersion(a)
		if info := kernelCacheInfo(cur); info != nil && info.Serves == model {
			out = append(out, servedKernelCache{Name: n, Revision: cur.Revision, Info: info})
		}
	}
	return out
}

// kernelEnv adds the directories of a kernel cache (whose current link is
// under dir) to out; the first cache to set a variable keeps it.
func kernelEnv(dir string, info *api.KernelCacheInfo, out map[string]string) {
	base := filepath.Join(dir, "current")
	for _, k := range kernelCacheDirs {
		for _, cd := range info.Dirs {
			if cd == k.dir {
				if _, set := out[k.env]; !set {
					out[k.env] = filepath.Join(base, cd)
				}
			}
		}
	}
}

// currentVersion is a's current Ready version, or nil.
func currentVersion(a *cachestore.Artifact) *cachestore.Version {
	for i := range a.Versions {
		v := &a.Versions[i]
		if v.Revision == a.Current && v.State == cachestore.StateReady {
			return v
		}
	}
	return nil
}

// gpuView is the node's inventory as the socket API shows it. gpu mirrors
// api's types so that it links nothing else of the module; the device
// conversion compiles only while their fields agree, and a test holds the
// rest (TestGPUViewsKeepEveryField).
func gpuView(inv gpu.Inventory) api.GPUInventory {
	devs := make([]api.GPUDevice, len(inv.Devices))
	for i, dv := range inv.Devices {
		devs[i] = api.GPUDevice(dv)
	}
	return api.GPUInventory{Source: inv.Source, Simulated: inv.Simulated, Reason: inv.Reason, DriverVersion: inv.DriverVersion,
		CUDADriverVersion: inv.CUDADriverVersion, Devices: devs, DetectedAt: inv.DetectedAt}
}

// compatView is a compatibility report as the socket API shows it.
func compatView(r gpu.Report) *api.Compatibility {
	devs := make([]api.GPUCompat, len(r.Devices))
	for i, dv := range r.Devices {
		devs[i] = api.GPUCompat(dv)
	}
	return &api.Compatibility{Compatible: r.Compatible, Simulated: r.Simulated, Targets: r.Targets, Devices: devs, Reason: r.Reason}
}
