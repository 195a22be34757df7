package sources

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers"
	filefetcher "github.com/modelcache/modelcache/fetchers/file"
	hffetcher "github.com/modelcache/modelcache/fetchers/hf"
	"github.com/modelcache/modelcache/fetchers/hf/xet"
	httpfetcher "github.com/modelcache/modelcache/fetchers/http"
	ngcfetcher "github.com/modelcache/modelcache/fetchers/ngc"
	ocifetcher "github.com/modelcache/modelcache/fetchers/oci"
	s3fetcher "github.com/modelcache/modelcache/fetchers/s3"
)

// Config is what a Set needs of the daemon's configuration.
type Config struct {
	// FileRoots, when set, are the only directories file:// sources may
	// read; FileDenied are the paths file:// never reads, whatever
	// FileRoots say.
	FileRoots, FileDenied []string
	// FileAs is who models.d and ModelCache file:// sources read as.
	FileAs *fetchers.Identity
	// InsecureRegistries are OCI registries (host:port) reached over plain
	// HTTP; RegistryMirrors are "registry=mirror" pairs.
	InsecureRegistries, RegistryMirrors []string
	// InternalAddress reports which addresses a redirect may not lead to.
	InternalAddress func(netip.Addr) bool
	// IdleTimeout: a stream that delivers nothing this long is retried.
	IdleTimeout time.Duration
	// RangeConnections is the most connections per large hub, NGC or S3
	// file; at least 1 is used.
	RangeConnections int
	// Version is the daemon's, in the http(s) fetchers' User-Agent.
	Version string
	// Code is the socket API's code of an error (the daemon's one
	// error→code table); a refused source keeps it.
	Code func(error) string
	// Xet decides, per desire, whether its hf:// files are rebuilt from
	// the Hub's Xet store, and with which store of chunks the node holds
	// (the daemon's hfXetOptions; an empty desire asks for the shared
	// fetcher's). The store is nil when the answer is no, and the same
	// for every desire it enables (the node's one store): hub fetchers
	// are shared by the answer. Nil: never.
	Xet func(ds api.Desire) (enabled bool, cs xet.ChunkStore)
}

// Set is where a desire's bytes come from: the shared fetcher of each
// scheme, fetchers made with a desire's credentials (kept while the
// credentials stay the same), the cluster's credentials themselves (from
// Secrets, in memory only), and who a file:// source is read as.
type Set struct {
	// Set once in New, read without a lock.
	cfg     Config
	log     *slog.Logger
	shared  fetchers.Registry // the fetcher of each scheme
	oci     *ocifetcher.Fetcher
	ociOpts []ocifetcher.Option
	// clusterFile reads ModelCache file:// sources: only under
	// FileRoots, nothing without them; fileAs is who models.d and
	// cluster file:// sources read as (Config.FileAs).
	clusterFile *filefetcher.Fetcher
	fileAs      *fetchers.Identity
	// desired is the merged desire set (it takes the daemon lock: never
	// called with mu held).
	desired func() map[string]api.Desire

	mu      sync.Mutex // guards creds, byCreds and hubs; nothing is taken under it
	creds   map[string]map[string]string
	byCreds map[string]fetchers.Fetcher
	hubs    map[bool]fetchers.Fetcher // the shared hf:// fetchers, by whether they use Xet
}

// New makes the shared fetchers of every scheme with cfg's settings.
// desired returns the merged desire set; log may be nil (silent).
func New(cfg Config, log *slog.Logger, desired func() map[string]api.Desire) (*Set, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	files := filefetcher.New(filefetcher.WithRoots(cfg.FileRoots...), filefetcher.WithDenied(cfg.FileDenied...))
	s := &Set{cfg: cfg, log: log, shared: fetchers.Registry{"file": files}, clusterFile: files.Confined(),
		fileAs: cfg.FileAs, desired: desired, byCreds: map[string]fetchers.Fetcher{}}
	on, cs := s.hubXet(api.Desire{})
	hub, err := s.newHub(on, cs)
	if err != nil {
		return nil, err
	}
	s.shared["hf"] = hub
	s.hubs = map[bool]fetchers.Fetcher{on: hub}
	ngc, err := s.newNGC()
	if err != nil {
		return nil, err
	}
	s.shared["ngc"] = ngc
	s.shared["http"], s.shared["https"] = s.newHTTP(), s.newHTTP()
	s3, err := s.newS3()
	if err != nil {
		return nil, err
	}
	s.shared["s3"] = s3
	// The OCI fetcher keeps its own idle timeout (60s): only the
	// redirect policy is the daemon's.
	s.ociOpts = []ocifetcher.Option{ocifetcher.WithInsecureRegistries(cfg.InsecureRegistries...),
		ocifetcher.WithHTTP(fetchers.WithInternal(cfg.InternalAddress))}
	for _, m := range cfg.RegistryMirrors {
		r, mir, _ := strings.Cut(m, "=")
		s.ociOpts = append(s.ociOpts, ocifetcher.WithMirror(r, mir))
	}
	s.oci = ocifetcher.New(s.ociOpts...)
	s.shared["oci"] = s.oci
	return s, nil
}

// CredentialsFor returns the in-memory credentials of a cluster desire.
func (s *Set) CredentialsFor(name string) map[string]string {
	s.mu.Lock()
	c, ok := s.creds[name]
	s.mu.Unlock()
	if ok {
		return c
	}
	// A kernel cache that a ModelCache lists uses the model's credentials:
	// only one the daemon expanded from that model's own desire, for the
	// URI the model names. Nothing from the socket can claim them.
	want := s.desired()
	if ds, ok := want[name]; ok && ds.Serves != "" {
		if model, ok := want[ds.Serves]; ok && model.Origin == ds.Origin && listsKernelCache(model, name, ds.URI) {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.creds[ds.Serves]
		}
	}
	return nil
}

// SetCredentials replaces the cluster's credentials (from Secrets) and
// says which artifacts' credentials changed.
func (s *Set) SetCredentials(creds map[string]map[string]string) map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := map[string]bool{}
	for name, c := range creds {
		if !reflect.DeepEqual(s.creds[name], c) {
			changed[name] = true
		}
	}
	for name := range s.creds {
		if _, ok := creds[name]; !ok {
			changed[name] = true
		}
	}
	s.creds = creds
	return changed
}

// Known returns nil when uri's scheme has a fetcher here, else an error
// naming the schemes this daemon knows; an http(s) URL must also parse
// (its #sha256= fragment), so that a mistyped digest is refused with the
// request, not as a failed pull.
func (s *Set) Known(uri string) error {
	if _, err := s.shared.For(uri); err != nil {
		return err
	}
	if sc, _ := fetchers.Scheme(uri); sc == "http" || sc == "https" {
		if _, _, _, err := httpfetcher.ParseURI(uri); err != nil {
			return err
		}
	}
	return nil
}

// OCI is the shared oci:// fetcher.
func (s *Set) OCI() *ocifetcher.Fetcher { return s.oci }

// FetcherFor returns the fetcher of a desire: the shared one, or one
// made with the desire's credentials from a Secret (HF_TOKEN;
// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN;
// .dockerconfigjson; NGC_API_KEY), kept while the credentials stay the same.
func (s *Set) FetcherFor(ds api.Desire, scheme string) (fetchers.Fetcher, error) {
	return s.FetcherWith(ds, scheme, s.CredentialsFor(ds.Name))
}

// FetcherWith is FetcherFor with the credentials given (a cluster
// resolution's, from the ModelCache's Secret).
func (s *Set) FetcherWith(ds api.Desire, scheme string, creds map[string]string) (fetchers.Fetcher, error) {
	if ds.CredentialsFile != "" && strings.HasPrefix(ds.Origin, OriginFile) {
		var err error
		if creds, err = ReadCredentialsFile(ds.CredentialsFile); err != nil {
			return nil, fetchers.Permanent(fmt.Errorf("credentials of %s: %w", ds.Name, err))
		}
	}
	if len(creds) == 0 {
		return s.sharedFetcher(ds, scheme)
	}
	b, _ := json.Marshal(creds)
	kind := scheme
	if on, _ := s.hubXet(ds); scheme == "hf" && !on {
		kind += "+noxet" // another fetcher for the same credentials
	}
	sum := sha256.Sum256(append([]byte(kind+"\x00"), b...))
	key := hex.EncodeToString(sum[:])
	s.mu.Lock()
	f, ok := s.byCreds[key]
	s.mu.Unlock()
	if ok {
		return f, nil
	}
	switch scheme {
	case "hf":
		tok := creds["HF_TOKEN"]
		if tok == "" {
			return s.sharedFetcher(ds, scheme)
		}
		on, cs := s.hubXet(ds)
		hub, err := s.newHub(on, cs, hffetcher.WithToken(tok))
		if err != nil {
			return nil, err
		}
		f = hub
	case "s3":
		if creds["AWS_ACCESS_KEY_ID"] == "" {
			return s.sharedFetcher(ds, scheme)
		}
		sf, err := s.newS3(s3fetcher.WithStaticCredentials(creds["AWS_ACCESS_KEY_ID"], creds["AWS_SECRET_ACCESS_KEY"], creds["AWS_SESSION_TOKEN"]))
		if err != nil {
			return nil, err
		}
		f = sf
	case "oci":
		cfg := creds[".dockerconfigjson"]
		if cfg == "" {
			return s.sharedFetcher(ds, scheme)
		}
		kc, err := ocifetcher.DockerConfigKeychain([]byte(cfg))
		if err != nil {
			return nil, fetchers.Permanent(fmt.Errorf("credentials of %s: %w", ds.Name, err))
		}
		f = ocifetcher.New(append(s.ociOpts, ocifetcher.WithKeychain(kc))...)
	case "ngc":
		nf, err := s.ngcWithCredentials(creds)
		if err != nil {
			return nil, err
		}
		if nf == nil {
			return s.sharedFetcher(ds, scheme)
		}
		f = nf
	case "http", "https":
		auth := creds["HTTP_AUTHORIZATION"]
		if auth == "" {
			return s.sharedFetcher(ds, scheme)
		}
		f = s.newHTTP(httpfetcher.WithAuthorization(auth))
	default:
		return s.sharedFetcher(ds, scheme)
	}
	s.mu.Lock()
	s.byCreds[key] = f
	s.mu.Unlock()
	return f, nil
}

// fetcherOptions are the daemon's settings that the hub, NGC, S3 and
// http(s) fetchers share: the idle timeout, the Range connections of one
// large file, and which addresses are host-internal.
func (s *Set) fetcherOptions() []fetchers.Option {
	return []fetchers.Option{fetchers.WithIdleTimeout(s.cfg.IdleTimeout), fetchers.WithConnections(max(s.cfg.RangeConnections, 1)),
		fetchers.WithInternal(s.cfg.InternalAddress)}
}

// newHub and newS3 make the hub and S3 fetchers with the daemon's
// settings; extra options add credentials (FetcherFor). A hub fetcher
// rebuilds files from Xet when on, reusing the chunks cs holds.
func (s *Set) newHub(on bool, cs xet.ChunkStore, extra ...hffetcher.Option) (*hffetcher.Fetcher, error) {
	opts := []hffetcher.Option{hffetcher.WithHTTP(s.fetcherOptions()...)}
	opts = append(opts, hffetcher.WithXet(on), hffetcher.WithChunkStore(cs))
	// Which path a file took and why: inspect shows the path (the
	// reader's Transport), the log the reason a file left Xet.
	log := s.log.With("fetcher", "hf")
	opts = append(opts, hffetcher.WithRouteReport(func(r hffetcher.Route) {
		switch {
		case r.Via == hffetcher.RouteResolve && on && r.Reason != "not an LFS file":
			log.Info("hf file through the resolve URL, not xet", "path", r.Path, "offset", r.Offset, "reason", r.Reason)
		case r.Via == hffetcher.RouteXet && r.Done:
			log.Debug("hf file over xet", "path", r.Path, "fetched_bytes", r.Fetched, "reused_bytes", r.Reused)
		}
	}))
	return hffetcher.New(append(opts, extra...)...)
}

// hubXet is the Xet decision for ds's hf:// fetcher (Config.Xet).
func (s *Set) hubXet(ds api.Desire) (bool, xet.ChunkStore) {
	if s.cfg.Xet == nil {
		return false, nil
	}
	return s.cfg.Xet(ds)
}

// sharedHub is the shared hf:// fetcher of desires without credentials
// of their own whose Xet decision is on (or off), made at first use.
func (s *Set) sharedHub(ds api.Desire) (fetchers.Fetcher, error) {
	on, cs := s.hubXet(ds)
	s.mu.Lock()
	f, ok := s.hubs[on]
	s.mu.Unlock()
	if ok {
		return f, nil
	}
	hub, err := s.newHub(on, cs)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.hubs[on]; ok {
		return f, nil // another pull made it meanwhile
	}
	s.hubs[on] = hub
	return hub, nil
}

func (s *Set) newS3(extra ...s3fetcher.Option) (*s3fetcher.Fetcher, error) {
	return s3fetcher.New(append([]s3fetcher.Option{s3fetcher.WithHTTP(s.fetcherOptions()...)}, extra...)...)
}

// newHTTP makes an http(s) fetcher with the daemon's settings (and extra).
func (s *Set) newHTTP(extra ...httpfetcher.Option) *httpfetcher.Fetcher {
	shared := append(s.fetcherOptions(), fetchers.WithUserAgent("modelcached/"+s.cfg.Version))
	return httpfetcher.New(append([]httpfetcher.Option{httpfetcher.WithHTTP(shared...)}, extra...)...)
}

// sharedFetcher is the daemon's fetcher of the source's scheme.
func (s *Set) sharedFetcher(ds api.Desire, scheme string) (fetchers.Fetcher, error) {
	if scheme == "file" && fromCluster(ds) && s.clusterFile != nil {
		return s.clusterFile, nil
	}
	if scheme == "hf" {
		return s.sharedHub(ds)
	}
	if f, ok := s.shared[scheme]; ok {
		return f, nil
	}
	return s.shared.For(ds.URI) // its error names the schemes this daemon knows
}

// newNGC makes an ngc:// fetcher with the daemon's settings (and extra):
// endpoints and key from NGC_API_ENDPOINT, NGC_AUTH_ENDPOINT, NGC_API_KEY
// (or NGC_CLI_API_KEY, or the file NGC_API_KEY_FILE names).
func (s *Set) newNGC(extra ...ngcfetcher.Option) (*ngcfetcher.Fetcher, error) {
	return ngcfetcher.New(append([]ngcfetcher.Option{ngcfetcher.WithHTTP(s.fetcherOptions()...),
		ngcfetcher.WithLogger(s.log.With("fetcher", "ngc"))}, extra...)...)
}

// ngcWithCredentials is the ngc:// fetcher of a desire whose credentials
// (a ModelCache Secret, a models.d credentialsFile) hold NGC_API_KEY; nil
// when they do not.
func (s *Set) ngcWithCredentials(creds map[string]string) (fetchers.Fetcher, error) {
	key := creds["NGC_API_KEY"]
	if key == "" {
		return nil, nil
	}
	f, err := s.newNGC(ngcfetcher.WithAPIKey(key))
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	return f, nil
}
