package http

import (
	"context"
	"io"
	nethttp "net/http"
	"testing"

	"github.com/modelcache/modelcache/fetchers"
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
			res, err := f.Resolve(context.Background(), fetchers.Source{URI: origin.URL + "/w.bin"})
			if err != nil {
				t.Fatal(err)
			}
			rc, err := f.Open(context.Background(), res.Files[0], 0)
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(rc)
			rc.Close()
			if err != nil || string(got) != body {
				t.Fatalf("read %q, %v", got, err)
			}
			if !origin.Saw("/w.bin Authorization=" + token) {
				t.Fatalf("the origin had no Authorization: %q", origin.Seen())
			}
			if !cdn.Saw("/cdn/w.bin") || cdn.Saw("Authorization") {
				t.Fatalf("the second origin (%s): %q; want the requests without Authorization", cdn.URL, cdn.Seen())
			}
		})
	}
}
