package cachestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"

	"github.com/google/renameio/v2"
	bolt "go.etcd.io/bbolt"
)

// Holds are the daemon's opaque records of something that holds versions
// beyond a restart (a pod's CSI volume). Each lives twice: in the index's
// holds bucket, and in holds/<sha256(key)>/record beside the blobs. The
// copy on disk is what brings the record back when the index is lost and
// rebuilt from the trees (which cannot tell who held what): Open puts
// every record found under holds/ that the index lacks back into it, and
// writes the file of any index record that lacks one.
//
// A hold may also own a composed tree, holds/<sha256(key)>/tree: the files
// of several versions side by side (a model with its kernel caches under
// kernels/), hardlinks of the same blobs as the versions' own trees. It
// goes with DeleteHold.

const (
	holdRecordFile = "record"
	holdTreeDir    = "tree"
)

// holdFile is the on-disk copy of one hold record.
type holdFile struct {
	Key    string `json:"key"`
	Record []byte `json:"record"`
}

func (s *Store) holdDir(key string) string {
	h := sha256.Sum256([]byte(key))
	return filepath.Join(s.root, dirHolds, hex.EncodeToString(h[:]))
}

// PutHold stores the daemon's opaque record of a hold under key: on disk
// under holds/ first, then in the index. It outlives restarts, and the
// loss of the index, until DeleteHold.
func (s *Store) PutHold(key string, raw []byte) error {
	if err := s.writeHoldFile(key, raw); err != nil {
		return fmt.Errorf("hold %q: %w", key, err)
	}
	return s.putRecord(bucketHolds, key, raw)
}

func (s *Store) writeHoldFile(key string, raw []byte) error {
	dir := s.holdDir(key)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(holdFile{Key: key, Record: raw})
	if err != nil {
		return err
	}
	return renameio.WriteFile(filepath.Join(dir, holdRecordFile), b, 0o600, renameio.WithTempDir(filepath.Join(s.root, dirTmp)))
}

// DeleteHold removes the hold record under key, from the index and from
// disk, with the hold's composed tree if it has one; none there is no
// error. The caller has unmounted anything that showed the tree.
func (s *Store) DeleteHold(key string) error {
	if err := s.deleteRecord(bucketHolds, key); err != nil {
		return err
	}
	dir := s.holdDir(key)
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	s.removeTree(dir)
	return nil
}

// RemoveHoldTree removes the composed tree of the hold under key and
// keeps the record; none there is no error. It is DeleteHold's slow half
// (a tree of many files), for a caller that takes a lock around
// DeleteHold; the caller has unmounted anything that showed the tree.
func (s *Store) RemoveHoldTree(key string) {
	tree := s.HoldTreePath(key)
	if _, err := os.Lstat(tree); err == nil {
		s.removeTree(tree)
	}
}

// Holds returns every hold record by key.
func (s *Store) Holds() (map[string][]byte, error) { return s.records(bucketHolds) }

// syncHolds makes the index and holds/ agree (Open): a record on disk the
// index lacks goes back into the index, an index record without its file
// gets one, and a directory under holds/ with neither record nor tree
// (a crash inside PutHold) goes. It returns how many records it put back.
func (s *Store) syncHolds() (int, error) {
	inIndex, err := s.Holds()
	if err != nil {
		return 0, err
	}
	base := filepath.Join(s.root, dirHolds)
	ents, err := os.ReadDir(base)
	if err != nil {
		return 0, err
	}
	onDisk := map[string][]byte{}
	for _, e := range ents {
		dir := filepath.Join(base, e.Name())
		b, err := os.ReadFile(filepath.Join(dir, holdRecordFile))
		if errors.Is(err, fs.ErrNotExist) {
			if _, terr := os.Lstat(filepath.Join(dir, holdTreeDir)); errors.Is(terr, fs.ErrNotExist) {
				os.RemoveAll(dir)
			} else {
				s.log.Warn("a hold's composed tree has no record; left in place in case something shows it (remove it once nothing mounts it)", "dir", dir)
			}
			continue
		}
		var hf holdFile
		if err == nil {
			err = json.Unmarshal(b, &hf)
		}
		if err == nil && s.holdDir(hf.Key) != dir {
			err = errors.New("its key does not hash to its directory's name")
		}
		if err != nil {
			s.log.Warn("ignoring an unreadable hold record", "file", filepath.Join(dir, holdRecordFile), "err", err)
			continue
		}
		onDisk[hf.Key] = hf.Record
	}
	restored := 0
	err = s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketHolds)
		for k, raw := range onDisk {
			if _, ok := inIndex[k]; ok {
				continue
			}
			if err := b.Put([]byte(k), raw); err != nil {
				return err
			}
			restored++
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for k, raw := range inIndex {
		if _, ok := onDisk[k]; !ok {
			if err := s.writeHoldFile(k, raw); err != nil {
				s.log.Warn("writing the on-disk copy of a hold record", "key", k, "err", err)
			}
		}
	}
	if restored > 0 {
		s.log.Warn("put hold records back into the index from holds/", "restored", restored)
	}
	return restored, nil
}

// TreePart is one version placed in a composed tree.
type TreePart struct {
	// Dir is where the version's files go: "" for the tree's root, else a
	// relative path (checked as a manifest path is).
	Dir      string
	Name     string
	Revision string
}

// HoldTree builds the composed tree of the hold under key: the files of
// each part's version (which must be Ready) under its Dir, as hardlinks
// of their blobs, read-only files in directories the daemon owns. It is
// built under tmp/ and renamed into place, replacing one from before. Two
// parts that place a file at the same path (or a file where the other has
// a directory) are ErrInvalidPath, naming the path. The
// tree goes with DeleteHold; the caller holds the versions meanwhile.
//
// The links are made without the store's lock (a tree of 20,000 files
// takes seconds; commits, evictions, Touch and GC go on meanwhile): the
// tree's blobs are leased from GC for the while, and the tree is the
// hold's own, under holds/<sha256(key)>/. Calls for different keys run
// alongside; the caller serialises HoldTree and DeleteHold of one key.
func (s *Store) HoldTree(ctx context.Context, key string, parts []TreePart) (string, error) {
	type entry struct {
		e    Entry
		from string
	}
	files := map[string]entry{}
	for _, p := range parts {
		if p.Dir != "" {
			if err := ValidatePath(p.Dir); err != nil {
				return "", fmt.Errorf("composed tree: directory of %s: %w", p.Name, err)
			}
		}
		a, err := s.Get(p.Name)
		if err != nil {
			return "", err
		}
		var m Manifest
		found := false
		for _, v := range a.Versions {
			if v.Revision == p.Revision && v.State == StateReady {
				m, found = v.Manifest, true
			}
		}
		if !found {
			return "", fmt.Errorf("%s@%s: %w (no Ready version)", p.Name, p.Revision, ErrNotFound)
		}
		for _, e := range m {
			at := e.Path
			if p.Dir != "" {
				at = path.Join(p.Dir, e.Path)
			}
			if prev, ok := files[at]; ok {
				return "", fmt.Errorf("composed tree: path %q: %w: a file of %s@%s and of %s", at, ErrInvalidPath, p.Name, p.Revision, prev.from)
			}
			e.Path = at
			files[at] = entry{e, p.Name + "@" + p.Revision}
		}
	}
	m := make(Manifest, 0, len(files))
	for _, f := range files {
		m = append(m, f.e)
	}
	if err := m.Validate(); err != nil { // sorts; finds a file where another part has a directory
		return "", fmt.Errorf("composed tree: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	lease := s.NewLease()
	defer lease.Release()
	for _, e := range m {
		lease.Hold(e.Digest)
	}
	dir := s.holdDir(key)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	s.hit("holdtree.link")
	if err := s.materialize(dir, "", holdTreeDir, m, 0o755); err != nil {
		if errors.Is(err, fs.ErrNotExist) { // a blob GC took before the lease (its version evicted since Get)
			return "", fmt.Errorf("composed tree of hold %q: %w: %v", key, ErrNotFound, err)
		}
		return "", fmt.Errorf("composed tree of hold %q: %w", key, err)
	}
	return filepath.Join(dir, holdTreeDir), nil
}

// HoldTreePath is where the composed tree of the hold under key is (or
// would be).
func (s *Store) HoldTreePath(key string) string { return filepath.Join(s.holdDir(key), holdTreeDir) }
