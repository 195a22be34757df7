package file

import (
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/modelcache/modelcache/fetchers"
)

// A Hugging Face hub cache (huggingface_hub, the JS client) keeps each
// file once under <repo>/blobs/ and lists a revision as symlinks:
//
//	models--org--name/blobs/<etag>
//	models--org--name/snapshots/<commit>/config.json -> ../../blobs/<etag>
//	models--org--name/snapshots/<commit>/sub/w.bin   -> ../../../blobs/<etag>
//
// A snapshot's links all lead out of the snapshot. A file:// source that
// is a snapshot (or a directory or file in one) follows a link that leads
// to a file directly in its repository's blobs/ and commits that file's
// bytes under the link's path; any other link leading out of the source
// is still refused.

// hfBlobs is the blobs/ directory of the repository a snapshot source
// lies in, open beneath nothing but its own path.
type hfBlobs struct {
	path string
	fd   int // O_PATH; the caller of openHFBlobs closes it
	id   fileID
}

// hfRepoKinds are the prefixes of a repository's directory in a hub cache.
var hfRepoKinds = []string{"models--", "datasets--", "spaces--"}

// hfRepo returns the repository directory of a path inside a snapshot of
// a hub cache (<repo>/snapshots/<commit>/…), or "".
func hfRepo(p string) string {
	comps := strings.Split(p, "/")
	for i := len(comps) - 3; i >= 0; i-- {
		if comps[i+1] != "snapshots" || comps[i+2] == "" {
			continue
		}
		for _, k := range hfRepoKinds {
			if strings.HasPrefix(comps[i], k) && len(comps[i]) > len(k) {
				return strings.Join(comps[:i+1], "/")
			}
		}
	}
	return ""
}

// openHFBlobs opens, as the caller's thread reads, the blobs/ directory of
// the hub cache repository the source path p lies in: nil when p is not in
// a snapshot or the repository has no blobs/ directory; an error when it
// has one that the node's roots or denied directories keep file:// from.
func (f *Fetcher) openHFBlobs(uri, p string, denied map[fileID]string) (*hfBlobs, error) {
	repo := hfRepo(p)
	if repo == "" {
		return nil, nil
	}
	bp := filepath.Join(repo, "blobs")
	fd, err := openPath(bp)
	if err != nil {
		return nil, nil // links into it are refused as leading out of the tree
	}
	if err := f.checkRoots(uri, bp); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%w (the hub cache snapshot's files are links into %s, which file:// must be allowed to read too: add the cache's directory to --file-roots)", err, bp)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, explain(uri, bp, err)
	}
	if d, ok := denied[idOf(&st)]; ok {
		unix.Close(fd)
		return nil, deniedError(uri, bp, d)
	}
	if err := deniedAncestor(uri, bp, denied); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &hfBlobs{path: bp, fd: fd, id: idOf(&st)}, nil
}

// close releases b's descriptor; b may be nil.
func (b *hfBlobs) close() {
	if b != nil {
		unix.Close(b.fd)
	}
}

// blob follows the symlink name in the directory dirfd, which lies at the
// absolute path dir (reached through no symlink), when it names a file
// directly in b: it returns that file's name in b and its stat. ok is
// false when the link leads anywhere else. The target is read only to
// learn the blob's name; the blob is opened beneath b's descriptor
// through no symlink, so a link rewritten meanwhile can lead at most to
// another file of the same blobs/ directory.
func (b *hfBlobs) blob(dirfd int, dir, name string) (blobName string, st unix.Stat_t, ok bool, err error) {
	if b == nil {
		return "", st, false, nil
	}
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dirfd, name, buf)
	if err != nil {
		return "", st, false, err
	}
	target := string(buf[:n])
	if !filepath.IsAbs(target) {
		target = filepath.Join(dir, target)
	}
	target = filepath.Clean(target)
	if filepath.Dir(target) != b.path {
		return "", st, false, nil
	}
	blobName = filepath.Base(target)
	fd, err := openat2(b.fd, blobName, unix.O_PATH|unix.O_CLOEXEC, unix.RESOLVE_BENEATH|unix.RESOLVE_NO_SYMLINKS|unix.RESOLVE_NO_MAGICLINKS)
	if err != nil {
		return "", st, false, err
	}
	err = unix.Fstat(fd, &st)
	unix.Close(fd)
	if err != nil {
		return "", st, false, err
	}
	return blobName, st, true, nil
}

// outsideError: a symlink in the source leads out of it, and not to a
// file of the hub cache's blobs/ (where the source is a snapshot).
func outsideError(uri, link string, b *hfBlobs) error {
	where := "copy the file into the tree or point the source at a directory that contains it"
	if b != nil {
		where = fmt.Sprintf("in a hub cache snapshot only links to files directly in %s are followed", b.path)
	}
	return fmt.Errorf("source %q: %w: symlink %s points outside the source tree; %s", uri, fetchers.ErrBadSource, short(link), where)
}
