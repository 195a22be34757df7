package daemon

import (
	"context"
	"log/slog"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers"
	filefetcher "github.com/modelcache/modelcache/fetchers/file"
)

// originAPI is the origin of a desire that came over the socket.
const originAPI = "api"

// identity is the fetchers' form of a desire's requester; nil (the node's
// own configuration) reads as the daemon.
func identity(r *api.Requester) *fetchers.Identity {
	if r == nil {
		return nil
	}
	return &fetchers.Identity{UID: r.UID, GID: r.GID, Groups: r.Groups}
}

// trustSocketDesire cleans a socket desire read back from the index: one
// persisted before the socket had a wire type of its own may carry fields
// only the daemon may set. Serves is dropped (a kernel cache attaches to a
// model only through that model's own desire), and a desire without a
// requester reads local sources as nobody.
func trustSocketDesire(ds api.Desire, log *slog.Logger) api.Desire {
	if ds.Serves != "" {
		log.Warn("a socket desire claimed to serve a model; dropping the claim (a kernel cache attaches only through the model's own desire)", "artifact", ds.Name, "serves", ds.Serves)
		ds.Serves = ""
	}
	ds.Origin = originAPI
	if ds.Requester == nil {
		ds.Requester = &api.Requester{UID: nobody, GID: nobody}
	}
	return ds
}

// listsKernelCache reports whether model's desire lists the kernel cache
// name with uri (as expandKernelCaches names them).
func listsKernelCache(model api.Desire, name, uri string) bool {
	for i, kc := range model.KernelCaches {
		if model.KernelCacheName(i) == name && kc.URI == uri {
			return true
		}
	}
	return false
}

// checkSourceAccess refuses, before anything is persisted, a socket pull
// of a local source that its requester may not read (or that lies outside
// --file-roots): the pull itself would fail the same way, later.
func (d *Daemon) checkSourceAccess(ctx context.Context, ds api.Desire) error {
	if ds.State == api.StateAbsent {
		return nil
	}
	ff, ok := d.fetchers["file"].(*filefetcher.Fetcher)
	if s, _ := fetchers.Scheme(ds.URI); s != "file" || !ok {
		return nil
	}
	_, err := ff.Resolve(ctx, fetchers.Source{URI: ds.URI, As: identity(ds.Requester)})
	if err != nil {
		return api.Errorf(toAPIError(err).Code, "artifact %s: %v", ds.Name, err)
	}
	return nil
}
