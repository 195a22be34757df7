package daemon

import (
	"fmt"
	"strings"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/sources"
	"github.com/modelcache/modelcache/fetchers"
	ocifetcher "github.com/modelcache/modelcache/fetchers/oci"
)

// checkURISizes refuses a desire whose source, or a kernel cache's, is
// longer than api.MaxURIBytes, naming the cap (validateDesire: the
// socket, models.d and the cluster alike).
func checkURISizes(ds api.Desire) error {
	uris := []string{ds.URI}
	for _, kc := range ds.KernelCaches {
		uris = append(uris, kc.URI)
	}
	for _, u := range uris {
		if len(u) > api.MaxURIBytes {
			return api.Errorf(api.CodeInvalid, "artifact %s: a source URI of %d bytes; the cap is %d bytes (8 KiB, api.MaxURIBytes)", ds.Name, len(u), api.MaxURIBytes)
		}
	}
	return nil
}

// validateDesire checks a desire from the API or a file and fills defaults.
func (d *Daemon) validateDesire(ds api.Desire) (api.Desire, error) {
	if err := cachestore.ValidateName(ds.Name); err != nil {
		return ds, api.Errorf(api.CodeInvalid, "%v", err)
	}
	if ds.URI == "" {
		return ds, api.Errorf(api.CodeInvalid, "artifact %s: no source URI", ds.Name)
	}
	if err := checkURISizes(ds); err != nil {
		return ds, err
	}
	if err := d.sources.Known(ds.URI); err != nil {
		return ds, api.Errorf(api.CodeInvalid, "artifact %s: %v", ds.Name, err)
	}
	if ds.Digest != "" {
		nd, err := cachestore.NormalizeDigest(ds.Digest)
		if err != nil {
			return ds, api.Errorf(api.CodeInvalid, "artifact %s: --digest %v", ds.Name, err)
		}
		ds.Digest = nd
	}
	switch ds.State {
	case "":
		ds.State = api.StatePresent
	case api.StatePresent, api.StateAbsent:
	default:
		return ds, api.Errorf(api.CodeInvalid, "artifact %s: state %q; want present or absent", ds.Name, ds.State)
	}
	if ds.LocalGroup != "" {
		if _, err := localGroupID(ds.LocalGroup); err != nil {
			return ds, api.Errorf(api.CodeInvalid, "artifact %s: localGroup: %v", ds.Name, err)
		}
	}
	for _, g := range append(append([]string(nil), ds.Include...), ds.Exclude...) {
		if _, err := fetchers.CompileGlob(g); err != nil {
			return ds, api.Errorf(api.CodeInvalid, "artifact %s: %v", ds.Name, err)
		}
	}
	return ds, validateKernelCaches(ds, d.cfg.KernelCacheSignaturePolicy)
}

// validateKernelCaches checks the kernel cache parts of a desire: the kind,
// oci:// sources, names, and signature policies. Over the socket keys and
// trusted roots must be their content (modelctl reads --key and
// --trusted-root files), so no client makes the daemon open a path of its
// choosing, and a policy may not go below the node's floor; a models.d
// file or a ModelCache is the node's configuration and may do both.
func validateKernelCaches(ds api.Desire, floor string) error {
	bad := func(f string, a ...any) error {
		return api.Errorf(api.CodeInvalid, "artifact %s: %s", ds.Name, fmt.Sprintf(f, a...))
	}
	fromSocket := ds.Origin == sources.OriginAPI
	checkPolicy := func(what string, p *api.SignaturePolicy) error {
		if p == nil {
			return nil
		}
		if p.Policy != "" && p.Policy != api.PolicyRequired && p.Policy != api.PolicyOff {
			return bad("%s: signature policy %q: use required or off", what, p.Policy)
		}
		if fromSocket && p.Policy == api.PolicyOff && floor != api.PolicyOff {
			return api.Errorf(api.CodeForbidden, "artifact %s: %s: this node requires signed kernel caches "+
				"(modelcached --kernel-cache-signature-policy=%s) and a pull may tighten that, never turn it off; "+
				"sign the image (cosign sign --key cosign.key IMAGE) and pull with --key cosign.pub, or declare it in models.d", ds.Name, what, api.PolicyRequired)
		}
		for _, k := range p.Keys {
			if fromSocket && !strings.Contains(k, "-----BEGIN") {
				return bad("%s: a key over the socket must be PEM text (modelctl pull --key FILE sends it so)", what)
			}
		}
		if fromSocket && p.TrustedRoot != "" && !ocifetcher.IsInlineTrustedRoot(p.TrustedRoot) {
			return bad("%s: a trusted root over the socket must be its content, a trusted_root.json or PEM CA bundle (modelctl pull --trusted-root FILE sends it so)", what)
		}
		if (p.Identity != "" || p.IdentityRegexp != "") && p.TrustedRoot == "" {
			return bad("%s: keyless verification needs trustedRoot (a trusted_root.json or PEM CA bundle)", what)
		}
		return nil
	}
	oci := func(u string) bool { return strings.HasPrefix(u, "oci://") }
	switch ds.Kind {
	case "", api.KindModel:
		if ds.Signature != nil {
			return bad("a signature policy applies to kernel caches; put it under kernelCaches")
		}
	case api.KindKernelCache:
		if !oci(ds.URI) {
			return bad("a kernel cache is an OCI image; write oci://<registry>/<repo>:<tag>")
		}
		if len(ds.KernelCaches) > 0 {
			return bad("kernelCaches belong to a model, not to a kernel cache")
		}
		if err := checkPolicy("kernel cache", ds.Signature); err != nil {
			return err
		}
	default:
		return bad("kind %q: use model or kernelcache", ds.Kind)
	}
	for i, kc := range ds.KernelCaches {
		if !oci(kc.URI) {
			return bad("kernelCaches[%d]: %q is not an oci:// image", i, kc.URI)
		}
		if err := cachestore.ValidateName(ds.KernelCacheName(i)); err != nil {
			return bad("kernelCaches[%d]: %v", i, err)
		}
		if err := checkPolicy(fmt.Sprintf("kernelCaches[%d]", i), kc.Signature); err != nil {
			return err
		}
	}
	return nil
}
