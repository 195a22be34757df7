package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/daemon/sources"
)

type credKey struct{}

// peerContext records the peer on each connection: read once at accept
// by the peerListener, or here for a bare unix conn.
func peerContext(ctx context.Context, c net.Conn) context.Context {
	var p *peer
	switch c := c.(type) {
	case *peerConn:
		p = c.cred
	case *net.UnixConn:
		p = peerCred(c)
	}
	if p == nil {
		return ctx
	}
	return context.WithValue(ctx, credKey{}, p)
}

func peerOf(r *http.Request) *peer {
	p, _ := r.Context().Value(credKey{}).(*peer)
	return p
}

// mayMutate: root, the daemon's own uid, or a member of the socket group
// (primary or supplementary, as the socket recorded them at connect).
func (d *Daemon) mayMutate(r *http.Request) bool {
	p := peerOf(r)
	if p == nil {
		return false
	}
	if p.Uid == 0 || int(p.Uid) == os.Geteuid() {
		return true
	}
	return d.gid >= 0 && p.inGroup(d.gid)
}

// requester is the identity of the request's peer: its uid, gid and
// supplementary groups. A peer without credentials (never on a unix
// socket) is nobody.
func requester(r *http.Request) *api.Requester {
	p := peerOf(r)
	if p == nil {
		return &api.Requester{UID: nobody, GID: nobody}
	}
	return &api.Requester{UID: p.Uid, GID: p.Gid, Groups: p.Groups}
}

// nobody is the identity of a desire whose requester is unknown
// (sources.Nobody): it reads only what every local user may read.
const nobody = sources.Nobody

func (d *Daemon) forbidden(r *http.Request) *api.Error {
	who := "this peer"
	if cred := peerOf(r); cred != nil {
		who = fmt.Sprintf("uid %d", cred.Uid)
	}
	how := "run it as root"
	if d.gid >= 0 {
		how = fmt.Sprintf("run it as root (sudo) or join group %s (sudo usermod -aG %s $USER, then log in again)", d.cfg.SocketGroup, d.cfg.SocketGroup)
	}
	return api.Errorf(api.CodeForbidden, "%s may read the cache but not change it; %s", who, how)
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
	ds.Origin = sources.OriginAPI
	ds.Stage, ds.Retain, ds.Revision, ds.Policy = false, nil, "", "" // the cluster's only
	if ds.Requester == nil {
		ds.Requester = &api.Requester{UID: nobody, GID: nobody}
	}
	return ds
}
