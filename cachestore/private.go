package cachestore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Private trees. An artifact its owner keeps private (VersionSpec.Private
// at its first commit, SetPrivate after) has its directory under
// private/<kind dir>/<name>/ instead of <kind dir>/<name>/. So every tree
// under models/ and kernels/ is one the node serves publicly, and a check
// of a path alone (the admission policy that admits a node's local PV
// only under models/: deploy/daemonset/base/admission.yaml) keeps every
// private tree out of a PV's reach, whether or not anything off the node
// knows that the artifact is private (a models.d artifact, a pull with
// the daemon's own credentials).
//
// The disk is the record: an artifact is private while its directory is
// under private/. Moving it is one rename of the artifact's directory
// (its versions and its current link, which is relative, go together), so
// it is in one place or the other, never half in each; a pod's bind mount
// of one of its trees follows the rename. private/ and its kind dirs are
// 0711: a local user may pass through to a tree its mode opens to them
// (a local group's 0750), but cannot list which artifacts are there.

const dirPrivate = "private"

// privateMode is the mode of private/ and its kind dirs (privateDirs,
// relative to the root), which Open makes.
const privateMode = 0o711

var privateDirs = []string{dirPrivate, dirPrivate + "/" + kindDirs[KindModel], dirPrivate + "/" + kindDirs[KindKernelCache]}

// kindBase is where kind's artifact directories are: public or private.
func (s *Store) kindBase(kind string, private bool) (string, error) {
	base, err := s.kindDir(kind)
	if err != nil || !private {
		return base, err
	}
	return filepath.Join(s.root, dirPrivate, filepath.Base(base)), nil
}

// treeBase is the directory that holds name's artifact directory: under
// private/ while it is there, else the kind's public one (where a new
// public artifact goes).
func (s *Store) treeBase(kind, name string) (string, error) {
	priv, err := s.kindBase(kind, true)
	if err != nil {
		return "", err
	}
	if fi, err := os.Lstat(filepath.Join(priv, name)); err == nil && fi.IsDir() {
		return priv, nil
	}
	return s.kindBase(kind, false)
}

// IsPrivate says whether name's trees are under private/ (kind "" is a
// model).
func (s *Store) IsPrivate(kind, name string) bool {
	priv, _ := s.kindBase(kind, true)
	base, _ := s.treeBase(kind, name)
	return priv != "" && base == priv
}

// SetPrivate moves name's directory (all its versions' trees) under
// private/ or back to its kind's public directory; a no-op when it is
// there already or the store holds no tree of name. The caller closes or
// opens the trees' modes itself (a private tree is 0700 or 0750 whichever
// directory holds it).
func (s *Store) SetPrivate(kind, name string, private bool) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.place(kind, name, private)
}

// place moves name's directory to the side private says. Called with s.mu
// held.
func (s *Store) place(kind, name string, private bool) error {
	from, err := s.kindBase(kind, !private)
	if err != nil {
		return err
	}
	to, _ := s.kindBase(kind, private)
	src, dst := filepath.Join(from, name), filepath.Join(to, name)
	if fi, err := os.Lstat(src); err != nil || !fi.IsDir() {
		return nil
	}
	if _, err := os.Lstat(dst); err == nil {
		return fmt.Errorf("artifact %s: both %s and %s exist; run modelctl fsck and remove the one the index does not know", name, src, dst)
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := os.Rename(src, dst); err != nil {
		return fmt.Errorf("artifact %s: moving its trees to %s: %w", name, to, err)
	}
	syncDir(from)
	if err := syncDir(to); err != nil {
		s.log.Warn("fsync after moving an artifact's trees", "dir", to, "err", err)
	}
	s.hit("private.after-rename")
	return nil
}

// artifactBases are the directories that hold artifact directories, each
// with its kind: public and private.
func (s *Store) artifactBases() []artifactBase {
	var out []artifactBase
	for _, kind := range []string{KindModel, KindKernelCache} {
		for _, private := range []bool{false, true} {
			base, _ := s.kindBase(kind, private)
			out = append(out, artifactBase{kind: kind, dir: base})
		}
	}
	return out
}

type artifactBase struct {
	kind string
	dir  string
}

// rel is base's path from the store root ("models", "private/kernels").
func (b artifactBase) rel(root string) string {
	r, _ := filepath.Rel(root, b.dir)
	return filepath.ToSlash(r)
}

// InTrees maps a path relative to the store root to where it is among the
// artifact trees: the segments after the kind directory, public or
// private ([] for models/ itself, [name] for an artifact's directory,
// [name, rev, …] for a version's tree or a file in it); ok is false for
// paths outside them (blobs/, holds/, hf/, the root or private/ itself).
func InTrees(rel string) (rest []string, ok bool) {
	rel = strings.Trim(filepath.ToSlash(rel), "/")
	if r, ok := strings.CutPrefix(rel, dirPrivate+"/"); ok {
		rel = r
	}
	kind, rest0, _ := strings.Cut(rel, "/")
	if kind != kindDirs[KindModel] && kind != kindDirs[KindKernelCache] {
		return nil, false
	}
	if rest0 == "" {
		return []string{}, true
	}
	return strings.Split(rest0, "/"), true
}
