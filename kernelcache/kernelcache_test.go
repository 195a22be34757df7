package kernelcache_test

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/sigstore/cosign/v2/pkg/cosign"

	ocifetcher "github.com/modelcache/modelcache/fetchers/oci"
	"github.com/modelcache/modelcache/gpu/mcv"
	"github.com/modelcache/modelcache/internal/testenv"
	"github.com/modelcache/modelcache/kernelcache"
	"github.com/modelcache/modelcache/kernelcache/fixtures"
)

// TestScanRealTritonCache: every kernel of the H200 Triton cache is
// parsed from its metadata, nothing else is taken for one.
func TestScanRealTritonCache(t *testing.T) {
	c, err := kernelcache.Scan(fixtures.Triton(t), kernelcache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Kind != kernelcache.KindTriton || len(c.Files) != 27 || len(c.Entries) != 3 {
		t.Fatalf("kind %s, %d files, %d entries; want triton, 27, 3", c.Kind, len(c.Files), len(c.Entries))
	}
	var sum int64
	for _, f := range c.Files {
		sum += f.Size
	}
	if sum != c.Bytes || c.Bytes < 1<<20 {
		t.Fatalf("bytes %d (files sum to %d); the cache is 1.1 MiB", c.Bytes, sum)
	}
	for i, e := range c.Entries {
		tg := c.Targets[i]
		if e.Backend != "cuda" || e.Arch != "90" || e.WarpSize != 32 || len(e.Hash) != 64 || e.NumWarps == 0 || tg.Arch != "90" || tg.PTXVersion != 0 {
			t.Errorf("entry %d: %+v %+v", i, e, tg)
		}
	}
}

// TestScanRealInductorCache: the Inductor cache is told apart, its two
// Triton kernels (under triton/) are its entries.
func TestScanRealInductorCache(t *testing.T) {
	c, err := kernelcache.Scan(fixtures.Inductor(t), kernelcache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Kind != kernelcache.KindInductor || len(c.Files) != 22 || len(c.Entries) != 2 {
		t.Fatalf("kind %s, %d files, %d entries; want torchinductor, 22, 2", c.Kind, len(c.Files), len(c.Entries))
	}
	for _, e := range c.Entries {
		if e.Backend != "cuda" || e.Arch != "90" {
			t.Errorf("entry %+v", e)
		}
	}
}

// TestScanRefusesWhatAnExtractionRefuses: links, device files, FIFOs and
// trees beyond the limits are refused with the path and the remedy.
func TestScanRefusesWhatAnExtractionRefuses(t *testing.T) {
	for _, c := range []struct {
		name string
		make func(dir string) error
		lim  kernelcache.Limits
		want string
	}{
		{"symlink out", func(d string) error { return os.Symlink("/etc/passwd", filepath.Join(d, "k", "evil.json")) }, kernelcache.Limits{}, "symbolic link"},
		{"symlinked dir", func(d string) error { return os.Symlink("/etc", filepath.Join(d, "etc")) }, kernelcache.Limits{}, "symbolic link"},
		{"fifo", func(d string) error { return syscall.Mkfifo(filepath.Join(d, "k", "pipe"), 0o644) }, kernelcache.Limits{}, "FIFO"},
		{"device", func(d string) error {
			return syscall.Mknod(filepath.Join(d, "k", "null"), syscall.S_IFCHR|0o644, int(unixMkdev(1, 3)))
		}, kernelcache.Limits{}, "device file"},
		{"too many bytes", func(string) error { return nil }, kernelcache.Limits{MaxBytes: 10}, "more than"},
		{"too many files", func(string) error { return nil }, kernelcache.Limits{MaxFiles: 1}, "more than"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			os.MkdirAll(filepath.Join(dir, "k"), 0o755)
			os.WriteFile(filepath.Join(dir, "k", "a.cubin"), []byte("0123456789abcdef"), 0o644)
			os.WriteFile(filepath.Join(dir, "k", "b.json"), []byte(`{}`), 0o644)
			if err := c.make(dir); err != nil {
				testenv.Missing(t, "making a "+c.name+" entry ("+err.Error()+")", "run as root: mknod needs CAP_MKNOD")
			}
			_, err := kernelcache.Scan(dir, kernelcache.Options{Limits: c.lim})
			if !errors.Is(err, kernelcache.ErrRefused) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v; want ErrRefused naming %q", err, c.want)
			}
		})
	}
	// Metadata whose target cannot be read fails, naming the file.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "k.json"), []byte(`{"hash":"abc","target":{"backend":"cuda","arch":[9],"warp_size":32}}`), 0o644)
	if _, err := kernelcache.Scan(dir, kernelcache.Options{}); err == nil || !strings.Contains(err.Error(), "k.json") {
		t.Fatalf("unreadable metadata: %v", err)
	}
	// No metadata and no --target: refused at Image, saying what to do.
	dir = t.TempDir()
	os.WriteFile(filepath.Join(dir, "x.bin"), []byte("x"), 0o644)
	c, err := kernelcache.Scan(dir, kernelcache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kernelcache.Image(c, kernelcache.ImageOptions{}); err == nil || !strings.Contains(err.Error(), "--target") {
		t.Fatalf("a cache without metadata: %v", err)
	}
}

func unixMkdev(major, minor uint32) uint64 {
	return uint64(major)<<8 | uint64(minor)
}

// layer reads the single layer of img into path → bytes (directories as
// nil) and checks the MCV layout's media types.
func layer(t *testing.T, b *kernelcache.Built) map[string][]byte {
	t.Helper()
	mt, _ := b.Image.MediaType()
	ls, err := b.Image.Layers()
	if err != nil || len(ls) != 1 || mt != types.DockerManifestSchema2 {
		t.Fatalf("MCV's Go builder writes one layer in a Docker schema 2 image: %d layers, %s, %v", len(ls), mt, err)
	}
	lmt, _ := ls[0].MediaType()
	if lmt != types.DockerLayer {
		t.Fatalf("layer media type %s", lmt)
	}
	rc, _ := ls[0].Compressed()
	defer rc.Close()
	zr, err := gzip.NewReader(rc)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]byte{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeDir {
			out[h.Name] = nil
			continue
		}
		if h.Typeflag != tar.TypeReg || h.Uid != 0 || h.ModTime.Unix() != 0 {
			t.Fatalf("entry %s: type %c", h.Name, h.Typeflag)
		}
		out[h.Name], _ = io.ReadAll(tr)
	}
}

// TestImageFollowsMCVLayout: the layer holds io.triton.cache/<the cache>
// and io.triton.manifest/manifest.json; the labels are MCV's; the
// manifest's entries are MCV's TritonCacheMetadata and parse back to the
// targets; the same cache gives the same digest.
func TestImageFollowsMCVLayout(t *testing.T) {
	dir := fixtures.Triton(t)
	c, err := kernelcache.Scan(dir, kernelcache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := kernelcache.Image(c, kernelcache.ImageOptions{Title: "llama-kernels"})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	files := layer(t, b)
	for _, f := range c.Files {
		want, _ := os.ReadFile(filepath.Join(dir, f.Path))
		if got, ok := files["io.triton.cache/"+f.Path]; !ok || string(got) != string(want) {
			t.Fatalf("%s missing or changed in the layer", f.Path)
		}
	}
	man := files["io.triton.manifest/manifest.json"]
	if len(files) != 1+len(c.Dirs)+len(c.Files)+2 || man == nil {
		t.Fatalf("%d layer entries; want the top dirs, %d dirs, %d files and the manifest", len(files), len(c.Dirs), len(c.Files))
	}
	var doc struct {
		Triton []map[string]any `json:"triton"`
	}
	if err := json.Unmarshal(man, &doc); err != nil || len(doc.Triton) != 3 {
		t.Fatalf("manifest %s: %v", man, err)
	}
	for _, e := range doc.Triton {
		for _, k := range []string{"hash", "backend", "arch", "warp_size", "num_warps", "num_stages"} {
			if _, ok := e[k]; !ok {
				t.Errorf("manifest entry lacks %s (MCV's TritonCacheMetadata): %v", k, e)
			}
		}
		if e["arch"] != "90" { // ConvertArchToString: a string
			t.Errorf("arch %#v; MCV writes a string", e["arch"])
		}
	}
	ts, err := mcv.ParseManifest(man)
	if err != nil || len(ts) != 3 {
		t.Fatalf("the daemon's reader: %v %v", ts, err)
	}
	cf, _ := b.Image.ConfigFile()
	l := cf.Config.Labels
	if l[mcv.LabelTritonEntryCount] != "3" || l[mcv.LabelTritonCacheSize] != itoa(c.Bytes) || l[mcv.LabelTitle] != "llama-kernels" ||
		l[mcv.LabelTritonSummary] != `{"targets":[{"backend":"cuda","arch":"90","warp_size":32}]}` || cf.OS != "linux" {
		t.Fatalf("labels %v", l)
	}
	b2, err := kernelcache.Image(c, kernelcache.ImageOptions{Title: "llama-kernels"})
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	d1, _ := b.Image.Digest()
	d2, _ := b2.Image.Digest()
	if d1 != d2 {
		t.Fatalf("the same cache built twice: %s, %s", d1, d2)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestBuildPushSignVerify: the Inductor and Triton caches are built,
// pushed to Debian's docker-registry and signed with cosign's library;
// the daemon's verifier (cosign's library, offline) accepts the
// signature under the public key and refuses it under another; the real
// cosign CLI verifies it too where it is installed.
func TestBuildPushSignVerify(t *testing.T) {
	host := testenv.Registry(t)
	ctx := context.Background()
	pass := func(bool) ([]byte, error) { return []byte("pw"), nil }
	keys, err := cosign.GenerateKeyPair(pass)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := cosign.GenerateKeyPair(pass)
	signer, err := kernelcache.KeySigner(keys.PrivateBytes, []byte("pw"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kernelcache.KeySigner(keys.PrivateBytes, []byte("wrong")); err == nil {
		t.Fatal("a wrong password must fail")
	}
	reg := kernelcache.Registry{}
	of := ocifetcher.New()
	for _, fx := range []struct {
		dir, repo string
	}{{fixtures.Triton(t), "kernels/triton"}, {fixtures.Inductor(t), "kernels/inductor"}} {
		c, err := kernelcache.Scan(fx.dir, kernelcache.Options{})
		if err != nil {
			t.Fatal(err)
		}
		ref, err := reg.ParseRef("oci://" + host + "/" + fx.repo + ":h200")
		if err != nil {
			t.Fatal(err)
		}
		b, err := kernelcache.Image(c, kernelcache.ImageOptions{Title: kernelcache.Title(ref)})
		if err != nil {
			t.Fatal(err)
		}
		dref, err := reg.Push(ctx, ref, b)
		b.Close()
		if err != nil {
			t.Fatal(err)
		}
		if err := reg.Sign(ctx, dref, signer); err != nil {
			t.Fatal(err)
		}
		got, err := remote.Image(dref)
		if err != nil {
			t.Fatal(err)
		}
		if cf, _ := got.ConfigFile(); cf.Config.Labels[mcv.LabelTitle] != strings.TrimPrefix(fx.repo, "kernels/") {
			t.Fatalf("pushed labels %v", cf.Config.Labels)
		}
		uri := "oci://" + ref.String()
		res, err := of.VerifySignature(ctx, uri, dref.DigestStr(), ocifetcher.SignaturePolicy{PublicKeys: [][]byte{keys.PublicBytes}})
		if err != nil || res.Format != ocifetcher.FormatCosignTag {
			t.Fatalf("verify with the key: %+v %v", res, err)
		}
		if _, err := of.VerifySignature(ctx, uri, dref.DigestStr(), ocifetcher.SignaturePolicy{PublicKeys: [][]byte{other.PublicBytes}}); !errors.Is(err, ocifetcher.ErrBadSignature) {
			t.Fatalf("another key must not verify: %v", err)
		}
		cosignVerify(t, keys.PublicBytes, dref)
	}
}

// cosignVerify checks the signature with the real cosign CLI, offline.
func cosignVerify(t *testing.T, pub []byte, dref name.Digest) {
	t.Helper()
	bin := testenv.Require(t, "cosign", "go install github.com/sigstore/cosign/v2/cmd/cosign@v2.6.5, as .ci/run does")
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "cosign.pub"), pub, 0o644)
	cmd := exec.Command(bin, "verify", "--key", "cosign.pub", "--insecure-ignore-tlog=true", "--allow-http-registry", dref.String())
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "TUF_ROOT="+filepath.Join(dir, "tuf"), "SIGSTORE_NO_CACHE=true", "HOME="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cosign verify %s: %v\n%s", dref, err, out)
	}
}

// TestVLLMCacheFollowsMCVLayout: a vLLM cache goes under io.vllm.cache/
// with MCV's vLLM manifest (per torch_compile_cache/<hash>: the Triton
// format's kernels, the binary format's artifacts) and labels (entry
// count of hash directories, format), and its kernels parse back.
func TestVLLMCacheFollowsMCVLayout(t *testing.T) {
	c, err := kernelcache.Scan(fixtures.VLLM(t), kernelcache.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Kind != kernelcache.KindVLLM || len(c.Entries) != 3 || len(c.VLLM) != 2 {
		t.Fatalf("kind %s, %d entries, %d hash dirs", c.Kind, len(c.Entries), len(c.VLLM))
	}
	b, err := kernelcache.Image(c, kernelcache.ImageOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	files := layer(t, b)
	man := files["io.vllm.manifest/manifest.json"]
	if _, ok := files["io.vllm.cache/torch_compile_cache/edf531ca35/rank_0_0/backbone/cache_key_factors.json"]; !ok || man == nil {
		t.Fatalf("layout: %d entries", len(files))
	}
	var doc struct {
		VLLM []struct {
			Hash   string           `json:"vllmHash"`
			Format string           `json:"cacheFormat"`
			Triton []map[string]any `json:"triton"`
			Binary []struct {
				Rank, Prefix, TargetDevice string
				ArtifactCount              int `json:"artifact_count"`
			} `json:"binary"`
		} `json:"vllm"`
	}
	if err := json.Unmarshal(man, &doc); err != nil || len(doc.VLLM) != 2 {
		t.Fatalf("manifest %s: %v", man, err)
	}
	if v := doc.VLLM[0]; v.Hash != "d4ec7c2a7d" || v.Format != "triton" || len(v.Triton) != 3 {
		t.Errorf("the Triton-format entry: %+v", v)
	}
	if v := doc.VLLM[1]; v.Hash != "edf531ca35" || v.Format != "binary" || len(v.Binary) != 1 || v.Binary[0].ArtifactCount != 2 {
		t.Errorf("the binary-format entry: %+v", v)
	}
	if ts, err := mcv.ParseManifest(man); err != nil || len(ts) != 3 {
		t.Fatalf("the daemon's reader: %v %v", ts, err)
	}
	if b.Labels[mcv.LabelVLLMEntryCount] != "2" || b.Labels[mcv.LabelVLLMFormat] != "binary,triton" || b.Labels[mcv.LabelVLLMCacheSize] != strconv.FormatInt(c.Bytes, 10) {
		t.Fatalf("labels %v", b.Labels)
	}
}
