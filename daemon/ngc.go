package daemon

import (
	"github.com/modelcache/modelcache/fetchers"
	ngcfetcher "github.com/modelcache/modelcache/fetchers/ngc"
)

// newNGC makes an ngc:// fetcher with the daemon's settings (and extra):
// endpoints and key from NGC_API_ENDPOINT, NGC_AUTH_ENDPOINT, NGC_API_KEY
// (or NGC_CLI_API_KEY, or the file NGC_API_KEY_FILE names).
func (d *Daemon) newNGC(extra ...ngcfetcher.Option) (*ngcfetcher.Fetcher, error) {
	return ngcfetcher.New(append([]ngcfetcher.Option{ngcfetcher.WithIdleTimeout(d.cfg.IdleTimeout),
		ngcfetcher.WithConnections(max(d.cfg.RangeConnections, 1)), ngcfetcher.WithInternal(d.cfg.InternalAddress)}, extra...)...)
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
