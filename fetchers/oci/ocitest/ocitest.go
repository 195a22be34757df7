// Package ocitest builds what the OCI tests push to a loopback registry:
// kernel cache images laid out as GKM's MCV tool writes them, and cosign
// signatures made by the real cosign CLIs (v2: .sig tags, v3: sigstore
// bundles), fully offline.
package ocitest

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"

	"github.com/modelcache/modelcache/internal/testenv"
)

// Entry is one kernel of an MCV manifest.
type Entry struct {
	Hash       string `json:"hash"`
	Backend    string `json:"backend"`
	Arch       any    `json:"arch"` // 90 for cuda, "gfx90a" for hip
	WarpSize   int    `json:"warp_size"`
	PTXVersion int    `json:"ptx_version,omitempty"`
	NumStages  int    `json:"num_stages"`
	NumWarps   int    `json:"num_warps"`
}

// KernelCache is a Triton kernel cache image: files under io.triton.cache/
// (path → bytes), the manifest of entries, and the MCV labels. Extra tar
// entries (hostile ones) are appended as given.
type KernelCache struct {
	Entries []Entry
	Files   map[string][]byte
	// SizeLabel overrides cache.triton.image/cache-size-bytes (-1: omit).
	SizeLabel int64
	Extra     []*tar.Header
	// NoSummary leaves the summary label out.
	NoSummary bool
}

// Image builds the image for a test (Build, failing the test on error).
func (k KernelCache) Image(t testing.TB) v1.Image {
	t.Helper()
	img, err := k.Build()
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// Build makes the image: one tar+gzip layer (fastest compression: cubins
// barely compress), labels in the config. The benchmark uses it too.
func (k KernelCache) Build() (v1.Image, error) {
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	var size int64
	paths := make([]string, 0, len(k.Files))
	for p := range k.Files {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		b := k.Files[p]
		tw.WriteHeader(&tar.Header{Name: "io.triton.cache/" + p, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b))})
		tw.Write(b)
		size += int64(len(b))
	}
	man, _ := json.Marshal(map[string]any{"triton": k.Entries})
	tw.WriteHeader(&tar.Header{Name: "io.triton.manifest/manifest.json", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(man))})
	tw.Write(man)
	for _, h := range k.Extra {
		tw.WriteHeader(h)
		if h.Size > 0 {
			tw.Write(bytes.Repeat([]byte{'x'}, int(h.Size)))
		}
	}
	tw.Close()
	var z bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&z, gzip.BestSpeed)
	zw.Write(raw.Bytes())
	zw.Close()
	raw = bytes.Buffer{}
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), static.NewLayer(z.Bytes(), types.OCILayer))
	if err != nil {
		return nil, err
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.Config.Labels = map[string]string{"cache.triton.image/entry-count": strconv.Itoa(len(k.Entries)), "cache.triton.image/variant": "compat"}
	if k.SizeLabel != -1 {
		if k.SizeLabel > 0 {
			size = k.SizeLabel
		}
		cf.Config.Labels["cache.triton.image/cache-size-bytes"] = strconv.FormatInt(size, 10)
	}
	if !k.NoSummary {
		type target struct {
			Backend  string `json:"backend"`
			Arch     any    `json:"arch"`
			WarpSize int    `json:"warp_size"`
		}
		seen := map[string]bool{}
		var ts []target
		for _, e := range k.Entries {
			key := fmt.Sprint(e.Backend, e.Arch, e.WarpSize)
			if !seen[key] {
				seen[key] = true
				ts = append(ts, target{e.Backend, fmt.Sprint(e.Arch), e.WarpSize})
			}
		}
		s, _ := json.Marshal(map[string]any{"targets": ts})
		cf.Config.Labels["cache.triton.image/summary"] = string(s)
	}
	return mutate.ConfigFile(img, cf)
}

// SM90 and SM80 are kernel caches for Hopper and Ampere GPUs.
func SM90(files map[string][]byte) KernelCache {
	return KernelCache{Files: files, Entries: []Entry{{Hash: "h90", Backend: "cuda", Arch: 90, WarpSize: 32, PTXVersion: 83, NumStages: 3, NumWarps: 4}}}
}

func SM80(files map[string][]byte) KernelCache {
	return KernelCache{Files: files, Entries: []Entry{{Hash: "h80", Backend: "cuda", Arch: 80, WarpSize: 32, PTXVersion: 78, NumStages: 3, NumWarps: 4}}}
}

// Push writes img to host/repo (plain HTTP) and returns its digest
// "sha256:<hex>".
func Push(t testing.TB, host, repo string, img v1.Image) string {
	t.Helper()
	ref, err := name.ParseReference(host+"/"+repo, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	d, _ := img.Digest()
	return d.String()
}

// Cosign drives the real cosign CLIs: v2 (cosign, signs with .sig tags)
// and v3 (cosign-v3, signs with sigstore bundles), offline.
type Cosign struct {
	V2, V3 string
	Dir    string
}

// NewCosign finds both CLIs (Missing when absent: .ci/run builds them).
func NewCosign(t testing.TB) *Cosign {
	t.Helper()
	return &Cosign{
		V2:  testenv.Require(t, "cosign", "go install github.com/sigstore/cosign/v2/cmd/cosign@v2.6.5, as .ci/run does"),
		V3:  testenv.Require(t, "cosign-v3", "go install github.com/sigstore/cosign/v3/cmd/cosign@v3.0.4 renamed cosign-v3, as .ci/run does"),
		Dir: t.TempDir(),
	}
}

func (c *Cosign) run(t testing.TB, bin string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Dir = c.Dir
	// No network: no TUF, no Rekor, no Fulcio; an empty key password.
	cmd.Env = append(os.Environ(), "COSIGN_PASSWORD=", "TUF_ROOT="+filepath.Join(c.Dir, "tuf"), "SIGSTORE_NO_CACHE=true", "HOME="+c.Dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", filepath.Base(bin), args, err, out)
	}
}

// KeyPair makes a cosign key pair named prefix and returns the paths of
// the private key and of the PEM public key.
func (c *Cosign) KeyPair(t testing.TB, prefix string) (string, string) {
	t.Helper()
	c.run(t, c.V2, "generate-key-pair", "--output-key-prefix", prefix)
	return filepath.Join(c.Dir, prefix+".key"), filepath.Join(c.Dir, prefix+".pub")
}

// SignV2 signs ref (host/repo@sha256:…) with cosign v2: a .sig tag.
// Extra flags (a certificate for keyless) follow the key.
func (c *Cosign) SignV2(t testing.TB, key, ref string, extra ...string) {
	t.Helper()
	args := append([]string{"sign", "--yes", "--key", key, "--tlog-upload=false", "--allow-http-registry"}, extra...)
	c.run(t, c.V2, append(args, ref)...)
}

// SignV3 signs ref with cosign v3: a sigstore bundle as a referrer.
// Extra flags (a certificate for keyless) follow the key.
func (c *Cosign) SignV3(t testing.TB, key, ref string, extra ...string) {
	t.Helper()
	args := append([]string{"sign", "--yes", "--key", key, "--tlog-upload=false", "--use-signing-config=false", "--allow-http-registry"}, extra...)
	c.run(t, c.V3, append(args, ref)...)
}

// ImportKey turns a PEM private key into a cosign key file.
func (c *Cosign) ImportKey(t testing.TB, pemPath, prefix string) string {
	t.Helper()
	c.run(t, c.V2, "import-key-pair", "--key", pemPath, "--output-key-prefix", prefix)
	return filepath.Join(c.Dir, prefix+".key")
}
