package http

import (
	"io"
	nethttp "net/http"
	"testing"

	"github.com/modelcache/modelcache/fetchers/fetcherstest"
	"github.com/modelcache/modelcache/internal/testenv"
)

// TestAuthorizationStaysAtItsOrigin: the Authorization of a source
// (a credentialsFile's HTTP_AUTHORIZATION) reaches the source's origin
// and no redirect of it to another host (127.0.0.2) or to another port of
// the same host; Go's default policy sent it to both.
func TestAuthorizationStaysAtItsOrigin(t *testing.T) {
	const token = "Bearer TEAM-A-TOKEN-0123456789"
	body := "weights"
	for _, ip := range []string{"127.0.0.2", "127.0.0.1"} {
		t.Run("to "+ip, func(t *testing.T) {
			cdn := testenv.ServeOrigin(t, ip, nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
				w.Header().Set("ETag", `"v1"`)
				io.WriteString(w, body)
			}))
			origin := testenv.ServeOrigin(t, "127.0.0.1", nethttp.RedirectHandler(cdn.URL+"/cdn/w.bin", nethttp.StatusFound))
			f := New(WithAuthorization(token))
			fetcherstest.FetchFirst(t, f, origin.URL+"/w.bin", []byte(body))
			if !origin.Saw("/w.bin Authorization=" + token) {
				t.Fatalf("the origin had no Authorization: %q", origin.Seen())
			}
			if !cdn.Saw("/cdn/w.bin") || cdn.Saw("Authorization") {
				t.Fatalf("the second origin (%s): %q; want the requests without Authorization", cdn.URL, cdn.Seen())
			}
		})
	}
}
