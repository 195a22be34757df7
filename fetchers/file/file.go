// Package file fetches from file:///abs/path: one file, or a directory
// tree on a local or network filesystem (a model already on NFS or a PVC
// is used without a download). Every open goes through an os.Root at the
// source directory, so a symlink that leads outside the tree is refused
// at resolve and again at open, whatever changed in between.
package file

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/modelcache/modelcache/fetchers"
)

// Fetcher implements fetchers.Fetcher for file:// URIs. The zero value works.
type Fetcher struct{}

// New returns a file fetcher.
func New() *Fetcher { return &Fetcher{} }

// ParseURI returns the absolute local path of a file:// URI.
func ParseURI(uri string) (string, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", fmt.Errorf("source %q: %w: %v", uri, fetchers.ErrBadSource, err)
	}
	if u.Scheme != "file" {
		return "", fmt.Errorf("source %q: %w: not a file:// URI", uri, fetchers.ErrBadSource)
	}
	if u.Host != "" && u.Host != "localhost" {
		return "", fmt.Errorf("source %q: %w: host %q; write file:///abs/path (three slashes)", uri, fetchers.ErrBadSource, u.Host)
	}
	p := u.Path
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("source %q: %w: the path must be absolute: file:///abs/path", uri, fetchers.ErrBadSource)
	}
	for _, seg := range strings.Split(p, "/") {
		if seg == ".." {
			return "", fmt.Errorf("source %q: %w: '..' in the path; give the real absolute path", uri, fetchers.ErrBadSource)
		}
	}
	return filepath.Clean(p), nil
}

// locator is dir + "\x00" + relative path.
func locator(dir, rel string) string { return dir + "\x00" + rel }

func splitLocator(l string) (string, string, error) {
	dir, rel, ok := strings.Cut(l, "\x00")
	if !ok {
		return "", "", fmt.Errorf("file: bad locator %q", l)
	}
	return dir, rel, nil
}

// Resolve lists the file or the tree. The revision is left empty: the
// store names it by the manifest digest, so changed content is a new revision.
func (f *Fetcher) Resolve(ctx context.Context, src fetchers.Source) (*fetchers.Resolved, error) {
	p, err := ParseURI(src.URI)
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		return nil, fetchers.Permanent(explain(src.URI, p, err))
	}
	res := &fetchers.Resolved{URI: src.URI}
	switch {
	case fi.Mode().IsRegular():
		dir, base := filepath.Split(p)
		res.Files = []fetchers.File{{Path: base, Size: fi.Size(), Mode: uint32(fi.Mode().Perm()), Locator: locator(dir, base)}}
		return res, nil
	case !fi.IsDir():
		return nil, fetchers.Permanent(fmt.Errorf("source %q: %w: %s is a %s, not a regular file or directory", src.URI, fetchers.ErrBadSource, p, fi.Mode().Type()))
	}
	root, err := os.OpenRoot(p)
	if err != nil {
		return nil, fetchers.Permanent(explain(src.URI, p, err))
	}
	defer root.Close()
	err = fs.WalkDir(root.FS(), ".", func(rel string, d fs.DirEntry, err error) error {
		if err != nil {
			return explain(src.URI, filepath.Join(p, rel), err)
		}
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		if rel == "." || d.IsDir() {
			return nil
		}
		full := filepath.Join(p, rel)
		info, err := d.Info()
		if err != nil {
			return explain(src.URI, full, err)
		}
		if info.Mode()&fs.ModeSymlink != 0 {
			// Follow it only inside the tree: os.Root refuses an escape.
			target, _ := os.Readlink(full)
			info, err = root.Stat(rel)
			if err != nil {
				if strings.Contains(err.Error(), "escapes") || strings.Contains(err.Error(), "path escapes") {
					return fmt.Errorf("source %q: %w: symlink %s points outside the source tree (to %s); copy the file into the tree or point the source at a directory that contains it", src.URI, fetchers.ErrBadSource, rel, target)
				}
				return explain(src.URI, full, err)
			}
			if info.IsDir() {
				return fmt.Errorf("source %q: %w: symlink %s points to a directory (%s); directory symlinks are not followed", src.URI, fetchers.ErrBadSource, rel, target)
			}
		}
		if !info.Mode().IsRegular() {
			return fmt.Errorf("source %q: %w: %s is a %s, not a regular file", src.URI, fetchers.ErrBadSource, rel, info.Mode().Type())
		}
		slash := filepath.ToSlash(rel)
		res.Files = append(res.Files, fetchers.File{Path: slash, Size: info.Size(), Mode: uint32(info.Mode().Perm()), Locator: locator(p, slash)})
		return nil
	})
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	if len(res.Files) == 0 {
		return nil, fetchers.Permanent(fmt.Errorf("source %q: %w: the directory holds no files", src.URI, fetchers.ErrNotFound))
	}
	return res, nil
}

// Open opens the file through an os.Root at its source directory and
// seeks to offset.
func (f *Fetcher) Open(ctx context.Context, file fetchers.File, offset int64) (io.ReadCloser, error) {
	dir, rel, err := splitLocator(file.Locator)
	if err != nil {
		return nil, fetchers.Permanent(err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fetchers.Permanent(explain("file://"+dir, dir, err))
	}
	defer root.Close()
	fh, err := root.Open(path.Clean(rel))
	if err != nil {
		return nil, fetchers.Permanent(explain("file://"+dir, filepath.Join(dir, rel), err))
	}
	if fi, err := fh.Stat(); err != nil || !fi.Mode().IsRegular() {
		fh.Close()
		return nil, fetchers.Permanent(fmt.Errorf("%s: %w: no longer a regular file", filepath.Join(dir, rel), fetchers.ErrBadSource))
	}
	if offset > 0 {
		if _, err := fh.Seek(offset, io.SeekStart); err != nil {
			fh.Close()
			return nil, err
		}
	}
	return fh, nil
}

func explain(uri, p string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("source %q: %w: %s does not exist (is the filesystem mounted on this node?)", uri, fetchers.ErrNotFound, p)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("source %q: %w: %s is not readable by the daemon; grant read access to the modelcache user", uri, fetchers.ErrUnauthorized, p)
	case strings.Contains(err.Error(), "escapes"):
		return fmt.Errorf("source %q: %w: %s leads outside the source tree", uri, fetchers.ErrBadSource, p)
	}
	return fmt.Errorf("source %q: %s: %w", uri, p, err)
}
