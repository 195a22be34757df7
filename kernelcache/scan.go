// Package kernelcache builds kernel cache images from what a framework
// wrote: a Triton cache (TRITON_CACHE_DIR), a vLLM cache
// (VLLM_CACHE_ROOT, with torch_compile_cache/) or a torch.compile
// Inductor cache (TORCHINDUCTOR_CACHE_DIR). It reads the cache directory
// with the checks an extraction makes (regular files and directories
// only, no links, no device files, bounded), parses every kernel's Triton
// metadata into the manifest, lays the image out as GKM's MCV does
// (package gpu/mcv, the layout the daemon reads), pushes it with the
// credentials crane and docker use, and signs it with cosign's library.
// No container engine and no cosign CLI are involved.
//
// Where to find what:
//
//	scan.go   Scan: the cache directory, its kind, files, entries, checks
//	image.go  Image: the layer, manifest.json and labels
//	push.go   Push and Sign (a cosign key, or keyless with an identity token)
package kernelcache

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/modelcache/modelcache/gpu/mcv"
)

// Kinds of cache directory.
const (
	KindTriton   = "triton"
	KindVLLM     = "vllm"
	KindInductor = "torchinductor"
)

// ErrRefused is a cache directory holding what an image must not carry
// (a link, a device file, more than the limits allow).
var ErrRefused = errors.New("refused")

// Limits bound what Scan reads. Zero fields take the defaults.
type Limits struct {
	// MaxBytes is the most bytes of files (default 64 GiB).
	MaxBytes int64
	// MaxFiles is the most files (default 1,000,000).
	MaxFiles int
	// MaxMetadata is the largest Triton metadata file parsed (default 16 MiB).
	MaxMetadata int64
}

func (l Limits) withDefaults() Limits {
	if l.MaxBytes <= 0 {
		l.MaxBytes = 64 << 30
	}
	if l.MaxFiles <= 0 {
		l.MaxFiles = 1_000_000
	}
	if l.MaxMetadata <= 0 {
		l.MaxMetadata = 16 << 20
	}
	return l
}

// File is one regular file of a cache directory.
type File struct {
	// Path is slash-separated, relative to the cache directory.
	Path string
	Size int64
	Exec bool // any execute bit (Triton's launcher .so files)
}

// Cache is a scanned cache directory: what Image packs.
type Cache struct {
	Kind string
	// Root is the directory scanned.
	Root  string
	Files []File
	// Dirs are the directories under Root, slash-separated, sorted.
	Dirs  []string
	Bytes int64
	// Entries are the kernels whose Triton metadata was found (every
	// <kernel>.json with a "hash"), by path.
	Entries []mcv.Entry
	Targets []mcv.Target
	// VLLM is the vLLM manifest's entries (KindVLLM only).
	VLLM []mcv.VLLMEntry
}

// Options of Scan.
type Options struct {
	// Kind forces the kind ("" detects it: torch_compile_cache/ is vLLM,
	// fxgraph/ or aotautograd/ is Inductor, else Triton).
	Kind   string
	Limits Limits
}

// Scan reads the cache directory dir. It refuses (ErrRefused) a symbolic
// link, a device, FIFO or socket anywhere under it, a file or directory
// it cannot read, and a tree beyond the limits; it fails on a Triton
// metadata file whose target it cannot read. Files Triton is still
// writing (tmp.pid_* directories) are left out.
func Scan(dir string, o Options) (*Cache, error) {
	lim := o.Limits.withDefaults()
	root, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	fi, err := os.Lstat(root)
	if err != nil {
		return nil, fmt.Errorf("cache directory: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("%s: %w: not a directory; give the directory Triton, vLLM or torch.compile wrote (TRITON_CACHE_DIR, VLLM_CACHE_ROOT, TORCHINDUCTOR_CACHE_DIR)", dir, ErrRefused)
	}
	c := &Cache{Root: root, Kind: o.Kind}
	if c.Kind == "" {
		c.Kind = detect(root)
	}
	if _, ok := mcv.DirNamed(c.Kind); !ok {
		return nil, fmt.Errorf("kind %q: use triton, vllm or torchinductor", c.Kind)
	}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("%w: %v", ErrRefused, err)
		}
		rel, _ := filepath.Rel(root, p)
		rel = filepath.ToSlash(rel)
		if rel == "." {
			return nil
		}
		t := d.Type()
		switch {
		case t&fs.ModeSymlink != 0:
			return fmt.Errorf("%s: %w: a symbolic link; an image carries regular files only: copy what it points to into the cache, or remove it", rel, ErrRefused)
		case d.IsDir():
			if strings.HasPrefix(d.Name(), "tmp.pid_") {
				return fs.SkipDir // a write Triton has not finished
			}
			c.Dirs = append(c.Dirs, rel)
			return nil
		case !t.IsRegular():
			return fmt.Errorf("%s: %w: a %s, not a regular file", rel, ErrRefused, kindName(t))
		}
		info, err := d.Info()
		if err != nil {
			return fmt.Errorf("%s: %w: %v", rel, ErrRefused, err)
		}
		c.Bytes += info.Size()
		if len(c.Files) >= lim.MaxFiles || c.Bytes > lim.MaxBytes {
			return fmt.Errorf("%w: more than %d files or %d bytes under %s", ErrRefused, lim.MaxFiles, lim.MaxBytes, dir)
		}
		c.Files = append(c.Files, File{Path: rel, Size: info.Size(), Exec: info.Mode().Perm()&0o111 != 0})
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(c.Files) == 0 {
		return nil, fmt.Errorf("%s: %w: no files: is it the directory the framework wrote to?", dir, ErrRefused)
	}
	sort.Slice(c.Files, func(i, j int) bool { return c.Files[i].Path < c.Files[j].Path })
	sort.Strings(c.Dirs)
	if err := c.readEntries(lim); err != nil {
		return nil, err
	}
	return c, nil
}

// detect tells the kind of a cache directory by what the framework wrote
// at its top (MCV's DetectVLLMCache and DetectTritonCache, with
// Inductor's own cache told apart).
func detect(root string) string {
	isDir := func(n string) bool { fi, err := os.Lstat(filepath.Join(root, n)); return err == nil && fi.IsDir() }
	switch {
	case isDir("torch_compile_cache"):
		return KindVLLM
	case isDir("fxgraph") || isDir("aotautograd"):
		return KindInductor
	}
	return KindTriton
}

func kindName(m fs.FileMode) string {
	switch {
	case m&fs.ModeDevice != 0:
		return "device file"
	case m&fs.ModeNamedPipe != 0:
		return "FIFO"
	case m&fs.ModeSocket != 0:
		return "socket"
	}
	return "special file"
}

// readEntries parses every Triton metadata file (a .json with a "hash"
// beside a kernel's binary; __grp__ files list a kernel's files and are
// not one) into Entries; for vLLM, per torch_compile_cache/<hash>.
func (c *Cache) readEntries(lim Limits) error {
	byDir := map[string][]mcv.Entry{}
	for _, f := range c.Files {
		base := pathBase(f.Path)
		if !strings.HasSuffix(base, ".json") || strings.HasPrefix(base, "__grp__") || f.Size > lim.MaxMetadata {
			continue
		}
		r, err := openBeneath(c.Root, f.Path)
		if err != nil {
			return fmt.Errorf("%s: %w", f.Path, err)
		}
		b, err := io.ReadAll(io.LimitReader(r, lim.MaxMetadata))
		r.Close()
		if err != nil {
			return err
		}
		e, t, ok, err := mcv.TritonMetadata(b)
		if err != nil {
			return fmt.Errorf("%s: %w", f.Path, err)
		}
		if ok {
			c.Entries = append(c.Entries, e)
			c.Targets = append(c.Targets, t)
			if h, ok := vllmHash(f.Path); ok {
				byDir[h] = append(byDir[h], e)
			}
		}
	}
	if c.Kind != KindVLLM {
		return nil
	}
	hashes, _ := os.ReadDir(filepath.Join(c.Root, "torch_compile_cache"))
	for _, h := range hashes {
		if !h.IsDir() {
			continue
		}
		ve := mcv.VLLMEntry{VllmHash: h.Name(), CacheFormat: "triton", Triton: byDir[h.Name()]}
		if len(ve.Triton) == 0 {
			ve.CacheFormat = "binary"
			ve.Binary = binaryEntries(filepath.Join(c.Root, "torch_compile_cache", h.Name()))
		}
		c.VLLM = append(c.VLLM, ve)
	}
	return nil
}

// vllmHash is the torch_compile_cache/<hash> a path lies under.
func vllmHash(p string) (string, bool) {
	rest, ok := strings.CutPrefix(p, "torch_compile_cache/")
	if !ok {
		return "", false
	}
	h, _, ok := strings.Cut(rest, "/")
	return h, ok
}

var (
	rankDir     = regexp.MustCompile(`^rank_\d+_\d+$`)
	artifactPat = regexp.MustCompile(`^artifact_compile_range_`)
)

// binaryEntries reads a vLLM binary cache's rank_X_Y/<prefix> directories
// (MCV's detectBinaryCache): their cache_key_factors.json and artifacts.
func binaryEntries(hashDir string) []mcv.BinaryEntry {
	var out []mcv.BinaryEntry
	ranks, _ := os.ReadDir(hashDir)
	for _, r := range ranks {
		if !r.IsDir() || !rankDir.MatchString(r.Name()) {
			continue
		}
		prefixes, _ := os.ReadDir(filepath.Join(hashDir, r.Name()))
		for _, p := range prefixes {
			dir := filepath.Join(hashDir, r.Name(), p.Name())
			f, err := os.Open(filepath.Join(dir, "cache_key_factors.json"))
			if !p.IsDir() || err != nil {
				continue
			}
			var kf struct {
				CodeHash     string         `json:"code_hash"`
				CompilerHash string         `json:"compiler_hash"`
				ConfigHash   string         `json:"config_hash"`
				Env          map[string]any `json:"env"`
			}
			err = json.NewDecoder(io.LimitReader(f, 16<<20)).Decode(&kf)
			f.Close()
			if err != nil {
				continue
			}
			be := mcv.BinaryEntry{Rank: r.Name(), Prefix: p.Name(), CodeHash: kf.CodeHash, ConfigHash: kf.ConfigHash,
				CompilerHash: kf.CompilerHash, Env: kf.Env, CacheSaveFormat: "binary"}
			if d, ok := kf.Env["VLLM_TARGET_DEVICE"].(string); ok {
				be.TargetDevice = d
			}
			arts, _ := os.ReadDir(dir)
			for _, a := range arts {
				if artifactPat.MatchString(a.Name()) {
					be.ArtifactNames = append(be.ArtifactNames, a.Name())
					if len(be.ArtifactNames) == 1 && a.IsDir() { // the first artifact tells the format
						be.CacheSaveFormat = "unpacked"
					}
				}
			}
			be.ArtifactCount = len(be.ArtifactNames)
			if be.ArtifactCount > 0 {
				out = append(out, be)
			}
		}
	}
	return out
}

func pathBase(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[i+1:]
	}
	return p
}

// CheckCompiledOn checks that every kernel of c was compiled for one of
// the GPUs (backend, arch and warp size equal): what a pod compiled on
// this node, before it is captured. The error names each other target.
func CheckCompiledOn(c *Cache, gpus []mcv.Target) error {
	var bad []string
	seen := map[string]bool{}
	for _, t := range c.Targets {
		ok := false
		for _, g := range gpus {
			if g.Backend == t.Backend && g.Arch == t.Arch && g.WarpSize == t.WarpSize {
				ok = true
				break
			}
		}
		if s := t.String(); !ok && !seen[s] {
			seen[s] = true
			bad = append(bad, s)
		}
	}
	if len(gpus) == 0 {
		return fmt.Errorf("%w: this node has no GPU, so nothing under %s was compiled for one here", ErrRefused, c.Root)
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: %s holds kernels for %s, which no GPU of this node is: not what this node compiled", ErrRefused, c.Root, strings.Join(bad, ", "))
	}
	return nil
}
