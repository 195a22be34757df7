package daemon

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers"
	hffetcher "github.com/modelcache/modelcache/fetchers/hf"
	httpfetcher "github.com/modelcache/modelcache/fetchers/http"
	ngcfetcher "github.com/modelcache/modelcache/fetchers/ngc"
	ocifetcher "github.com/modelcache/modelcache/fetchers/oci"
	s3fetcher "github.com/modelcache/modelcache/fetchers/s3"
)

// credentialsFor returns the in-memory credentials of a cluster desire.
func (d *Daemon) credentialsFor(name string) map[string]string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c, ok := d.creds[name]; ok {
		return c
	}
	// A kernel cache that a ModelCache lists uses the model's credentials:
	// only one the daemon expanded from that model's own desire, for the
	// URI the model names. Nothing from the socket can claim them.
	want := d.desired()
	if ds, ok := want[name]; ok && ds.Serves != "" {
		if model, ok := want[ds.Serves]; ok && model.Origin == ds.Origin && listsKernelCache(model, name, ds.URI) {
			return d.creds[ds.Serves]
		}
	}
	return nil
}

// fetcherFor returns the fetcher of a desire: the shared one, or one
// made with the desire's credentials from a Secret (HF_TOKEN;
// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN;
// .dockerconfigjson; NGC_API_KEY), kept while the credentials stay the same.
func (d *Daemon) fetcherFor(ds api.Desire, src source) (fetchers.Fetcher, error) {
	return d.fetcherWith(ds, src, d.credentialsFor(ds.Name))
}

// fetcherWith is fetcherFor with the credentials given (a cluster
// resolution's, from the ModelCache's Secret).
func (d *Daemon) fetcherWith(ds api.Desire, src source, creds map[string]string) (fetchers.Fetcher, error) {
	if ds.CredentialsFile != "" && strings.HasPrefix(ds.Origin, originFile) {
		var err error
		if creds, err = readCredentialsFile(ds.CredentialsFile); err != nil {
			return nil, fetchers.Permanent(fmt.Errorf("credentials of %s: %w", ds.Name, err))
		}
	}
	scheme := src.scheme
	if len(creds) == 0 {
		return d.sharedFetcher(ds, src)
	}
	b, _ := json.Marshal(creds)
	sum := sha256.Sum256(append([]byte(scheme+"\x00"), b...))
	key := hex.EncodeToString(sum[:])
	d.mu.Lock()
	f, ok := d.credFetchers[key]
	d.mu.Unlock()
	if ok {
		return f, nil
	}
	switch scheme {
	case "hf":
		tok := creds["HF_TOKEN"]
		if tok == "" {
			return d.sharedFetcher(ds, src)
		}
		hub, err := d.newHub(hffetcher.WithToken(tok))
		if err != nil {
			return nil, err
		}
		f = hub
	case "s3":
		if creds["AWS_ACCESS_KEY_ID"] == "" {
			return d.sharedFetcher(ds, src)
		}
		sf, err := d.newS3(s3fetcher.WithStaticCredentials(creds["AWS_ACCESS_KEY_ID"], creds["AWS_SECRET_ACCESS_KEY"], creds["AWS_SESSION_TOKEN"]))
		if err != nil {
			return nil, err
		}
		f = sf
	case "oci":
		cfg := creds[".dockerconfigjson"]
		if cfg == "" {
			return d.sharedFetcher(ds, src)
		}
		kc, err := ocifetcher.DockerConfigKeychain([]byte(cfg))
		if err != nil {
			return nil, fetchers.Permanent(fmt.Errorf("credentials of %s: %w", ds.Name, err))
		}
		f = ocifetcher.New(append(d.ociOpts, ocifetcher.WithKeychain(kc))...)
	case "ngc":
		nf, err := d.ngcWithCredentials(creds)
		if err != nil {
			return nil, err
		}
		if nf == nil {
			return d.sharedFetcher(ds, src)
		}
		f = nf
	case "http", "https":
		auth := creds["HTTP_AUTHORIZATION"]
		if auth == "" {
			return d.sharedFetcher(ds, src)
		}
		f = d.newHTTP(httpfetcher.WithAuthorization(auth))
	default:
		return d.sharedFetcher(ds, src)
	}
	d.mu.Lock()
	d.credFetchers[key] = f
	d.mu.Unlock()
	return f, nil
}

// pinnedURI is the URI that names exactly the revision res resolved to,
// where the scheme has such a form: hf://org/repo@<commit>,
// oci://registry/repo@sha256:<hex>, ngc://org[/team]/model:<version>.
// Other schemes (s3, http, file) have none: the URI stays as given and
// the cluster's folder checksum (api.Desire.ClusterDigest) pins the bytes.
func pinnedURI(src source, res *fetchers.Resolved) string {
	if res.Revision == "" {
		return src.uri
	}
	switch src.scheme {
	case "hf":
		if res.Repo != "" {
			return "hf://" + res.Repo + "@" + res.Revision
		}
	case "oci":
		ref := strings.TrimPrefix(src.uri, "oci://")
		ref, _, _ = strings.Cut(ref, "@")
		if i := strings.LastIndexByte(ref, ':'); i > strings.LastIndexByte(ref, '/') {
			ref = ref[:i] // the tag
		}
		return "oci://" + ref + "@sha256:" + res.Revision
	case "ngc":
		r, err := ngcfetcher.ParseURI(src.uri)
		if err == nil {
			r.Version = res.Revision
			return r.String()
		}
	}
	return src.uri
}

// fetcherOptions are the daemon's settings that the hub, NGC, S3 and
// http(s) fetchers share: the idle timeout, the Range connections of one
// large file, and which addresses are host-internal.
func (d *Daemon) fetcherOptions() []fetchers.Option {
	return []fetchers.Option{fetchers.WithIdleTimeout(d.cfg.IdleTimeout), fetchers.WithConnections(max(d.cfg.RangeConnections, 1)),
		fetchers.WithInternal(d.cfg.InternalAddress)}
}

// newHub and newS3 make the hub and S3 fetchers with the daemon's
// settings; extra options add credentials (fetcherFor).
func (d *Daemon) newHub(extra ...hffetcher.Option) (*hffetcher.Fetcher, error) {
	return hffetcher.New(append([]hffetcher.Option{hffetcher.WithHTTP(d.fetcherOptions()...)}, extra...)...)
}

func (d *Daemon) newS3(extra ...s3fetcher.Option) (*s3fetcher.Fetcher, error) {
	return s3fetcher.New(append([]s3fetcher.Option{s3fetcher.WithHTTP(d.fetcherOptions()...)}, extra...)...)
}

// newHTTP makes an http(s) fetcher with the daemon's settings (and extra).
func (d *Daemon) newHTTP(extra ...httpfetcher.Option) *httpfetcher.Fetcher {
	shared := append(d.fetcherOptions(), fetchers.WithUserAgent("modelcached/"+d.cfg.Version))
	return httpfetcher.New(append([]httpfetcher.Option{httpfetcher.WithHTTP(shared...)}, extra...)...)
}

// sharedFetcher is the daemon's fetcher of the source's scheme.
func (d *Daemon) sharedFetcher(ds api.Desire, src source) (fetchers.Fetcher, error) {
	if src.scheme == "file" && fromCluster(ds) && d.clusterFile != nil {
		return d.clusterFile, nil
	}
	if f, ok := d.fetchers[src.scheme]; ok {
		return f, nil
	}
	return d.fetchers.For(ds.URI) // its error names the schemes this daemon knows
}

// newNGC makes an ngc:// fetcher with the daemon's settings (and extra):
// endpoints and key from NGC_API_ENDPOINT, NGC_AUTH_ENDPOINT, NGC_API_KEY
// (or NGC_CLI_API_KEY, or the file NGC_API_KEY_FILE names).
func (d *Daemon) newNGC(extra ...ngcfetcher.Option) (*ngcfetcher.Fetcher, error) {
	return ngcfetcher.New(append([]ngcfetcher.Option{ngcfetcher.WithHTTP(d.fetcherOptions()...),
		ngcfetcher.WithLogger(d.log.With("fetcher", "ngc"))}, extra...)...)
}

// ngcWithCredentials is the ngc:// fetcher of a desire whose credentials
// (a ModelCache Secret, a models.d credentialsFile) hold NGC_API_KEY; nil
// when they do not.
func (d *Daemon) ngcWithCredentials(creds map[string]string) (fetchers.Fetcher, error) {
	key := creds["NGC_API_KEY"]
	if key == "" {
		return nil, nil
	}
	f, err := d.newNGC(ngcfetcher.WithAPIKey(key))
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	return f, nil
}
