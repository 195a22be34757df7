package ngc

import (
	"bytes"
	"testing"

	"github.com/modelcache/modelcache/fetchers/fetcherstest"
	"github.com/modelcache/modelcache/fetchers/ngc/ngctest"
	"github.com/modelcache/modelcache/internal/testenv"
)

// TestTokenStaysAtTheAPI: the bearer token reaches the API (the model is
// private: it answers 401 without it) and not the storage the downloads
// redirect to, on another host (127.0.0.2) or another port of the API's
// host. Self-contained (ngctest and New only).
func TestTokenStaysAtTheAPI(t *testing.T) {
	const key = "REDIRECT-TEST-KEY-0123456789"
	w := bytes.Repeat([]byte("w"), 3000)
	for _, ip := range []string{"127.0.0.2", "127.0.0.1"} {
		t.Run("storage on "+ip, func(t *testing.T) {
			s := ngctest.New()
			defer s.Close()
			s.Storage.Close()
			storage := testenv.ServeOrigin(t, ip, s.Storage.Config.Handler)
			s.Storage = storage.Server
			s.Keys[key] = []string{"group/ngc:acme"}
			s.AddVersion("acme/m", "1", map[string][]byte{"w.bin": w}, false, true)
			api := testenv.ServeOrigin(t, "127.0.0.1", s.API.Config.Handler)
			f, err := New(WithAPIEndpoint(api.URL), WithAuthEndpoint(s.Auth.URL), WithAPIKey(key), WithAPIKeyFile(""))
			if err != nil {
				t.Fatal(err)
			}
			fetcherstest.FetchFirst(t, f, "ngc://acme/m:1", w)
			if !api.Saw("Authorization=Bearer ") {
				t.Fatalf("the API had no token: %q", api.Seen())
			}
			if !storage.Saw("/blob/") || storage.Saw("Authorization") || s.StorageSawAuth.Load() {
				t.Fatalf("the storage at %s saw %q; want the downloads without the token", storage.URL, storage.Seen())
			}
		})
	}
}
