package sources

import (
	"context"
	"strings"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers"
	filefetcher "github.com/modelcache/modelcache/fetchers/file"
)

// Origins of desires: the socket, or a models.d file (OriginFile + path).
const (
	OriginAPI  = "api"
	OriginFile = "file:"
)

// Nobody is the identity of a desire whose requester is unknown (one
// persisted before requesters were recorded): it reads only what every
// local user may read.
const Nobody = 65534

// identity is the fetchers' form of a socket desire's requester; nil
// reads as the daemon (ReadAs never passes nil).
func identity(r *api.Requester) *fetchers.Identity {
	if r == nil {
		return nil
	}
	return &fetchers.Identity{UID: r.UID, GID: r.GID, Groups: r.Groups}
}

// listsKernelCache reports whether model's desire lists the kernel cache
// name with uri (as api.Desire.KernelCacheName names them).
func listsKernelCache(model api.Desire, name, uri string) bool {
	for i, kc := range model.KernelCaches {
		if model.KernelCacheName(i) == name && kc.URI == uri {
			return true
		}
	}
	return false
}

// fromCluster: the desire comes from a ModelCache (k8ssync), not from the
// socket or a models.d file. Whatever origin is not one of those two
// counts as the cluster's, the most confined.
func fromCluster(ds api.Desire) bool {
	return ds.Origin != OriginAPI && !strings.HasPrefix(ds.Origin, OriginFile)
}

// ReadAs is who a desire's file:// source is read as: a socket pull as
// its requester (Nobody when unknown), a models.d file or a ModelCache as
// --file-identity; never as the daemon by default.
func (s *Set) ReadAs(ds api.Desire) *fetchers.Identity {
	if ds.Origin == OriginAPI {
		if ds.Requester == nil {
			return &fetchers.Identity{UID: Nobody, GID: Nobody}
		}
		return identity(ds.Requester)
	}
	return s.fileAs
}

// Credentialed says whether ds is fetched with credentials: a models.d
// credentialsFile, the cluster's Secret for it, credentials in its URI
// (or in one of its kernel caches'), or the daemon's own for its source
// (the shared fetcher sends some: HF_TOKEN, AWS keys, NGC_API_KEY, a
// registry login). An s3:// source asks the SDK's credential chain,
// bounded by ctx and a few seconds.
func (s *Set) Credentialed(ctx context.Context, ds api.Desire) bool {
	if ds.CredentialsFile != "" || len(s.CredentialsFor(ds.Name)) > 0 {
		return true
	}
	uris := []string{ds.URI}
	for _, kc := range ds.KernelCaches {
		uris = append(uris, kc.URI)
	}
	for _, uri := range uris {
		if fetchers.RedactURI(uri) != uri || strings.Contains(uri, fetchers.Redacted) {
			return true
		}
		scheme, err := fetchers.Scheme(uri)
		if err != nil {
			continue
		}
		f, err := s.sharedFetcher(api.Desire{URI: uri, Origin: ds.Origin}, scheme)
		if cs, ok := f.(fetchers.CredentialSender); ok && err == nil && cs.SendsCredentials(ctx, uri) {
			return true
		}
	}
	return false
}

// CheckClusterSource refuses, before it is persisted, a ModelCache's
// file:// source this node never reads for the cluster: any while
// --file-roots is unset, one outside them, one under kubelet's or the
// daemon's own directories.
func (s *Set) CheckClusterSource(ds api.Desire) error {
	if ds.State == api.StateAbsent || s.clusterFile == nil {
		return nil
	}
	if s, _ := fetchers.Scheme(ds.URI); s != "file" {
		return nil
	}
	if err := s.clusterFile.CheckRoots(ds.URI); err != nil {
		return s.refused(ds.Name, err)
	}
	return nil
}

// CheckSourceAccess refuses, before anything is persisted, a socket pull
// of a local source that its requester may not read (or that lies outside
// --file-roots): the pull itself would fail the same way, later.
func (s *Set) CheckSourceAccess(ctx context.Context, ds api.Desire) error {
	if ds.State == api.StateAbsent {
		return nil
	}
	ff, ok := s.shared["file"].(*filefetcher.Fetcher)
	if s, _ := fetchers.Scheme(ds.URI); s != "file" || !ok {
		return nil
	}
	_, err := ff.Resolve(ctx, fetchers.Source{URI: ds.URI, As: identity(ds.Requester)})
	if err != nil {
		return s.refused(ds.Name, err)
	}
	return nil
}

// refused is the socket API's error of a source refused before a desire
// is persisted: the code Config.Code gives err, the artifact named.
func (s *Set) refused(name string, err error) error {
	code := api.CodeInternal
	if s.cfg.Code != nil {
		code = s.cfg.Code(err)
	}
	return api.Errorf(code, "artifact %s: %v", name, err)
}
