package daemon

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/internal/testenv"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers/oci"
	"github.com/modelcache/modelcache/fetchers/oci/ocitest"
)

// orasArtifact: raw layers named by org.opencontainers.image.title.
func orasArtifact(t *testing.T, files map[string][]byte) v1.Image {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, "application/vnd.unknown.config.v1+json")
	for p, b := range files {
		var err error
		img, err = mutate.Append(img, mutate.Addendum{Layer: static.NewLayer(b, "application/vnd.oci.image.layer.v1.raw"), Annotations: map[string]string{oci.AnnotationTitle: p}})
		if err != nil {
			t.Fatal(err)
		}
	}
	return img
}

type tarFile struct {
	name string
	body []byte
	typ  byte
	link string
}

func tarLayer(t *testing.T, gz bool, files ...tarFile) v1.Layer {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, f := range files {
		typ := f.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		tw.WriteHeader(&tar.Header{Name: f.name, Typeflag: typ, Linkname: f.link, Mode: 0o644, Size: int64(len(f.body))})
		tw.Write(f.body)
	}
	tw.Close()
	if !gz {
		return static.NewLayer(b.Bytes(), types.OCIUncompressedLayer)
	}
	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	zw.Write(b.Bytes())
	zw.Close()
	return static.NewLayer(z.Bytes(), types.OCILayer)
}

func modelcar(t *testing.T, layers ...v1.Layer) v1.Image {
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), layers...)
	if err != nil {
		t.Fatal(err)
	}
	return mutate.ConfigMediaType(img, types.OCIConfigJSON)
}

func push(t *testing.T, host, repo string, img v1.Image) string {
	t.Helper()
	return strings.TrimPrefix(ocitest.Push(t, host, repo, img), "sha256:")
}

func TestOCIArtifactsModelcarAndHostileLayers(t *testing.T) {
	var corrupt atomic.Value // a blob digest whose bytes the registry will flip; retries of earlier pulls read it concurrently
	corrupt.Store("")
	reg := registry.New()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c := corrupt.Load().(string); c != "" && r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+c) {
			rec := httptest.NewRecorder()
			reg.ServeHTTP(rec, r)
			b := rec.Body.Bytes()
			b[len(b)/2] ^= 1
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			w.Write(b)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	host := u.Host
	cfg := testConfig(t)
	cfg.InsecureRegistries = []string{host}
	h := start(t, cfg)

	// ORAS: raw layers, addressed by digest, so dedup works across sources.
	w := data(2<<20, 80)
	files := map[string][]byte{"config.json": []byte(`{"model_type":"llama"}`), "w.safetensors": w}
	dg := push(t, host, "models/oras:v1", orasArtifact(t, files))
	a, err := h.pull(api.PullRequest{Name: "oras", URI: "oci://" + host + "/models/oras:v1"})
	if err != nil || a.Revision != dg {
		t.Fatalf("oras pull: %+v %v (want revision %s)", a, err, dg)
	}
	for p, b := range files {
		if h.read("oras", p) != string(b) {
			t.Fatalf("%s differs", p)
		}
	}
	// The tag moves: what is served stays the pinned digest until a new pull.
	push(t, host, "models/oras:v1", orasArtifact(t, map[string][]byte{"config.json": []byte(`{"v":2}`)}))
	if h.read("oras", "config.json") != string(files["config.json"]) {
		t.Fatal("a moved tag changed what is served")
	}

	// A modelcar: only /models, later layers override, whiteouts delete.
	img := modelcar(t,
		tarLayer(t, false, tarFile{name: "models/config.json", body: []byte("{}")}, tarFile{name: "models/old.bin", body: []byte("old")},
			tarFile{name: "etc/passwd", body: []byte("root:x")}, tarFile{name: "models/w.bin", body: w}),
		tarLayer(t, true, tarFile{name: "models/.wh.old.bin"}, tarFile{name: "models/sub/new.bin", body: []byte("new")},
			tarFile{name: "models/alias.bin", typ: tar.TypeSymlink, link: "w.bin"}),
	)
	push(t, host, "models/car:1", img)
	if _, err := h.pull(api.PullRequest{Name: "car", URI: "oci://" + host + "/models/car:1"}); err != nil {
		t.Fatal(err)
	}
	full, _ := h.c.Get(context.Background(), "car")
	var got []string
	for _, f := range full.Versions[0].Files {
		got = append(got, f.Path)
	}
	if strings.Join(got, ",") != "alias.bin,config.json,sub/new.bin,w.bin" {
		t.Fatalf("modelcar files %v", got)
	}
	if h.read("car", "alias.bin") != string(w) {
		t.Fatal("symlink member not resolved to its target's bytes")
	}
	u2, _ := h.c.Usage(context.Background())
	if u2.StoreBytes > int64(len(w))+1000 {
		t.Fatalf("the weights are stored more than once across oras and modelcar: %+v", u2)
	}

	// Hostile layers fail the pull, naming the entry; nothing becomes visible.
	for i, l := range []v1.Layer{
		tarLayer(t, false, tarFile{name: "models/../../escape", body: []byte("x")}),
		tarLayer(t, false, tarFile{name: "models/link", typ: tar.TypeSymlink, link: "/etc/passwd"}),
		tarLayer(t, true, tarFile{name: "models/dev", typ: tar.TypeChar}),
	} {
		n := "bad" + itoa(i)
		push(t, host, "models/"+n+":1", modelcar(t, l))
		_, err := h.pull(api.PullRequest{Name: n, URI: "oci://" + host + "/models/" + n + ":1"})
		if !errors.Is(err, api.ErrFailed) || !strings.Contains(err.Error(), "refused archive entry") {
			t.Fatalf("hostile layer %d: %v", i, err)
		}
		if _, err := lstatTree(h.cfg.Root, n); err == nil {
			t.Fatal("a tree appeared for a hostile layer")
		}
	}

	// A registry that sends a layer with other bytes than its digest.
	l := tarLayer(t, false, tarFile{name: "models/w.bin", body: data(100000, 81)})
	ld, _ := l.Digest()
	push(t, host, "models/flip:1", modelcar(t, l))
	corrupt.Store(ld.String())
	_, err = h.pull(api.PullRequest{Name: "flip", URI: "oci://" + host + "/models/flip:1"})
	if !errors.Is(err, api.ErrFailed) || !strings.Contains(err.Error(), "digest mismatch") {
		t.Fatalf("corrupted layer: %v", err)
	}
	if _, err := lstatTree(h.cfg.Root, "flip"); err == nil {
		t.Fatal("a tree appeared from a corrupted layer")
	}
	_, err = h.pull(api.PullRequest{Name: "none", URI: "oci://" + host + "/models/none:1"})
	if err == nil || !strings.Contains(err.Error(), "no such repository") {
		t.Fatalf("missing repo: %v", err)
	}
}

// TestOCIRealRegistry pushes a ModelPack-style artifact to Debian's
// docker-registry (distribution 2.8) and pulls it by tag and by digest.
func TestOCIRealRegistry(t *testing.T) {
	host := testenv.Registry(t)
	w := data(1<<20, 82)
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, "application/vnd.cncf.model.config.v1+json")
	img, _ = mutate.Append(img,
		mutate.Addendum{Layer: static.NewLayer(w, "application/vnd.cncf.model.weight.v1.raw"), Annotations: map[string]string{oci.AnnotationModelPackPath: "model/w.safetensors"}},
		mutate.Addendum{Layer: static.NewLayer([]byte(`{}`), "application/vnd.cncf.model.weight.config.v1.raw"), Annotations: map[string]string{oci.AnnotationModelPackPath: "config.json"}})
	dg := push(t, host, "modelpack/tiny:v1", img)
	cfg := testConfig(t)
	cfg.InsecureRegistries = []string{host}
	h := start(t, cfg)
	a, err := h.pull(api.PullRequest{Name: "mp", URI: "oci://" + host + "/modelpack/tiny:v1"})
	if err != nil || a.Revision != dg || h.read("mp", "model/w.safetensors") != string(w) {
		t.Fatalf("pull from docker-registry: %+v %v", a, err)
	}
	a, err = h.pull(api.PullRequest{Name: "mp2", URI: "oci://" + host + "/modelpack/tiny@sha256:" + dg})
	if err != nil || a.Revision != dg {
		t.Fatalf("pull by digest: %+v %v", a, err)
	}

	// An artifact pushed by the real oras CLI (files named by their title annotation).
	oras := testenv.Require(t, "oras", "build oras.land/oras/cmd/oras@v1.2.3 as .ci/run does")
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "config.json"), []byte(`{"model_type":"oras"}`), 0o644)
	os.WriteFile(filepath.Join(src, "w.safetensors"), w, 0o644) // the same weights as above: stored once
	push := exec.Command(oras, "push", "--plain-http", host+"/oras/cli:v1", "config.json:application/json", "w.safetensors")
	push.Dir = src
	if out, err := push.CombinedOutput(); err != nil {
		t.Fatalf("oras push: %v\n%s", err, out)
	}
	if _, err := h.pull(api.PullRequest{Name: "orascli", URI: "oci://" + host + "/oras/cli:v1"}); err != nil {
		t.Fatal(err)
	}
	if h.read("orascli", "w.safetensors") != string(w) || h.read("orascli", "config.json") != `{"model_type":"oras"}` {
		t.Fatal("oras-pushed files differ")
	}
}

// TestOCIRegistryMirror: a pull from the origin tries the mirror first
// and falls back to the origin when the mirror cannot serve.
func TestOCIRegistryMirror(t *testing.T) {
	origin := httptest.NewServer(registry.New())
	defer origin.Close()
	mirror := httptest.NewServer(registry.New())
	ou, _ := url.Parse(origin.URL)
	mu, _ := url.Parse(mirror.URL)
	w := data(300000, 83)
	// Only the mirror has this one: the pull can only succeed through it.
	push(t, mu.Host, "models/m:1", orasArtifact(t, map[string][]byte{"w.bin": w}))
	cfg := testConfig(t)
	cfg.InsecureRegistries = []string{ou.Host, mu.Host}
	cfg.RegistryMirrors = []string{ou.Host + "=" + mu.Host}
	h := start(t, cfg)
	if _, err := h.pull(api.PullRequest{Name: "viamirror", URI: "oci://" + ou.Host + "/models/m:1"}); err != nil {
		t.Fatalf("pull through the mirror: %v", err)
	}
	// The mirror goes away: the origin serves.
	push(t, ou.Host, "models/o:1", orasArtifact(t, map[string][]byte{"w2.bin": data(1000, 84)}))
	mirror.Close()
	if _, err := h.pull(api.PullRequest{Name: "fallback", URI: "oci://" + ou.Host + "/models/o:1"}); err != nil {
		t.Fatalf("fallback to the origin: %v", err)
	}
	if h.read("viamirror", "w.bin") != string(w) {
		t.Fatal("content through the mirror differs")
	}
}

// TestOCIKitOpsModelKit: a ModelKit's tar+gzip layers are unpacked at the
// kit's root, and a raw ModelPack tar layer too.
func TestOCIKitOpsModelKit(t *testing.T) {
	srv := httptest.NewServer(registry.New())
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	w := data(200000, 85)
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, "application/vnd.kitops.modelkit.config.v1+json")
	model := tarLayer(t, true, tarFile{name: "model/w.safetensors", body: w})
	code := tarLayer(t, true, tarFile{name: "code/infer.py", body: []byte("print(1)")})
	img, err := mutate.Append(img,
		mutate.Addendum{Layer: model, MediaType: "application/vnd.kitops.modelkit.model.v1.tar+gzip"},
		mutate.Addendum{Layer: code, MediaType: "application/vnd.kitops.modelkit.code.v1.tar+gzip"})
	if err != nil {
		t.Fatal(err)
	}
	push(t, u.Host, "kits/tiny:v1", img)
	cfg := testConfig(t)
	cfg.InsecureRegistries = []string{u.Host}
	h := start(t, cfg)
	if _, err := h.pull(api.PullRequest{Name: "kit", URI: "oci://" + u.Host + "/kits/tiny:v1"}); err != nil {
		t.Fatal(err)
	}
	if h.read("kit", "model/w.safetensors") != string(w) || h.read("kit", "code/infer.py") != "print(1)" {
		t.Fatal("ModelKit layers not unpacked at the kit root")
	}
}

// TestLayerCheckedAsItDownloads: a compressed layer's archive check runs
// on the download's bytes as they arrive, not on a second read of the
// blob; hostile entries are refused the same way; a download resumed from
// an earlier pull's partial data (the check saw only the rest) is checked
// from the blob instead, and refused the same way when hostile.
func TestLayerCheckedAsItDownloads(t *testing.T) {
	reg := registry.New()
	var cut sync.Map // layer digest → cut its first GET at half
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, part := range strings.Split(r.URL.Path, "/") {
			if _, ok := cut.LoadAndDelete(part); ok && r.Method == http.MethodGet {
				rec := httptest.NewRecorder()
				reg.ServeHTTP(rec, r)
				b := rec.Body.Bytes()
				w.Header().Set("Content-Length", itoa(len(b)))
				w.WriteHeader(rec.Code)
				w.Write(b[:len(b)/2])
				w.(http.Flusher).Flush()
				conn, _, _ := w.(http.Hijacker).Hijack()
				conn.Close()
				return
			}
		}
		// Ranges from an offset, which the in-process registry ignores:
		// a resumed download continues where it stopped.
		var from int
		if _, err := fmt.Sscanf(r.Header.Get("Range"), "bytes=%d-", &from); err == nil && r.Method == http.MethodGet && from > 0 {
			r.Header.Del("Range")
			rec := httptest.NewRecorder()
			reg.ServeHTTP(rec, r)
			b := rec.Body.Bytes()
			if rec.Code != http.StatusOK || from >= len(b) {
				t.Errorf("a Range from %d of a %d-byte answer %d", from, len(b), rec.Code)
				return
			}
			w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", from, len(b)-1, len(b)))
			w.WriteHeader(http.StatusPartialContent)
			w.Write(b[from:])
			return
		}
		reg.ServeHTTP(w, r)
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	var fromBlob atomic.Int64
	cfg := testConfig(t)
	cfg.InsecureRegistries = []string{host}
	cfg.Hook = func(p string) {
		if p == "layer.check-from-blob" {
			fromBlob.Add(1)
		}
	}
	cfg.RetryInitial, cfg.RetryMax = time.Hour, time.Hour // a failed pull stays failed until pulled again
	h := startWith(t, cfg, fetchers.Backoff{Initial: 10 * time.Millisecond, Max: 10 * time.Millisecond, Attempts: 1})

	// 12 MiB that do not compress: the cut at half leaves several MiB of
	// partial data written, which the second pull resumes from.
	w := data(12<<20, 90)
	for i, tc := range []struct {
		interrupted, hostile bool
		wantFromBlob         int64
	}{
		{false, false, 0},
		{false, true, 0},
		{true, false, 1},
		{true, true, 1},
	} {
		files := []tarFile{{name: "models/w.bin", body: w[i:]}, {name: "models/config.json", body: []byte(itoa(i))}}
		if tc.hostile {
			files = append(files, tarFile{name: "models/../../escape", body: []byte("x")})
		}
		l := tarLayer(t, true, files...)
		ld, _ := l.Digest()
		n := "layer" + itoa(i)
		push(t, host, "models/"+n+":1", modelcar(t, l))
		if tc.interrupted {
			cut.Store(ld.String(), true)
		}
		before := fromBlob.Load()
		req := api.PullRequest{Name: n, URI: "oci://" + host + "/models/" + n + ":1"}
		_, err := h.pull(req)
		if tc.interrupted { // one attempt a pull: the cut fails it, its partial data stays
			if err == nil {
				t.Fatalf("case %+v: a pull whose one attempt was cut succeeded", tc)
			}
			_, err = h.pull(req)
		}
		if got := fromBlob.Load() - before; got != tc.wantFromBlob {
			t.Fatalf("case %+v: the archive was checked from the blob %d times, want %d", tc, got, tc.wantFromBlob)
		}
		if _, ok := cut.Load(ld.String()); ok {
			t.Fatalf("case %+v: the layer was never fetched", tc)
		}
		if tc.hostile {
			if !errors.Is(err, api.ErrFailed) || !strings.Contains(err.Error(), "refused archive entry") {
				t.Fatalf("case %+v: %v, want the hostile entry refused", tc, err)
			}
			if _, err := lstatTree(h.cfg.Root, n); err == nil {
				t.Fatalf("case %+v: a tree appeared for a hostile layer", tc)
			}
			continue
		}
		if err != nil {
			t.Fatalf("case %+v: %v", tc, err)
		}
		if h.read(n, "w.bin") != string(w[i:]) || h.read(n, "config.json") != itoa(i) {
			t.Fatalf("case %+v: the unpacked files differ", tc)
		}
	}
}
