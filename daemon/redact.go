package daemon

import (
	"fmt"
	"strings"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers"
)

// Every local user reads the socket (list, inspect, status), the logs and
// the metrics, and the cluster reads events and node status: none of them
// may show a credential carried in a source URI (userinfo, a presigned
// URL's signature, a token parameter). The desire keeps its URI as given,
// for fetching; everything shown or stored beside it is redacted with
// fetchers.RedactURI and fetchers.RedactText at the boundary.

// redactView redacts the URIs and messages of an artifact view in place.
// The desire is copied, never changed where it lives.
func redactView(a *api.Artifact) {
	a.URI = fetchers.RedactURI(a.URI)
	a.Message = fetchers.RedactText(a.Message)
	if a.Desire != nil {
		ds := redactDesire(*a.Desire)
		a.Desire = &ds
	}
	if a.Next != nil {
		n := *a.Next
		n.URI, n.Message = fetchers.RedactURI(n.URI), fetchers.RedactText(n.Message)
		a.Next = &n
	}
	if len(a.Versions) > 0 {
		vs := make([]api.Version, len(a.Versions))
		copy(vs, a.Versions)
		for i := range vs {
			vs[i].Source = fetchers.RedactURI(vs[i].Source)
			vs[i].Message = fetchers.RedactText(vs[i].Message)
		}
		a.Versions = vs
	}
}

// redactDesire returns a copy of ds with its source URIs redacted.
func redactDesire(ds api.Desire) api.Desire {
	ds.URI = fetchers.RedactURI(ds.URI)
	if len(ds.KernelCaches) > 0 {
		kcs := make([]api.KernelCacheRef, len(ds.KernelCaches))
		copy(kcs, ds.KernelCaches)
		for i := range kcs {
			kcs[i].URI = fetchers.RedactURI(kcs[i].URI)
		}
		ds.KernelCaches = kcs
	}
	return ds
}

// redactedError is err with its message redacted; errors.Is and As still
// see what it wraps.
type redactedError struct{ err error }

func (e redactedError) Error() string { return fetchers.RedactText(e.err.Error()) }
func (e redactedError) Unwrap() error { return e.err }

// lostCredentials refuses to fetch a source whose credentials were
// redacted when the desire was stored and not given again since.
func lostCredentials(ds api.Desire) error {
	if !strings.Contains(ds.URI, fetchers.Redacted) || fetchers.RedactURI(ds.URI) != ds.URI {
		return nil
	}
	return fetchers.Permanent(fmt.Errorf("%w: the credentials in the source URI of %s were not kept across the daemon's restart (they are never written to disk); "+
		"pull it again with them (modelctl pull URI --name %s), or give them outside the URI (docs/sources.md: Credentials)", fetchers.ErrUnauthorized, ds.Name, ds.Name))
}
