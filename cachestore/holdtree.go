package cachestore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// A hold (Records.PutHold) may own a composed tree,
// holds/<sha256(key)>/tree: the files of several versions side by side (a
// model with its kernel caches under kernels/), hardlinks of the same
// blobs as the versions' own trees. It goes with Records.DeleteHold.

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
// tree goes with Records.DeleteHold; the caller holds the versions meanwhile.
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
	dir := holdDir(s.root, key)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	s.hit("holdtree.link")
	if err := atIdlePriority(func() error { return s.materialize(dir, "", holdTreeDir, m, 0o755) }); err != nil {
		if errors.Is(err, fs.ErrNotExist) { // a blob GC took before the lease (its version evicted since Get)
			return "", fmt.Errorf("composed tree of hold %q: %w: %v", key, ErrNotFound, err)
		}
		return "", fmt.Errorf("composed tree of hold %q: %w", key, err)
	}
	return filepath.Join(dir, holdTreeDir), nil
}

// HoldTreePath is where the composed tree of the hold under key is (or
// would be).
func (s *Store) HoldTreePath(key string) string {
	return filepath.Join(holdDir(s.root, key), holdTreeDir)
}

// RemoveHoldTree removes the composed tree of the hold under key and
// keeps the record; none there is no error. It is Records.DeleteHold's
// slow half (a tree of many files), for a caller that takes a lock around
// DeleteHold; the caller has unmounted anything that showed the tree.
func (s *Store) RemoveHoldTree(key string) {
	tree := s.HoldTreePath(key)
	if _, err := os.Lstat(tree); err == nil {
		removeTree(s.root, s.log, tree)
	}
}

// atIdlePriority runs fn on an OS thread of its own under SCHED_IDLE: a
// composed tree's thousands of links then take only the CPU nothing else
// wants, and a publish of another volume beside it waits for none of it
// (BenchmarkCSIPublishDuringCompose; docs/benchmarks.md). The thread is
// never unlocked: it exits with the goroutine, and its policy with it.
func atIdlePriority(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_IDLE}, 0)
		errc <- fn()
	}()
	return <-errc
}
