package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers"
	filefetcher "github.com/modelcache/modelcache/fetchers/file"
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

// nobody is the identity of a desire whose requester is unknown (one
// persisted before requesters were recorded): it reads only what every
// local user may read.
const nobody = 65534

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

// Origins of desires: the socket, or a models.d file (originFile + path).
const (
	originAPI  = "api"
	originFile = "file:"
)

// credentialKeys are the keys a credentials file (and a ModelCache's
// Secret) may hold.
var credentialKeys = map[string]bool{
	"HF_TOKEN": true, "AWS_ACCESS_KEY_ID": true, "AWS_SECRET_ACCESS_KEY": true, "AWS_SESSION_TOKEN": true, "HTTP_AUTHORIZATION": true,
	"NGC_API_KEY": true,
}

// readCredentialsFile reads a models.d desire's credentialsFile: KEY=VALUE
// lines (blank lines, # comments, an "export " prefix and quotes allowed),
// a regular file of at most 64 KiB. Errors are parseCredentials'.
func readCredentialsFile(path string) (map[string]string, error) {
	b, err := fetchers.ReadConfigFile(path, 64<<10)
	if err != nil {
		return nil, err
	}
	return parseCredentials(path, b)
}

// Why a credentials line is refused. The messages are fixed text: an
// error names the file, the line number and, only where it looks like a
// key name, the key; never a value nor the line (errors reach modelctl
// list, the log and the node's status, which every local user reads).
var (
	credentialKeyList  = strings.Join(slices.Sorted(maps.Keys(credentialKeys)), ", ")
	credWant           = "want KEY=VALUE with KEY one of " + credentialKeyList
	credNotKeyValue    = "not KEY=VALUE (the line is not shown: it may hold a secret); " + credWant
	credHiddenKey      = "the text before '=' is not a known key (not shown: it may be a secret); " + credWant
	credUnknownKey     = "unknown key %q; " + credWant
	credColonNotEquals = "%s followed by ':'; write %s=<value> (the value is not shown)"
	credUnclosedQuote  = "%s: the value's opening quote is not closed (the value is not shown)"
)

// plausibleKey reports whether s looks like the name of a key rather
// than a value: an upper-case identifier (letters, digits, underscores;
// a letter first) of at most 64 characters, with an underscore if it has
// digits (an upper-case token such as a base32 secret has digits and no
// underscore).
func plausibleKey(s string) bool {
	if s == "" || len(s) > 64 || s[0] < 'A' || s[0] > 'Z' {
		return false
	}
	digits := false
	for _, c := range []byte(s) {
		switch {
		case c >= 'A' && c <= 'Z', c == '_':
		case c >= '0' && c <= '9':
			digits = true
		default:
			return false
		}
	}
	return !digits || strings.Contains(s, "_")
}

// isValueIn reports whether k overlaps a value of the file b (the text
// after the first '=' or ':' of any line): k is in the value, or a value
// of at least 4 bytes is in k. Such a k is not shown even when it looks
// like a key name.
func isValueIn(k string, b []byte) bool {
	for _, line := range strings.Split(string(b), "\n") {
		for _, sep := range "=:" {
			if _, v, ok := strings.Cut(line, string(sep)); ok {
				if v = strings.TrimSpace(v); strings.Contains(v, k) || (len(v) >= 4 && strings.Contains(k, v)) {
					return true
				}
			}
		}
	}
	return false
}

// parseCredentials parses the content of the credentials file at path
// (see readCredentialsFile). An error names path, the line number and,
// when it is a plausible key name (plausibleKey) that is no part of a
// value, the key; never a value nor a line that does not parse.
func parseCredentials(path string, b []byte) (map[string]string, error) {
	out := map[string]string{}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		rest := strings.TrimPrefix(line, "export ")
		if j := strings.IndexAny(rest, "=:"); j >= 0 && rest[j] == ':' && credentialKeys[strings.TrimSpace(rest[:j])] {
			k := strings.TrimSpace(rest[:j])
			return nil, fmt.Errorf("%s line %d: "+credColonNotEquals, path, i+1, k, k)
		}
		k, v, ok := strings.Cut(rest, "=")
		k = strings.TrimSpace(k)
		switch {
		case !ok:
			return nil, fmt.Errorf("%s line %d: %s", path, i+1, credNotKeyValue)
		case credentialKeys[k]:
		case plausibleKey(k) && !isValueIn(k, b):
			return nil, fmt.Errorf("%s line %d: "+credUnknownKey, path, i+1, k)
		default:
			return nil, fmt.Errorf("%s line %d: %s", path, i+1, credHiddenKey)
		}
		v = strings.TrimSpace(v)
		if v != "" && (v[0] == '"' || v[0] == '\'') {
			if len(v) < 2 || v[len(v)-1] != v[0] {
				return nil, fmt.Errorf("%s line %d: "+credUnclosedQuote, path, i+1, k)
			}
			v = v[1 : len(v)-1]
		}
		out[k] = v
	}
	return out, nil
}

// identity is the fetchers' form of a socket desire's requester; nil
// reads as the daemon (readAs never passes nil).
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
	ds.Stage, ds.Retain, ds.Revision, ds.Policy = false, nil, "", "" // the cluster's only
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

// fromCluster: the desire comes from a ModelCache (k8ssync), not from the
// socket or a models.d file. Whatever origin is not one of those two
// counts as the cluster's, the most confined.
func fromCluster(ds api.Desire) bool {
	return ds.Origin != originAPI && !strings.HasPrefix(ds.Origin, originFile)
}

// readAs is who a desire's file:// source is read as: a socket pull as
// its requester (nobody when unknown), a models.d file or a ModelCache as
// --file-identity; never as the daemon by default.
func (s *sources) readAs(ds api.Desire) *fetchers.Identity {
	if ds.Origin == originAPI {
		if ds.Requester == nil {
			return &fetchers.Identity{UID: nobody, GID: nobody}
		}
		return identity(ds.Requester)
	}
	return s.fileAs
}

// checkClusterSource refuses, before it is persisted, a ModelCache's
// file:// source this node never reads for the cluster: any while
// --file-roots is unset, one outside them, one under kubelet's or the
// daemon's own directories.
func (s *sources) checkClusterSource(ds api.Desire) error {
	if ds.State == api.StateAbsent || s.clusterFile == nil {
		return nil
	}
	if s, _ := fetchers.Scheme(ds.URI); s != "file" {
		return nil
	}
	if err := s.clusterFile.CheckRoots(ds.URI); err != nil {
		return api.Errorf(toAPIError(err).Code, "artifact %s: %v", ds.Name, err)
	}
	return nil
}

// checkSourceAccess refuses, before anything is persisted, a socket pull
// of a local source that its requester may not read (or that lies outside
// --file-roots): the pull itself would fail the same way, later.
func (s *sources) checkSourceAccess(ctx context.Context, ds api.Desire) error {
	if ds.State == api.StateAbsent {
		return nil
	}
	ff, ok := s.shared["file"].(*filefetcher.Fetcher)
	if s, _ := fetchers.Scheme(ds.URI); s != "file" || !ok {
		return nil
	}
	_, err := ff.Resolve(ctx, fetchers.Source{URI: ds.URI, As: identity(ds.Requester)})
	if err != nil {
		return api.Errorf(toAPIError(err).Code, "artifact %s: %v", ds.Name, err)
	}
	return nil
}
