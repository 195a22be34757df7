package oci

import (
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/modelcache/modelcache/fetchers/fetcherstest"
	"github.com/modelcache/modelcache/fetchers/oci/ocitest"
	"github.com/modelcache/modelcache/internal/testenv"
)

// TestRegistryCredentialsStayAtTheRegistry: a registry that wants basic
// credentials (a pull secret's) gets them, and the storage its blob GETs
// redirect to, on another host (127.0.0.2) or another port of the
// registry's host, gets none.
func TestRegistryCredentialsStayAtTheRegistry(t *testing.T) {
	backing := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer backing.Close()
	data := bytes.Repeat([]byte("layer"), 1000)
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, "application/vnd.unknown.config.v1+json")
	img, err := mutate.Append(img, mutate.Addendum{Layer: static.NewLayer(data, "application/vnd.oci.image.layer.v1.raw"), Annotations: map[string]string{AnnotationTitle: "w.bin"}})
	if err != nil {
		t.Fatal(err)
	}
	ocitest.Push(t, strings.TrimPrefix(backing.URL, "http://"), "team/w:1", img)
	const user, pass = "robot", "PULL-SECRET-0123456789"
	for _, ip := range []string{"127.0.0.2", "127.0.0.1"} {
		t.Run("storage on "+ip, func(t *testing.T) {
			storage := testenv.ServeOrigin(t, ip, backing.Config.Handler)
			reg := testenv.ServeOrigin(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if u, p, ok := r.BasicAuth(); !ok || u != user || p != pass {
					w.Header().Set("WWW-Authenticate", `Basic realm="registry"`)
					http.Error(w, "unauthorized", http.StatusUnauthorized)
					return
				}
				if strings.Contains(r.URL.Path, "/blobs/") {
					http.Redirect(w, r, storage.URL+r.URL.Path, http.StatusTemporaryRedirect)
					return
				}
				backing.Config.Handler.ServeHTTP(w, r)
			}))
			host := strings.TrimPrefix(reg.URL, "http://")
			kc, err := DockerConfigKeychain([]byte(`{"auths":{"` + host + `":{"username":"` + user + `","password":"` + pass + `"}}}`))
			if err != nil {
				t.Fatal(err)
			}
			f := New(WithInsecureRegistries(host), WithKeychain(kc))
			fetcherstest.FetchFirst(t, f, "oci://"+host+"/team/w:1", data)
			if !reg.Saw("/manifests/1 Authorization=Basic ") {
				t.Fatalf("the registry had no credentials: %q", reg.Seen())
			}
			if !storage.Saw("/blobs/") || storage.Saw("Authorization") {
				t.Fatalf("the storage at %s saw %q; want the blob's requests without credentials", storage.URL, storage.Seen())
			}
		})
	}
}
