package kernelcache

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
	"golang.org/x/sys/unix"

	"github.com/modelcache/modelcache/gpu/mcv"
)

// ImageOptions are what Image needs beyond the scanned cache.
type ImageOptions struct {
	// Title is the image's name without registry or tag
	// (org.opencontainers.image.title).
	Title string
	// Targets are GPUs the cache was compiled for, added to the summary:
	// required where the cache holds no Triton metadata (a vLLM binary
	// cache embeds its kernels in its artifacts).
	Targets []mcv.SummaryTarget
	// TempDir holds the layer while it is built and pushed ("" is the
	// system's).
	TempDir string
}

// Built is an image Image made: the image, its labels and manifest.json.
// Close removes the layer's temporary file once the image is pushed.
type Built struct {
	Image    v1.Image
	Labels   map[string]string
	Manifest []byte
	layer    string
}

// Close removes the temporary layer file.
func (b *Built) Close() error { return os.Remove(b.layer) }

// epoch is every timestamp of an image: the same cache gives the same
// digest on any day.
var epoch = time.Unix(0, 0).UTC()

// Image lays c out as MCV's Go image builder does (schema2image.go): one
// tar+gzip layer holding <cache dir>/… and <manifest dir>/manifest.json
// (the layer MCV's extraction reads is the last one: there is only one),
// a Docker schema 2 manifest, and the labels of the cache's kind. Unlike
// MCV it writes every timestamp and owner as zero, so that the digest
// depends on the bytes alone.
func Image(c *Cache, o ImageOptions) (*Built, error) {
	d, _ := mcv.DirNamed(c.Kind)
	sum := mcv.Summarize(c.Entries)
	sum.Targets = append(sum.Targets, o.Targets...)
	if len(sum.Targets) == 0 {
		return nil, fmt.Errorf("%s: no Triton kernel metadata (<kernel>.json with a \"hash\") under it, so the GPUs it runs on are unknown: name them with --target (e.g. --target cuda:90)", c.Root)
	}
	var man mcv.Manifest
	if c.Kind == KindVLLM {
		man.VLLM = c.VLLM
	} else {
		man.Triton = c.Entries
		if man.Triton == nil {
			man.Triton = []mcv.Entry{}
		}
	}
	mb, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		return nil, err
	}
	sb, _ := json.Marshal(sum)
	labels := map[string]string{d.CountLabel: strconv.Itoa(len(c.Entries)), d.SizeLabel: strconv.FormatInt(c.Bytes, 10), d.Summary: string(sb)}
	if c.Kind == KindVLLM {
		labels[d.CountLabel] = strconv.Itoa(len(c.VLLM)) // vllm.go: the torch_compile_cache/<hash> directories
		labels[mcv.LabelVLLMFormat] = vllmFormat(c.VLLM)
	}
	if o.Title != "" {
		labels[mcv.LabelTitle] = o.Title
	}

	f, err := os.CreateTemp(o.TempDir, "kernelcache-layer-*.tar.gz")
	if err != nil {
		return nil, err
	}
	b := &Built{Labels: labels, Manifest: mb, layer: f.Name()}
	fail := func(err error) (*Built, error) { f.Close(); b.Close(); return nil, err }
	if err := writeLayer(f, c, d, mb); err != nil {
		return fail(err)
	}
	if err := f.Close(); err != nil {
		return fail(err)
	}
	layer, err := tarball.LayerFromFile(b.layer, tarball.WithMediaType(types.DockerLayer))
	if err != nil {
		return fail(err)
	}
	img, err := mutate.Append(mutate.MediaType(empty.Image, types.DockerManifestSchema2), mutate.Addendum{
		Layer: layer, MediaType: types.DockerLayer,
		History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "modelctl kernelcache build"},
	})
	if err != nil {
		return fail(err)
	}
	img = mutate.ConfigMediaType(img, types.DockerConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		return fail(err)
	}
	cf = cf.DeepCopy()
	cf.Created = v1.Time{Time: epoch}
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Labels = labels
	if b.Image, err = mutate.ConfigFile(img, cf); err != nil {
		return fail(err)
	}
	return b, nil
}

// vllmFormat is the cache.vllm.image/format label (vllm.go's Labels).
func vllmFormat(es []mcv.VLLMEntry) string {
	set := map[string]bool{}
	for _, e := range es {
		set[e.CacheFormat] = true
	}
	var fs []string
	for _, f := range []string{"aot_compile", "binary", "triton"} {
		if set[f] {
			fs = append(fs, f)
		}
	}
	if len(fs) == 0 {
		return "unpacked"
	}
	return strings.Join(fs, ",")
}

// writeLayer writes the layer: the cache directory's tree under d.Dir,
// then d.Manifest/manifest.json.
func writeLayer(w io.Writer, c *Cache, d mcv.Dir, manifest []byte) error {
	zw, err := gzip.NewWriterLevel(w, gzip.DefaultCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(zw)
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Name: name + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: epoch, Format: tar.FormatPAX})
	}
	if err := dir(d.Dir); err != nil {
		return err
	}
	// Directories first, then files: both sorted, so a file's directory
	// is always written before it.
	for _, p := range c.Dirs {
		if err := dir(d.Dir + "/" + p); err != nil {
			return err
		}
	}
	for _, f := range c.Files {
		mode := int64(0o644)
		if f.Exec {
			mode = 0o755
		}
		if err := tw.WriteHeader(&tar.Header{Name: d.Dir + "/" + f.Path, Typeflag: tar.TypeReg, Mode: mode, Size: f.Size, ModTime: epoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
		if err := copyFile(tw, c, f); err != nil {
			return err
		}
	}
	if err := dir(d.Manifest); err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: d.Manifest + "/" + mcv.ManifestFile, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(manifest)), ModTime: epoch, Format: tar.FormatPAX}); err != nil {
		return err
	}
	if _, err := tw.Write(manifest); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

// openBeneath opens rel under root for reading through no symbolic link
// (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS): a directory of the path
// swapped for a link since Scan (a pod still writing into a volume that
// is captured) cannot send the read outside the cache directory. Before
// Linux 5.6, each directory is opened with O_NOFOLLOW in turn.
func openBeneath(root, rel string) (*os.File, error) {
	dir, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dir)
	fd, err := unix.Openat2(dir, rel, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS})
	if errors.Is(err, unix.ENOSYS) {
		parts := strings.Split(rel, "/")
		cur := dir
		for i, p := range parts {
			flags := unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_CLOEXEC
			if i < len(parts)-1 {
				flags |= unix.O_DIRECTORY
			}
			next, err := unix.Openat(cur, p, flags, 0)
			if cur != dir {
				unix.Close(cur)
			}
			if err != nil {
				return nil, err
			}
			cur = next
		}
		fd, err = cur, nil
	}
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), filepath.Join(root, rel)), nil
}

// copyFile copies exactly the size Scan saw: a file that changed since
// is an error, not a layer that disagrees with its labels.
func copyFile(w io.Writer, c *Cache, f File) error {
	r, err := openBeneath(c.Root, f.Path)
	if err != nil {
		return fmt.Errorf("%s: %w", f.Path, err)
	}
	defer r.Close()
	fi, err := r.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Size() != f.Size {
		return fmt.Errorf("%s changed while the image was built (%d bytes, was %d): build again once the framework is done writing", f.Path, fi.Size(), f.Size)
	}
	_, err = io.CopyN(w, r, f.Size)
	return err
}
