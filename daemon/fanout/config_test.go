package fanout

import (
	"strings"
	"testing"
)

// TestConfigValidate: each bad peer setting is refused with an error
// that names its flag.
func TestConfigValidate(t *testing.T) {
	good := func() Config {
		p := DefaultConfig()
		p.Addr, p.Advertise, p.ServiceAccount = ":7435", "http://10.0.0.7:7435", "modelcache-system/modelcached"
		return p
	}
	static := func() Config {
		p := good()
		p.StaticTokenFile, p.Peers = "/etc/modelcached/peer-token", []string{"10.0.0.7:7435", "http://10.0.0.8:7435"}
		return p
	}
	for _, c := range []struct {
		name    string
		p       Config
		cluster bool
		want    string // "" = valid
	}{
		{"cluster", good(), true, ""},
		{"static", static(), false, ""},
		{"no addr", func() Config { p := good(); p.Addr = ""; return p }(), true, "--peer-addr"},
		{"addr without port", func() Config { p := good(); p.Addr = "10.0.0.7"; return p }(), true, "--peer-addr"},
		{"outside kubernetes without a token", good(), false, "--peer-static-token-file"},
		{"peers without the shared token", func() Config { p := good(); p.Peers = []string{"10.0.0.8:7435"}; return p }(), true, "--peers needs --peer-static-token-file"},
		{"peer with a path", func() Config { p := static(); p.Peers = []string{"http://10.0.0.8:7435/x"}; return p }(), false, "--peers"},
		{"peer with credentials", func() Config { p := static(); p.Peers = []string{"http://u:p@10.0.0.8:7435"}; return p }(), false, "--peers"},
		{"peer without a port", func() Config { p := static(); p.Peers = []string{"10.0.0.8"}; return p }(), false, "--peers"},
		{"static without self", func() Config { p := static(); p.Advertise = ""; return p }(), false, "--peer-advertise"},
		{"relative static token", func() Config { p := static(); p.StaticTokenFile = "token"; return p }(), false, "--peer-static-token-file"},
		{"no service account", func() Config { p := good(); p.ServiceAccount = "modelcached"; return p }(), true, "--peer-service-account"},
		{"no advertised address", func() Config { p := good(); p.Advertise = ""; return p }(), true, "POD_IP"},
		{"bad advertise", func() Config { p := good(); p.Advertise = "ftp://x:1"; return p }(), true, "--peer-advertise"},
		{"relative token", func() Config { p := good(); p.TokenFile = "token"; return p }(), true, "--peer-token-file"},
		{"no uploads", func() Config { p := good(); p.MaxUploads = 0; return p }(), true, "--peer-max-uploads"},
		{"negative rate", func() Config { p := good(); p.UploadRate = -1; return p }(), true, "--peer-upload-rate"},
		{"no origin concurrency", func() Config { p := good(); p.OriginConcurrency = 0; return p }(), true, "--origin-concurrency"},
		{"no wait", func() Config { p := good(); p.Wait = 0; return p }(), true, "--peer-wait"},
	} {
		err := c.p.Validate(c.cluster)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%s: %v, want an error naming %s", c.name, err, c.want)
		}
	}
}
