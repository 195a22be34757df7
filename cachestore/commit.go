package cachestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/google/renameio/v2"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/sys/unix"
)

// VersionSpec is what a pull hands to CommitVersion.
type VersionSpec struct {
	Name     string
	Kind     string // KindModel (default) or KindKernelCache
	Source   string
	Revision string // immutable revision; empty: the manifest digest's hex
	Manifest Manifest
	// ExpectedDigest, when set, must equal the manifest digest or nothing
	// is committed (the "folder checksum" a user demanded).
	ExpectedDigest string
	Pin            bool
	// Spec is an opaque fingerprint of what produced this version (the
	// daemon's desire), recorded so a changed desire can be told apart.
	Spec string
	// HFRepo ("org/name") and HFRef (the revision asked for) put the
	// version in the HF cache view too; Revision must then be the commit.
	HFRepo string
	HFRef  string
	// Annotations is what the caller checked of the version (a kernel
	// cache's signature and compatibility), kept with it as given.
	Annotations json.RawMessage
	// Stage commits the version (verified, Ready, its tree in place)
	// without moving current: a rollout's prefetch. Activate moves
	// current to it later. An artifact with no current yet gets none.
	Stage bool
	// Private makes the version's tree directory 0700 from its creation:
	// only root (the daemon) reaches its files by a path; a pod reads it
	// through a tree of its own volume. Not recorded: the caller keeps
	// the modes of its trees (a tree that repair rebuilds is 0700 until
	// the caller opens it).
	Private bool
}

// check validates the spec: its name, its manifest (a sorted copy is
// returned with its digest) against ExpectedDigest, and the revision
// (the manifest digest's hex when none is given).
func (spec VersionSpec) check() (m Manifest, md, rev string, err error) {
	if err := ValidateName(spec.Name); err != nil {
		return nil, "", "", err
	}
	m = append(Manifest(nil), spec.Manifest...)
	if err := m.Validate(); err != nil {
		return nil, "", "", fmt.Errorf("artifact %s: %w", spec.Name, err)
	}
	md = m.Digest()
	if spec.ExpectedDigest != "" {
		want, err := NormalizeDigest(spec.ExpectedDigest)
		if err != nil {
			return nil, "", "", fmt.Errorf("artifact %s: expected digest: %w", spec.Name, err)
		}
		if want != md {
			return nil, "", "", fmt.Errorf("artifact %s: %w: manifest digest is %s, expected %s", spec.Name, ErrDigestMismatch, md, want)
		}
	}
	rev = spec.Revision
	if rev == "" {
		rev = md[len(DigestPrefix):]
	}
	if err := ValidateName(rev); err != nil {
		return nil, "", "", fmt.Errorf("artifact %s: revision: %w", spec.Name, err)
	}
	return m, md, rev, nil
}

// CommitVersion makes an artifact version visible: it checks the manifest
// and every blob, builds the tree of hardlinks under tmp/, renames it to
// <kind dir>/<name>/<revision>, records the version Ready and current in
// one transaction, and swaps the current symlink (spec.Stage: records it
// Ready and leaves current alone). Re-committing a revision rebuilds its
// tree (repair), unless it is Ready, its tree is in place and only
// current is to move. On any error before the rename nothing is visible.
func (s *Store) CommitVersion(ctx context.Context, spec VersionSpec) (*Version, error) {
	m, md, rev, err := spec.check()
	if err != nil {
		return nil, err
	}
	if _, err := s.kindDir(spec.Kind); err != nil {
		return nil, err
	}
	if spec.Kind == "" {
		spec.Kind = KindModel
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range m {
		p, _ := s.BlobPath(e.Digest)
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("artifact %s: path %s: blob %s: %w", spec.Name, e.Path, e.Digest, ErrNotFound)
		}
		if fi.Size() != e.Size {
			return nil, fmt.Errorf("artifact %s: path %s: blob %s: %w: %d bytes on disk, manifest says %d", spec.Name, e.Path, e.Digest, ErrSizeMismatch, fi.Size(), e.Size)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	mode := os.FileMode(0o755)
	if spec.Private {
		mode = 0o700
		// Its artifact's other trees go under private/ first (private.go;
		// only SetPrivate brings an artifact back out).
		if err := s.place(spec.Kind, spec.Name, true); err != nil {
			return nil, err
		}
	}
	base, err := s.treeBase(spec.Kind, spec.Name)
	if err != nil {
		return nil, err
	}
	if spec.Private {
		base, _ = s.kindBase(spec.Kind, true)
	}
	if err := s.materialize(base, spec.Name, rev, m, mode); err != nil {
		return nil, fmt.Errorf("artifact %s@%s: %w", spec.Name, rev, err)
	}
	now := s.now().UTC()
	v := &Version{
		Name: spec.Name, Kind: spec.Kind, Source: spec.Source, Revision: rev,
		Manifest: m, ManifestDigest: md, State: StateReady, Pinned: spec.Pin,
		Created: now, LastUsed: now, Bytes: m.Bytes(), Spec: spec.Spec,
		HFRepo: spec.HFRepo, HFRef: spec.HFRef, Metadata: readMetadata(s, m), Annotations: spec.Annotations,
	}
	err = s.db.Update(func(tx *bolt.Tx) error {
		ab, err := tx.Bucket(bucketArtifacts).CreateBucketIfNotExists([]byte(spec.Name))
		if err != nil {
			return err
		}
		vb, err := ab.CreateBucketIfNotExists(bucketVersions)
		if err != nil {
			return err
		}
		if old, err := getSummary(vb, rev); err != nil {
			return err
		} else if old != nil {
			v.Created = old.Created
			v.Pinned = v.Pinned || old.Pinned
		}
		if err := putVersion(ab, v); err != nil {
			return err
		}
		if spec.Stage {
			return nil
		}
		return ab.Put(keyCurrent, []byte(rev))
	})
	if err != nil {
		// The tree has no record: take it down again so nothing unrecorded is visible.
		removeTree(s.root, s.log, filepath.Join(base, spec.Name, rev))
		return nil, fmt.Errorf("artifact %s@%s: index: %w", spec.Name, rev, err)
	}
	s.hit("commit.after-index")
	if !spec.Stage {
		if err := s.setCurrentLink(filepath.Join(base, spec.Name), rev); err != nil {
			s.log.Warn("swap current link; startup repair will fix it", "artifact", spec.Name, "err", err)
		}
	}
	if spec.HFRepo != "" {
		if err := s.syncHFView(spec.HFRepo); err != nil {
			s.log.Warn("hf cache view; startup repair will rebuild it", "repo", spec.HFRepo, "err", err)
		}
	}
	return v, nil
}

// Activate makes a Ready version current (a rollout's flip after a Stage
// commit): one index transaction, then the current symlink is swapped
// with renameio. Nothing is fetched or rebuilt. ErrNotFound when the
// version is not recorded; an error naming the state when it is not
// Ready or its tree is gone (pull it again).
func (s *Store) Activate(name, rev string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var kind, repo string
	err := s.db.Update(func(tx *bolt.Tx) error {
		ab := tx.Bucket(bucketArtifacts).Bucket([]byte(name))
		if ab == nil {
			return fmt.Errorf("artifact %s: %w", name, ErrNotFound)
		}
		v, err := getSummary(ab.Bucket(bucketVersions), rev)
		if err != nil {
			return err
		}
		if v == nil {
			return fmt.Errorf("artifact %s@%s: %w", name, rev, ErrNotFound)
		}
		if v.State != StateReady {
			return fmt.Errorf("artifact %s@%s is %s, not Ready: %s", name, rev, v.State, v.Message)
		}
		base, err := s.treeBase(v.Kind, name)
		if err != nil {
			return err
		}
		if _, err := os.Stat(filepath.Join(base, name, rev)); err != nil {
			return fmt.Errorf("artifact %s@%s: tree: %w", name, rev, err)
		}
		kind, repo = v.Kind, v.HFRepo
		return ab.Put(keyCurrent, []byte(rev))
	})
	if err != nil {
		return err
	}
	s.hit("activate.after-index")
	base, _ := s.treeBase(kind, name)
	if err := s.setCurrentLink(filepath.Join(base, name), rev); err != nil {
		s.log.Warn("swap current link; startup repair will fix it", "artifact", name, "err", err)
	}
	if repo != "" {
		if err := s.syncHFView(repo); err != nil {
			s.log.Warn("hf cache view; startup repair will rebuild it", "repo", repo, "err", err)
		}
	}
	return nil
}

// materialize builds the tree for (name, rev) under tmp/ and renames it
// into place, replacing an existing tree atomically where the kernel
// supports RENAME_EXCHANGE; its top directory has mode (0755, or 0700
// for a private version) before it is in place. Called with s.mu held,
// or (HoldTree) with the blobs of m leased and base owned by the caller.
func (s *Store) materialize(base, name, rev string, m Manifest, mode os.FileMode) error {
	tmp, err := os.MkdirTemp(filepath.Join(s.root, dirTmp), "tree-")
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	made := map[string]bool{"": true}
	for _, e := range m {
		if dir := parentDir(e.Path); !made[dir] {
			if err := os.MkdirAll(filepath.Join(tmp, filepath.FromSlash(dir)), 0o755); err != nil {
				return err
			}
			for d := dir; d != "" && !made[d]; d = parentDir(d) {
				made[d] = true
			}
		}
		src, _ := s.BlobPath(e.Digest)
		if err := os.Link(src, filepath.Join(tmp, filepath.FromSlash(e.Path))); err != nil {
			return fmt.Errorf("link %s: %w", e.Path, err)
		}
	}
	if err := os.Chmod(tmp, mode); err != nil {
		return err
	}
	parent := filepath.Join(base, name)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return err
	}
	dst := filepath.Join(parent, rev)
	if _, err := os.Lstat(dst); err == nil {
		// Swap the new tree in, then remove the old one from tmp/.
		if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dst, unix.RENAME_EXCHANGE); err != nil {
			removeTree(s.root, s.log, dst)
			if err := os.Rename(tmp, dst); err != nil {
				return err
			}
		} else {
			os.RemoveAll(tmp)
		}
	} else if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	ok = true
	if err := syncDir(parent); err != nil {
		s.log.Warn("fsync tree parent", "dir", parent, "err", err)
	}
	s.hit("tree.after-rename")
	return nil
}

// removeTree takes a tree (any directory under root) out of view with one
// rename into root's tmp/, then deletes it; a failure is logged.
func removeTree(root string, log *slog.Logger, dir string) {
	trash, err := os.MkdirTemp(filepath.Join(root, dirTmp), "trash-")
	if err == nil {
		if err := os.Rename(dir, filepath.Join(trash, "t")); err == nil {
			dir = trash
		} else {
			os.Remove(trash)
		}
	}
	if err := os.RemoveAll(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Warn("remove tree", "dir", dir, "err", err)
	}
}

func (s *Store) setCurrentLink(parent, rev string) error {
	link := filepath.Join(parent, currentLink)
	if rev == "" {
		err := os.Remove(link)
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	if cur, err := os.Readlink(link); err == nil && cur == rev {
		return nil
	}
	if err := renameio.Symlink(rev, link); err != nil {
		return err
	}
	return syncDir(parent)
}
