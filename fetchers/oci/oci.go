// Package oci fetches models packaged as OCI artifacts or images:
// oci://<registry>/<repo>(:<tag>|@<digest>). A tag resolves to its manifest
// digest, which pins the artifact. Layouts understood: ModelPack
// (org.cncf.model.filepath annotations, raw or tar layers), KitOps
// ModelKits (tar layers), ORAS artifacts (raw layers named by
// org.opencontainers.image.title), and modelcar / container images whose
// tar layers carry a /models tree (only that subtree is taken; whiteouts
// honoured). Raw layers are files addressed by their sha256, so the same
// weights pulled from HF, S3 or a registry are stored once. It uses
// github.com/google/go-containerregistry with the docker config and
// credential helpers (authn.DefaultKeychain).
//
// oci.go holds the fetcher (resolve, layouts, layers); sign.go verifies
// an image's cosign signature against a SignaturePolicy (a key, or
// keyless with a certificate identity).
package oci

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/modelcache/modelcache/fetchers"
	httpfetcher "github.com/modelcache/modelcache/fetchers/http"
)

// Annotations that name a layer's file.
const (
	AnnotationModelPackPath = "org.cncf.model.filepath"
	AnnotationTitle         = "org.opencontainers.image.title"
	annotationORASUnpack    = "io.deis.oras.content.unpack" // oras push of a directory: a tar to unpack
)

// Fetcher implements fetchers.Fetcher for oci:// URIs. Safe for concurrent use.
type Fetcher struct {
	mirrors  map[string][]string // registry → mirrors tried first, in order
	insecure map[string]bool
	keychain authn.Keychain
	opts     fetchers.HTTPOptions
	rt       http.RoundTripper // opts.Transport in the redirect policy
}

// Option configures New.
type Option func(*Fetcher)

// WithInsecureRegistries allows plain HTTP to these registries
// (host:port); default none.
func WithInsecureRegistries(hosts ...string) Option {
	return func(f *Fetcher) {
		for _, h := range hosts {
			if h != "" {
				f.insecure[h] = true
			}
		}
	}
}

// WithMirror makes pulls from registry try mirror (host[:port]) first and
// fall back to the registry itself when the mirror fails. Content is
// verified by digest either way, so a mirror cannot change what is served.
func WithMirror(registry, mirror string) Option {
	return func(f *Fetcher) { f.mirrors[registry] = append(f.mirrors[registry], mirror) }
}

// WithHTTP sets the shared HTTP options (fetchers.Option): the transport
// (default remote.DefaultTransport), the redirect policy (registries send
// blobs to CDNs by redirect, and a redirect must not reach a
// host-internal address), and the idle timeout and User-Agent of blob
// downloads. A blob is read on one stream: the Range options are not read.
func WithHTTP(opts ...fetchers.Option) Option { return func(f *Fetcher) { f.opts.Apply(opts...) } }

// New returns an OCI fetcher.
func New(opts ...Option) *Fetcher {
	f := &Fetcher{mirrors: map[string][]string{}, insecure: map[string]bool{}, keychain: authn.DefaultKeychain, opts: fetchers.DefaultHTTPOptions()}
	f.opts.Transport = remote.DefaultTransport
	for _, o := range opts {
		o(f)
	}
	f.rt = f.opts.Guard.Transport(f.opts.Transport, nil)
	return f
}

// ParseURI parses oci://<registry>/<repo>(:<tag>|@<digest>).
func (f *Fetcher) ParseURI(uri string) (name.Reference, error) {
	ref, ok := strings.CutPrefix(uri, "oci://")
	if !ok || ref == "" {
		return nil, fmt.Errorf("source %q: %w: write oci://<registry>/<repo>:<tag> or @sha256:<hex>", uri, fetchers.ErrBadSource)
	}
	reg, _, _ := strings.Cut(ref, "/")
	var o []name.Option
	if f.insecure[reg] {
		o = append(o, name.Insecure)
	}
	r, err := name.ParseReference(ref, o...)
	if err != nil {
		return nil, fmt.Errorf("source %q: %w: %v", uri, fetchers.ErrBadSource, err)
	}
	return r, nil
}

// SendsCredentials reports whether the fetcher's keychain (the docker
// config and credential helpers, or WithKeychain's) holds a login for the
// registry of uri.
func (f *Fetcher) SendsCredentials(ctx context.Context, uri string) bool {
	ref, err := f.ParseURI(uri)
	if err != nil {
		return false
	}
	auth, err := authn.Resolve(ctx, f.keychain, ref.Context())
	return err == nil && auth != authn.Anonymous
}

func (f *Fetcher) remote(ctx context.Context) []remote.Option {
	return []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(f.keychain), remote.WithTransport(f.rt)}
}

// Resolve pins the reference to its digest and lists the layers as files
// (raw layers) or archives (tar layers).
func (f *Fetcher) Resolve(ctx context.Context, src fetchers.Source) (*fetchers.Resolved, error) {
	ref, err := f.ParseURI(src.URI)
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	var desc *remote.Descriptor
	err = f.tryMirrors(ref, func(r name.Reference) error {
		var err error
		desc, err = remote.Get(r, f.remote(ctx)...)
		return err
	})
	if err != nil {
		return nil, explain(ref, err)
	}
	var img v1.Image
	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, explain(ref, err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return nil, explain(ref, err)
		}
		var pick *v1.Descriptor
		for i, m := range im.Manifests {
			if m.Platform == nil || (m.Platform.OS == "linux" && m.Platform.Architecture == "amd64") || pick == nil {
				pick = &im.Manifests[i]
			}
		}
		if pick == nil {
			return nil, fetchers.Permanent(fmt.Errorf("%s: the index lists no manifests", ref))
		}
		if img, err = idx.Image(pick.Digest); err != nil {
			return nil, explain(ref, err)
		}
	} else if img, err = desc.Image(); err != nil {
		return nil, explain(ref, err)
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, explain(ref, err)
	}
	cfgType := string(m.Config.MediaType)
	image := strings.Contains(cfgType, "image.config") || strings.Contains(cfgType, "container.image")
	res := &fetchers.Resolved{URI: src.URI, Revision: desc.Digest.Hex}
	if src.KernelCache {
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, explain(ref, err)
		}
		res.Labels = cf.Config.Labels
	}
	for i, l := range m.Layers {
		mt := string(l.MediaType)
		isTar := strings.Contains(mt, "tar")
		mp, title := l.Annotations[AnnotationModelPackPath], l.Annotations[AnnotationTitle]
		loc := ref.Context().Digest(l.Digest.String()).String()
		raw := func(p string) {
			res.Files = append(res.Files, fetchers.File{Path: p, Size: l.Size, Digest: l.Digest.String(), Locator: loc, Mode: 0o644})
		}
		archive := func(sub string) {
			res.Files = append(res.Files, fetchers.File{Path: fmt.Sprintf("layer-%d", i), Size: l.Size, Digest: l.Digest.String(), Locator: loc,
				Archive: &fetchers.Archive{MediaType: mt, Subtree: sub}})
		}
		switch {
		case mp != "" && !isTar: // ModelPack raw layer
			raw(mp)
		case mp != "": // ModelPack tar layer
			archive("")
		case title != "" && l.Annotations[annotationORASUnpack] != "true":
			// ORAS names a file by its title whatever the media type (the oras
			// CLI's default for a file is the OCI tar layer type).
			raw(title)
		case isTar && src.KernelCache: // io.triton.cache/, io.vllm.cache/ and their manifests
			archive("")
		case isTar && image: // a modelcar: the model lives under /models
			archive("models")
		case isTar: // KitOps and other tar layers
			archive("")
		}
	}
	if len(res.Files) == 0 {
		return nil, fetchers.Permanent(fmt.Errorf("%s: %w: no layer is a model file (no %s or %s annotation) or a tar layer", ref, fetchers.ErrNotFound, AnnotationModelPackPath, AnnotationTitle))
	}
	return res, nil
}

// Open streams a layer blob from offset: a GET of the registry's blob URL
// with a Range from offset (the bytes before it are not fetched again),
// with the registry's authentication (go-containerregistry's transport:
// basic, or a bearer token for pull of the repository). It does not hash
// the bytes: the caller verifies them against the digest before they
// become a blob (go-containerregistry's Compressed() would hash every
// byte a second time).
func (f *Fetcher) Open(ctx context.Context, file fetchers.File, offset int64) (io.ReadCloser, error) {
	d, err := name.NewDigest(file.Locator, f.nameOpts(file.Locator)...)
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	var rc io.ReadCloser
	err = f.tryMirrors(d, func(r name.Reference) error {
		repo := r.Context()
		auth, err := authn.Resolve(ctx, f.keychain, repo)
		if err != nil {
			return err
		}
		rt, err := transport.NewWithContext(ctx, repo.Registry, auth, f.rt, []string{repo.Scope(transport.PullScope)})
		if err != nil {
			return err
		}
		get := httpfetcher.New(httpfetcher.WithClient(&http.Client{Transport: rt, CheckRedirect: fetchers.DropAuthAcrossOrigins}),
			httpfetcher.WithHTTP(fetchers.WithIdleTimeout(f.opts.IdleTimeout), fetchers.WithUserAgent(f.opts.UserAgent)))
		u := (&url.URL{Scheme: repo.Scheme(), Host: repo.RegistryStr(), Path: "/v2/" + repo.RepositoryStr() + "/blobs/" + d.DigestStr()}).String()
		rc, err = get.GetRange(ctx, u, file.Size, offset, -1, nil, func(resp *http.Response) error {
			return transport.CheckError(resp, http.StatusOK, http.StatusPartialContent)
		})
		return err
	})
	if err != nil {
		return nil, explain(d, err)
	}
	return rc, nil
}

// tryMirrors calls fn with the reference moved to each mirror of its
// registry in turn, then with the reference itself.
func (f *Fetcher) tryMirrors(ref name.Reference, fn func(name.Reference) error) error {
	for _, m := range f.mirrors[ref.Context().RegistryStr()] {
		r, err := name.ParseReference(strings.Replace(ref.Name(), ref.Context().RegistryStr(), m, 1), f.nameOpts(m)...)
		if err != nil {
			continue
		}
		if err := fn(r); err == nil {
			return nil
		}
	}
	return fn(ref)
}

func (f *Fetcher) nameOpts(ref string) []name.Option {
	reg, _, _ := strings.Cut(ref, "/")
	if f.insecure[reg] {
		return []name.Option{name.Insecure}
	}
	return nil
}

func explain(ref name.Reference, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		switch te.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return fetchers.Permanent(fmt.Errorf("%s: %w: log in to %s (docker login / a credential helper) or check the pull secret", ref, fetchers.ErrUnauthorized, ref.Context().RegistryStr()))
		case http.StatusNotFound:
			return fetchers.Permanent(fmt.Errorf("%s: %w: no such repository, tag or digest", ref, fetchers.ErrNotFound))
		case http.StatusTooManyRequests:
			return &fetchers.RetryAfterError{Status: te.StatusCode}
		}
	}
	return fmt.Errorf("%s: %w", ref, err)
}

// WithKeychain sets where registry credentials come from; default the
// docker config and credential helpers (authn.DefaultKeychain).
func WithKeychain(k authn.Keychain) Option { return func(f *Fetcher) { f.keychain = k } }

// DockerConfigKeychain reads a .dockerconfigjson (a Kubernetes pull
// secret's content) into a keychain; registries it does not name are
// anonymous.
func DockerConfigKeychain(b []byte) (authn.Keychain, error) {
	var cfg struct {
		Auths map[string]struct {
			Auth     string `json:"auth"`
			Username string `json:"username"`
			Password string `json:"password"`
		} `json:"auths"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, fmt.Errorf(".dockerconfigjson: %w", err)
	}
	k := staticKeychain{}
	for host, a := range cfg.Auths {
		user, pass := a.Username, a.Password
		if a.Auth != "" {
			raw, err := base64.StdEncoding.DecodeString(a.Auth)
			if err != nil {
				return nil, fmt.Errorf(".dockerconfigjson: auth of %s: %w", host, err)
			}
			user, pass, _ = strings.Cut(string(raw), ":")
		}
		host = strings.TrimPrefix(strings.TrimPrefix(host, "https://"), "http://")
		host, _, _ = strings.Cut(host, "/")
		k[host] = authn.FromConfig(authn.AuthConfig{Username: user, Password: pass})
	}
	return k, nil
}

type staticKeychain map[string]authn.Authenticator

func (k staticKeychain) Resolve(r authn.Resource) (authn.Authenticator, error) {
	if a, ok := k[r.RegistryStr()]; ok {
		return a, nil
	}
	return authn.Anonymous, nil
}
