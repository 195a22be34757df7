// Command mkimage builds the modelcached image without a container engine
// (make image): the binaries on a minimal glibc base made of the build
// host's Debian files (libc6's shared objects and loader, the CA bundle, a
// passwd and group naming root), written as an OCI image archive. The
// archive also carries a docker-save manifest.json, so that
// `ctr -n k8s.io images import`, `skopeo copy oci-archive:…`, `crane push`
// and `docker load` all take it. Every file gets a fixed timestamp, so the
// same inputs give the same digest.
//
//	mkimage -out bin/modelcached.oci.tar -ref ghcr.io/modelcache/modelcached:TAG \
//	  -base "$(dpkg -L libc6)" bin/modelcached bin/modelctl
package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// epoch is every file's modification time and the image's creation time.
var epoch = time.Unix(0, 0).UTC()

func main() {
	out := flag.String("out", "bin/modelcached.oci.tar", "the OCI image archive to write")
	ref := flag.String("ref", "ghcr.io/modelcache/modelcached:dev", "the image's name inside the archive")
	entry := flag.String("entrypoint", "/usr/bin/modelcached", "the image's entrypoint")
	base := flag.String("base", "", "host files of the base layer, whitespace-separated (e.g. `dpkg -L libc6`); directories and gconv modules are skipped")
	flag.Parse()
	if err := run(*out, *ref, *entry, strings.Fields(*base), flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(out, ref, entry string, base, bins []string) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return err
	}
	if len(bins) == 0 {
		return fmt.Errorf("no binaries given")
	}
	l := newLayer()
	for _, p := range base {
		if strings.Contains(p, "/gconv/") || strings.HasPrefix(p, "/usr/share/") {
			continue // charset modules, docs, locales: nothing here uses them
		}
		if err := l.addHost(p); err != nil {
			return err
		}
	}
	for _, p := range []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/ld.so.conf.d/x86_64-linux-gnu.conf"} {
		if _, err := os.Stat(p); err == nil {
			if err := l.addHost(p); err != nil {
				return err
			}
		}
	}
	l.addFile("/etc/passwd", []byte("root:x:0:0:root:/root:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"), 0o644)
	l.addFile("/etc/group", []byte("root:x:0:\nmodelcache:x:999:\nnogroup:x:65534:\n"), 0o644)
	l.addFile("/etc/nsswitch.conf", []byte("passwd: files\ngroup: files\nhosts: files dns\n"), 0o644)
	l.addDir("/tmp", 0o1777)
	baseLayer, err := l.layer()
	if err != nil {
		return err
	}
	b := newLayer()
	for _, p := range bins {
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		b.addFile("/usr/bin/"+filepath.Base(p), data, 0o755)
	}
	binLayer, err := b.layer()
	if err != nil {
		return err
	}

	img, err := mutate.AppendLayers(empty.Image, baseLayer, binLayer)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS, cf.Created = "amd64", "linux", v1.Time{Time: epoch}
	cf.Config.Entrypoint = []string{entry}
	cf.Config.Env = []string{"PATH=/usr/bin:/bin"}
	cf.Config.Labels = map[string]string{"org.opencontainers.image.source": "https://github.com/modelcache/modelcache"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	return writeArchive(out, tag, img)
}

// writeArchive writes img as an OCI layout (index.json naming it by ref
// for containerd and by tag per the OCI spec) plus a docker-save
// manifest.json over the same blobs, tarred into one file.
func writeArchive(out string, tag name.Tag, img v1.Image) error {
	dir, err := os.MkdirTemp("", "mkimage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          tag.Name(),
		"org.opencontainers.image.ref.name": tag.TagStr(),
	})); err != nil {
		return err
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	dm := []tarball.Descriptor{{Config: "blobs/sha256/" + cfgName.Hex, RepoTags: []string{tag.Name()}}}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		dm[0].Layers = append(dm[0].Layers, "blobs/sha256/"+d.Hex)
	}
	mj, err := json.Marshal(dm)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "manifest.json"), mj, 0o644); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	var files []string
	err = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		f.Close()
		return err
	}
	sort.Strings(files)
	for _, p := range files {
		rel, _ := filepath.Rel(dir, p)
		data, err := os.ReadFile(p)
		if err != nil {
			f.Close()
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: rel, Mode: 0o644, Size: int64(len(data)), ModTime: epoch, Typeflag: tar.TypeReg, Format: tar.FormatPAX}); err != nil {
			f.Close()
			return err
		}
		if _, err := tw.Write(data); err != nil {
			f.Close()
			return err
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, out); err != nil {
		return err
	}
	d, _ := img.Digest()
	fmt.Printf("%s %s %s\n", out, tag.Name(), d)
	return nil
}

// layer collects a filesystem layer: entries by path, parents made as needed.
type layer struct {
	entries map[string]*tar.Header
	data    map[string][]byte
}

func newLayer() *layer {
	return &layer{entries: map[string]*tar.Header{}, data: map[string][]byte{}}
}

func (l *layer) addDir(p string, mode int64) {
	p = path.Clean(p)
	if p == "/" {
		return
	}
	if _, ok := l.entries[p]; ok {
		return
	}
	l.addParents(p)
	l.entries[p] = &tar.Header{Name: strings.TrimPrefix(p, "/") + "/", Typeflag: tar.TypeDir, Mode: mode, ModTime: epoch}
}

func (l *layer) addParents(p string) {
	if d := path.Dir(p); d != "/" {
		if _, ok := l.entries[d]; !ok {
			l.addDir(d, 0o755)
		}
	}
}

func (l *layer) addFile(p string, data []byte, mode int64) {
	l.addParents(p)
	l.entries[p] = &tar.Header{Name: strings.TrimPrefix(p, "/"), Typeflag: tar.TypeReg, Mode: mode, Size: int64(len(data)), ModTime: epoch}
	l.data[p] = data
}

func (l *layer) addSymlink(p, target string) {
	l.addParents(p)
	l.entries[p] = &tar.Header{Name: strings.TrimPrefix(p, "/"), Typeflag: tar.TypeSymlink, Linkname: target, Mode: 0o777, ModTime: epoch}
}

// addHost copies a host file (or symlink) to the same path, keeping the
// symlinks among its parents (Debian's /lib -> usr/lib) as symlinks, so the
// loader's path in the binaries' headers resolves as on the host.
func (l *layer) addHost(p string) error {
	p = path.Clean(p)
	// Walk the parents: a symlinked one becomes a symlink and the walk
	// continues at its target.
	parts := strings.Split(strings.TrimPrefix(p, "/"), "/")
	cur := "/"
	for i, part := range parts {
		next := path.Join(cur, part)
		fi, err := os.Lstat(next)
		if err != nil {
			return err
		}
		last := i == len(parts)-1
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			t, err := os.Readlink(next)
			if err != nil {
				return err
			}
			l.addSymlink(next, t)
			if !path.IsAbs(t) {
				t = path.Join(path.Dir(next), t)
			}
			if last {
				return l.addHost(t)
			}
			return l.addHost(path.Join(append([]string{t}, parts[i+1:]...)...))
		case fi.IsDir():
			if last {
				return nil // a directory of the package list: its files come on their own
			}
		case fi.Mode().IsRegular() && last:
			data, err := os.ReadFile(next)
			if err != nil {
				return err
			}
			l.addFile(next, data, int64(fi.Mode().Perm()))
		}
		cur = next
	}
	return nil
}

func (l *layer) layer() (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	paths := make([]string, 0, len(l.entries))
	for p := range l.entries {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if err := tw.WriteHeader(l.entries[p]); err != nil {
			return nil, err
		}
		if d, ok := l.data[p]; ok {
			if _, err := tw.Write(d); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
}
