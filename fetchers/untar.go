package fetchers

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
)

// TarLimits bounds what one archive may make the daemon do.
type TarLimits struct {
	MaxEntries   int   // default 100,000
	MaxEntrySize int64 // default 1 TiB
	MaxTotal     int64 // default 4 TiB
	// Subtree, when set ("models"), takes only entries under it, with the
	// prefix removed (modelcar images carry the model under /models).
	Subtree string
	// Exists, when set, tells whether a path is a regular file of a lower
	// layer, which links in this archive may point at too.
	Exists func(p string) bool
}

// ErrHostileArchive marks an archive entry refused by Untar.
var ErrHostileArchive = errors.New("refused archive entry")

// TarEntry is one regular file of an archive as Untar hands it over.
// Link is set instead of a body when the entry is a hard link or a
// symlink to an earlier regular file of the same archive: the caller
// reuses that file's content.
type TarEntry struct {
	Path string
	Size int64
	Mode uint32
	Link string
}

// Untar reads a tar stream and calls file for every regular file (with
// its body) and every link to one (Link set, no body), and whiteout for
// OCI whiteouts (".wh.<name>" deletes a path, ".wh..wh..opq" empties a
// directory; opaque is then true). It is the one place archives are
// trusted with paths: absolute paths, "..", links that leave the archive
// or point at nothing earlier, device nodes, fifos, sockets, setuid/setgid
// bits, and archives past the limits are refused with the entry named.
func Untar(r io.Reader, lim TarLimits, file func(e TarEntry, body io.Reader) error, whiteout func(p string, opaque bool) error) error {
	lim = lim.withDefaults()
	sub := strings.Trim(lim.Subtree, "/")
	regular := map[string]bool{}
	tr := tar.NewReader(r)
	var total int64
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("archive entry %d: %w", n, err)
		}
		bad := func(why string) error {
			return fmt.Errorf("%w %q: %s", ErrHostileArchive, hdr.Name, why)
		}
		if n >= lim.MaxEntries {
			return bad(fmt.Sprintf("more than %d entries", lim.MaxEntries))
		}
		if hdr.Typeflag == tar.TypeDir || hdr.Typeflag == tar.TypeXGlobalHeader {
			continue // directories follow from the files; nothing is created for them
		}
		p, err := cleanArchivePath(hdr.Name)
		if err != nil {
			return bad(err.Error())
		}
		if sub != "" {
			if p != sub && !strings.HasPrefix(p, sub+"/") {
				continue // outside the subtree: not ours
			}
			p = strings.TrimPrefix(strings.TrimPrefix(p, sub), "/")
			if p == "" {
				continue
			}
		}
		if hdr.Mode&(0o4000|0o2000) != 0 && hdr.Typeflag != tar.TypeDir {
			return bad("setuid or setgid bit")
		}
		base := path.Base(p)
		if strings.HasPrefix(base, ".wh.") {
			dir := path.Dir(p)
			if base == ".wh..wh..opq" {
				if err := whiteout(dir, true); err != nil {
					return err
				}
				continue
			}
			if err := whiteout(path.Join(dir, strings.TrimPrefix(base, ".wh.")), false); err != nil {
				return err
			}
			continue
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			continue
		case tar.TypeReg, tar.TypeRegA:
			if hdr.Size < 0 || hdr.Size > lim.MaxEntrySize {
				return bad(fmt.Sprintf("size %d beyond the limit %d", hdr.Size, lim.MaxEntrySize))
			}
			if total += hdr.Size; total > lim.MaxTotal {
				return bad(fmt.Sprintf("archive larger than %d bytes", lim.MaxTotal))
			}
			if err := file(TarEntry{Path: p, Size: hdr.Size, Mode: uint32(hdr.Mode) & 0o777}, io.LimitReader(tr, hdr.Size)); err != nil {
				return err
			}
			regular[p] = true
		case tar.TypeLink, tar.TypeSymlink:
			t, why := linkTarget(hdr, sub, lim.Exists, regular)
			if why != "" {
				return bad(why)
			}
			if err := file(TarEntry{Path: p, Mode: 0o644, Link: t}, nil); err != nil {
				return err
			}
			regular[p] = true
		case tar.TypeChar, tar.TypeBlock:
			return bad("device node")
		case tar.TypeFifo:
			return bad("fifo")
		case tar.TypeXGlobalHeader:
			continue
		default:
			return bad(fmt.Sprintf("entry type %q", hdr.Typeflag))
		}
	}
}

// withDefaults is lim with the limits left zero set to their defaults.
func (lim TarLimits) withDefaults() TarLimits {
	if lim.MaxEntries == 0 {
		lim.MaxEntries = 100000
	}
	if lim.MaxEntrySize == 0 {
		lim.MaxEntrySize = 1 << 40
	}
	if lim.MaxTotal == 0 {
		lim.MaxTotal = 4 << 40
	}
	return lim
}

// linkTarget is the path (within sub, with sub's prefix removed) of the
// file a hard link or symlink entry points at, which must be an earlier
// regular file of the archive or one exists says a lower layer has; why
// says what is wrong with the link otherwise: a symlink to an absolute
// path, or a target that leaves the archive or the subtree or is no
// such file.
func linkTarget(hdr *tar.Header, sub string, exists func(string) bool, regular map[string]bool) (target, why string) {
	target = hdr.Linkname
	if hdr.Typeflag == tar.TypeSymlink && !strings.HasPrefix(target, "/") {
		target = path.Join(path.Dir(hdr.Name), target) // relative to the link's directory
	}
	if strings.HasPrefix(target, "/") && hdr.Typeflag == tar.TypeSymlink {
		return "", fmt.Sprintf("symlink to the absolute path %q", hdr.Linkname)
	}
	t, err := cleanArchivePath(target)
	if err != nil {
		return "", fmt.Sprintf("link to %q leaves the archive", hdr.Linkname)
	}
	if sub != "" {
		if !strings.HasPrefix(t, sub+"/") {
			return "", fmt.Sprintf("link to %q leaves the %s tree", hdr.Linkname, sub)
		}
		t = strings.TrimPrefix(t, sub+"/")
	}
	if !regular[t] && (exists == nil || !exists(t)) {
		return "", fmt.Sprintf("link to %q, which is not an earlier regular file of the archive", hdr.Linkname)
	}
	return t, ""
}

// cleanArchivePath turns "./a/b" into "a/b" and refuses absolute paths,
// "..", empty names and NUL.
func cleanArchivePath(name string) (string, error) {
	if strings.ContainsRune(name, 0) || strings.ContainsRune(name, '\\') {
		return "", errors.New("NUL or backslash in the name")
	}
	if strings.HasPrefix(name, "/") {
		return "", errors.New("absolute path")
	}
	for _, seg := range strings.Split(name, "/") {
		if seg == ".." {
			return "", errors.New(`".." in the path`)
		}
	}
	p := path.Clean(name)
	if p == "." || p == "" {
		return "", errors.New("empty name")
	}
	return strings.TrimPrefix(p, "./"), nil
}
