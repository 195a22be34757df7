package fanout

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"time"
)

// Config is fan-out between the daemons of a cluster or of a static
// fleet (docs/fan-out.md): the daemon's --peer-*
// and --origin-concurrency flags. Start from DefaultConfig.
type Config struct {
	// Addr is where the peer port listens (--peer-addr): host:port.
	Addr string
	// Advertise is the base URL the other daemons reach this one at
	// (--peer-advertise, http://10.0.0.7:7435): written to this node's
	// ModelCacheNode status in a cluster; in a static fleet it names this
	// daemon in Peers, which it leaves out.
	Advertise string
	// TokenFile holds the token this daemon sends (--peer-token-file): the
	// projected service-account token of audience peer.DefaultAudience,
	// read again when kubelet rotates it.
	TokenFile string
	// StaticTokenFile (--peer-static-token-file) is the token every
	// daemon of a fleet outside Kubernetes shares: it sends it and accepts
	// only it. Set, it replaces TokenFile and the TokenReview.
	StaticTokenFile string
	// Peers (--peers) are the other daemons of a fleet outside
	// Kubernetes, as base URLs; only with StaticTokenFile.
	Peers []string
	// ServiceAccount is "namespace/name" of the daemons' service account
	// (--peer-service-account): the only account whose tokens a
	// TokenReview accepts, in a cluster.
	ServiceAccount string
	// MaxUploads bounds the transfers this daemon serves at once; UploadRate
	// the bytes per second it sends across them (0: no bound).
	MaxUploads int
	UploadRate int64
	// OriginConcurrency is how many nodes fetch one artifact from the
	// origin at once (--origin-concurrency; the elected daemon's is the
	// one recorded in status.resolved[].originNodes); the others wait for
	// a peer to hold its files, at most Wait after their pull started.
	OriginConcurrency int
	Wait              time.Duration
	// Poll is the least time between two rounds of asks of one waiting
	// blob (default 3s): a peer that answers 404 at once is asked no
	// faster, and a change of the statuses starts a round sooner only
	// when the last asked nobody. A peer that holds the request
	// (peer.HeaderWait) sets the pace itself: it answers when it holds
	// the blob.
	Poll time.Duration
	// Settle is how long this node's status must have listed an artifact
	// before it ranks the nodes that want it and goes to the origin, where
	// the cluster recorded no origin nodes for the revision (the
	// statuses of the nodes that got the ModelCache at about the same
	// moment land within it; default 2s, and in a cluster at least a
	// status write and a publish of the elected daemon's view of the
	// nodes, --status-interval + 5s: daemon/run.go's clusterViewLag).
	// In a static fleet it is how long a node that owns no blob of a pull
	// waits for the nodes that do before it goes to the origin itself.
	Settle time.Duration
}

// DefaultPeerTokenFile is where the DaemonSet bundle projects the peer
// token (a serviceAccountToken volume of audience modelcache-peer).
const DefaultPeerTokenFile = "/var/run/secrets/modelcache.io/peer/token"

// DefaultConfig is a peer port's settings but the address.
func DefaultConfig() Config {
	return Config{TokenFile: DefaultPeerTokenFile, MaxUploads: 4, OriginConcurrency: 2, Wait: 30 * time.Minute, Poll: 3 * time.Second, Settle: 2 * time.Second}
}

// Validate checks the peer settings; cluster says whether the daemon
// syncs with Kubernetes (the TokenReview and the statuses need it).
func (p *Config) Validate(cluster bool) error {
	var errs []error
	if _, _, err := net.SplitHostPort(p.Addr); err != nil || p.Addr == "" {
		errs = append(errs, fmt.Errorf("--peer-addr %q: want host:port or :port, e.g. :7435", p.Addr))
	}
	if p.Advertise != "" {
		if _, err := PeerBase(p.Advertise); err != nil {
			errs = append(errs, fmt.Errorf("--peer-advertise: %w", err))
		}
	}
	for _, s := range p.Peers {
		if _, err := PeerBase(s); err != nil {
			errs = append(errs, fmt.Errorf("--peers: %w", err))
		}
	}
	switch {
	case p.StaticTokenFile != "":
		if !filepath.IsAbs(p.StaticTokenFile) {
			errs = append(errs, fmt.Errorf("--peer-static-token-file %q: want an absolute path", p.StaticTokenFile))
		}
		if len(p.Peers) > 0 && p.Advertise == "" {
			errs = append(errs, errors.New("--peers: this daemon's own address is unknown: set --peer-advertise (its entry in --peers) or give --peer-addr a host"))
		}
	case len(p.Peers) > 0:
		errs = append(errs, errors.New("--peers needs --peer-static-token-file: a fleet outside Kubernetes shares one token file"))
	case !cluster:
		errs = append(errs, errors.New("--peer-addr outside Kubernetes needs --peer-static-token-file (one token shared by every daemon, mode 0600) and --peers; or drop --peer-addr"))
	default:
		if p.TokenFile == "" || !filepath.IsAbs(p.TokenFile) {
			errs = append(errs, fmt.Errorf("--peer-token-file %q: want the absolute path of the projected service-account token (audience modelcache-peer), e.g. %s", p.TokenFile, DefaultPeerTokenFile))
		}
		if ns, name, ok := strings.Cut(p.ServiceAccount, "/"); !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			errs = append(errs, fmt.Errorf("--peer-service-account %q: want namespace/name of the daemons' service account (set POD_NAMESPACE and SERVICE_ACCOUNT_NAME from the downward API)", p.ServiceAccount))
		}
		if p.Advertise == "" {
			errs = append(errs, errors.New("--peer-addr: no address for the other daemons: set POD_IP from the downward API (status.podIP) or --peer-advertise"))
		}
	}
	if p.MaxUploads < 1 || p.MaxUploads > 256 {
		errs = append(errs, fmt.Errorf("--peer-max-uploads %d: want 1..256", p.MaxUploads))
	}
	if p.UploadRate < 0 {
		errs = append(errs, fmt.Errorf("--peer-upload-rate %d: want bytes per second >= 0 (0: no bound)", p.UploadRate))
	}
	if p.OriginConcurrency < 1 || p.OriginConcurrency > 1024 {
		errs = append(errs, fmt.Errorf("--origin-concurrency %d: want 1..1024 nodes", p.OriginConcurrency))
	}
	if p.Wait <= 0 {
		errs = append(errs, fmt.Errorf("--peer-wait %s: want > 0, e.g. 30m", p.Wait))
	}
	if p.Poll <= 0 || p.Settle < 0 {
		errs = append(errs, fmt.Errorf("peer poll %s, settle %s: want a poll > 0 and a settle >= 0", p.Poll, p.Settle))
	}
	return errors.Join(errs...)
}

// PeerBase reads a peer's address, host:port or an http(s) base URL
// with nothing after its port, as a base URL (http://host:port).
func PeerBase(s string) (string, error) {
	raw := s
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.User != nil || u.Port() == "" || u.Hostname() == "" ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return "", fmt.Errorf("peer address %q: want host:port or http://host:port, e.g. 10.0.0.7:7435", raw)
	}
	return u.Scheme + "://" + u.Host, nil
}
