package daemon

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/kernels"
	"github.com/modelcache/modelcache/fetchers"
	ocifetcher "github.com/modelcache/modelcache/fetchers/oci"
	"github.com/modelcache/modelcache/gpu"
	"github.com/modelcache/modelcache/gpu/mcv"
)

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
	chk, err := d.kernels.VerifySignature(ctx, ds, digest, of)
	info.Signature = chk
	if err != nil {
		return info, err
	}
	var ts []gpu.Target
	for _, k := range kernels.Dirs {
		if s := res.Labels[k.Summary]; k.Summary != "" && s != "" {
			t, err := gpu.ParseSummary(s)
			if err != nil {
				d.log.Warn("kernel cache summary label unreadable; deciding from the manifest after extraction", "artifact", ds.Name, "err", err)
				return info, nil
			}
			ts = append(ts, t...)
		}
	}
	if len(ts) > 0 {
		if err := d.kernels.CheckCompat(info, ts); err != nil {
			return info, err
		}
	}
	return info, nil
}

// kernelCacheAfter checks the extracted tree before it is committed: it
// must hold a cache directory, its manifest decides compatibility per GPU,
// and its bytes must match what the image's labels promise.
func (p *pull) kernelCacheAfter(m cachestore.Manifest) error {
	d, info, res, started := p.d, p.kc, p.res, p.fetched
	var ts []gpu.Target
	manifests := 0
	for _, k := range kernels.Dirs {
		var bytes int64
		found := false
		for _, e := range m {
			if strings.HasPrefix(e.Path, k.Dir+"/") {
				found = true
				bytes += e.Size
			}
			if k.Manifest != "" && e.Path == k.Manifest+"/"+gpu.ManifestFile {
				t, err := d.kernels.ReadManifest(e)
				if err != nil {
					return fetchers.Permanent(fmt.Errorf("%s: %w", e.Path, err))
				}
				ts = append(ts, t...)
				manifests++
				// vLLM's entry count is of torch_compile_cache/<hash> directories
				// (MCV's vllm.go), not of kernels.
				if n := gpu.ParseSize(res.Labels[k.CountLabel]); k.Name != "vllm" && n >= 0 && int(n) != len(t) {
					return fetchers.Permanent(fmt.Errorf("%s lists %d entries but the image label %s says %d", e.Path, len(t), k.CountLabel, n))
				}
			}
		}
		if !found {
			continue
		}
		info.Dirs = append(info.Dirs, k.Dir)
		info.CacheBytes += bytes
		if k.Dir == mcv.TorchInductorCacheDir && hasPrefix(m, mcv.InductorTritonPath+"/") {
			info.Dirs = append(info.Dirs, mcv.InductorTritonPath) // TRITON_CACHE_DIR of what torch.compile wrote
		}
		if want := gpu.ParseSize(res.Labels[k.SizeLabel]); k.SizeLabel != "" && want >= 0 && want != bytes {
			return fetchers.Permanent(fmt.Errorf("extracted %d bytes under %s/ but the image label %s says %d: the image is inconsistent; rebuild it", bytes, k.Dir, k.SizeLabel, want))
		}
	}
	if len(info.Dirs) == 0 {
		return fetchers.Permanent(fmt.Errorf("the image holds no %s/, %s/ or %s/ directory: not a kernel cache image (MCV layout)", gpu.TritonCacheDir, gpu.VLLMCacheDir, gpu.TorchInductorCacheDir))
	}
	info.Entries = len(ts)
	info.ExtractSeconds = time.Since(started).Seconds()
	if manifests > 0 && (len(ts) > 0 || info.Compatibility == nil) {
		return d.kernels.CheckCompat(info, ts)
	}
	// A manifest without Triton entries (a vLLM binary cache embeds its
	// kernels in its artifacts): the summary label decided, before the download.
	if info.Compatibility == nil {
		return fetchers.Permanent(fmt.Errorf("the image has no %s/%s and no summary label: compatibility cannot be decided", gpu.TritonManifestDir, gpu.ManifestFile))
	}
	return nil
}

// hasPrefix says whether some path of m starts with prefix.
func hasPrefix(m cachestore.Manifest, prefix string) bool {
	for _, e := range m {
		if strings.HasPrefix(e.Path, prefix) {
			return true
		}
	}
	return false
}
