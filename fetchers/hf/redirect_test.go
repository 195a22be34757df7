package hf

import (
	"bytes"
	"testing"

	"github.com/modelcache/modelcache/fetchers/fetcherstest"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
	"github.com/modelcache/modelcache/internal/testenv"
)

// TestTokenStaysAtTheHub: the hub's token reaches the hub (its API
// answers 401 without it) and not the CDN its LFS files redirect to, be
// the CDN another host (127.0.0.2) or another port of the hub's host.
func TestTokenStaysAtTheHub(t *testing.T) {
	for _, ip := range []string{"127.0.0.2", "127.0.0.1"} {
		t.Run("CDN on "+ip, func(t *testing.T) {
			hub := hubtest.New()
			defer hub.Close()
			hub.CDN.Close()
			cdn := testenv.ServeOrigin(t, ip, hub.CDN.Config.Handler)
			hub.CDN = cdn.Server
			hub.Token = "hf_TEAMTOKEN0123456789"
			w := bytes.Repeat([]byte("w"), 5000)
			hub.Commit("org/m", map[string][]byte{"w.bin": w}, "main")
			f, err := New(WithEndpoint(hub.URL()), WithToken(hub.Token))
			if err != nil {
				t.Fatal(err)
			}
			fetcherstest.FetchFirst(t, f, "hf://org/m", w)
			if !cdn.Saw("/lfs/") || cdn.Saw("Authorization") || hub.CDNSawAuth.Load() {
				t.Fatalf("the CDN at %s saw %q; want the file's requests without the token", cdn.URL, cdn.Seen())
			}
		})
	}
}
