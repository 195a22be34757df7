package cachestore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/google/renameio/v2"
)

const dirHF = "hf"

// HFRepoDir is the directory name huggingface_hub gives a model repo:
// "org/name" → "models--org--name".
func HFRepoDir(repo string) string { return "models--" + strings.ReplaceAll(repo, "/", "--") }

func validHFRepo(repo string) error {
	parts := strings.Split(repo, "/")
	if len(parts) > 2 {
		return fmt.Errorf("hf repo %q: %w: at most org/name", repo, ErrInvalidName)
	}
	for _, p := range parts {
		if err := ValidateName(p); err != nil || strings.Contains(p, "--") {
			return fmt.Errorf("hf repo %q: %w", repo, ErrInvalidName)
		}
	}
	return nil
}

// hfOID is the view's name for an entry's blob: the hub's etag when known,
// else the sha256 hex.
func hfOID(e Entry) string {
	if e.Etag != "" && !strings.ContainsAny(e.Etag, "/\\.\x00") {
		return e.Etag
	}
	return e.Digest[len(DigestPrefix):]
}

// syncHFView makes <root>/hf/models--<org>--<repo>/ match the index: one
// snapshot per Ready version from that repo (relative symlinks into
// ../../blobs), blobs/<oid> as hardlinks of store blobs that a snapshot
// uses, refs/<revision> holding the commit with no newline. Snapshots,
// blobs and refs nothing serves any more are removed; the repo directory
// goes when it serves nothing. Called with s.mu held.
func (s *Store) syncHFView(repo string) error {
	if err := validHFRepo(repo); err != nil {
		return err
	}
	arts, err := s.List()
	if err != nil {
		return err
	}
	v := hfRepoView{s: s, repo: repo, base: filepath.Join(s.root, dirHF, HFRepoDir(repo))}
	want := wantedSnapshots(arts, repo)
	if len(want) == 0 {
		return os.RemoveAll(v.base)
	}
	for _, d := range []string{"blobs", "snapshots", "refs"} {
		if err := os.MkdirAll(filepath.Join(v.base, d), 0o755); err != nil {
			return err
		}
	}
	// Blobs first: a snapshot's links must never dangle.
	usedBlobs, err := v.linkBlobs(want)
	if err != nil {
		return err
	}
	if err := v.makeSnapshots(want); err != nil {
		return err
	}
	refs := v.wantedRefs(want)
	if err := v.writeRefs(refs); err != nil {
		return err
	}
	v.prune(want, usedBlobs, refs)
	return nil
}

// hfSnapshot is what the view serves of one commit: its files, and the
// refs that name it (current: those a current version names; "" stands
// for a version pulled by its commit).
type hfSnapshot struct {
	m    Manifest
	refs []string
	cur  map[string]bool
}

// wantedSnapshots is the view of repo the index asks for: by commit, the
// Ready versions from that repo whose revision is a commit.
func wantedSnapshots(arts []Artifact, repo string) map[string]*hfSnapshot {
	want := map[string]*hfSnapshot{}
	for _, a := range arts {
		for _, v := range a.Versions {
			if v.HFRepo != repo || v.State != StateReady || !isHexN(v.Revision, 40) {
				continue
			}
			sn := want[v.Revision]
			if sn == nil {
				sn = &hfSnapshot{m: v.Manifest}
				want[v.Revision] = sn
			}
			if v.HFRef == "" || v.HFRef == v.Revision {
				sn.refs = append(sn.refs, "")
				continue
			}
			sn.refs = append(sn.refs, v.HFRef)
			if v.Revision == a.Current {
				if sn.cur == nil {
					sn.cur = map[string]bool{}
				}
				sn.cur[v.HFRef] = true
			}
		}
	}
	return want
}

// hfRepoView is the view of one repo under base, hf/models--<org>--<repo>.
type hfRepoView struct {
	s    *Store
	repo string
	base string
}

// linkBlobs hardlinks each store blob a snapshot uses as blobs/<oid> and
// returns the oids used.
func (v hfRepoView) linkBlobs(want map[string]*hfSnapshot) (map[string]bool, error) {
	used := map[string]bool{}
	for _, sn := range want {
		for _, e := range sn.m {
			oid := hfOID(e)
			used[oid] = true
			dst := filepath.Join(v.base, "blobs", oid)
			if _, err := os.Lstat(dst); err == nil {
				continue
			}
			src, _ := v.s.BlobPath(e.Digest)
			if err := os.Link(src, dst); err != nil && !errors.Is(err, os.ErrExist) {
				return nil, fmt.Errorf("hf view %s: blob %s: %w", v.repo, oid, err)
			}
		}
	}
	return used, nil
}

// makeSnapshots builds each missing snapshots/<commit> under tmp/ as
// relative symlinks into ../../blobs and renames it into place.
func (v hfRepoView) makeSnapshots(want map[string]*hfSnapshot) error {
	for commit, sn := range want {
		dst := filepath.Join(v.base, "snapshots", commit)
		if _, err := os.Lstat(dst); err == nil {
			continue
		}
		tmp, err := os.MkdirTemp(filepath.Join(v.s.root, dirTmp), "hfsnap-")
		if err != nil {
			return err
		}
		if err := linkSnapshot(tmp, sn.m); err != nil {
			os.RemoveAll(tmp)
			return err
		}
		os.Chmod(tmp, 0o755)
		if err := os.Rename(tmp, dst); err != nil {
			os.RemoveAll(tmp)
			return err
		}
	}
	return nil
}

// linkSnapshot makes, under dir, each file of m a relative symlink to
// its blob in the repo's blobs/ (dir stands where snapshots/<commit> will).
func linkSnapshot(dir string, m Manifest) error {
	for _, e := range m {
		p := filepath.Join(dir, filepath.FromSlash(e.Path))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		target := strings.Repeat("../", strings.Count(e.Path, "/")+2) + "blobs/" + hfOID(e)
		if err := os.Symlink(target, p); err != nil {
			return err
		}
	}
	return nil
}

// wantedRefs is the commit each ref names. Each requested revision names
// its commit; a commit pulled by sha also gets refs/main when there is
// none, so scanners that require refs/ find the snapshot. A ref two
// commits claim (a rollout's staged revision of a branch beside the
// current one) names the current one's.
func (v hfRepoView) wantedRefs(want map[string]*hfSnapshot) map[string]string {
	refs := map[string]string{}
	for commit, sn := range want {
		for _, r := range sn.refs {
			if r == "" {
				continue
			}
			if _, taken := refs[r]; !taken || sn.cur[r] {
				refs[r] = commit
			}
		}
	}
	if _, ok := refs["main"]; !ok {
		for commit, sn := range want {
			for _, r := range sn.refs {
				if r == "" {
					refs["main"] = commit
				}
			}
		}
	}
	// Refs nest like git's: "main" and "main/x" cannot both exist (one is
	// a file, the other needs it to be a directory). The shorter wins,
	// every time, and the other is left out with a warning; the snapshot
	// stays reachable by its commit.
	names := make([]string, 0, len(refs))
	for r := range refs {
		names = append(names, r)
	}
	sort.Strings(names)
	for _, r := range names {
		for _, q := range names {
			if _, ok := refs[q]; ok && strings.HasPrefix(q, r+"/") {
				if _, kept := refs[r]; kept {
					v.s.log.Warn("hf view: revisions whose refs cannot coexist; leaving the longer one out", "repo", v.repo, "kept", r, "left_out", q)
					delete(refs, q)
				}
			}
		}
	}
	return refs
}

// writeRefs writes refs/<ref> = commit for each ref, clearing what
// stands in the way.
func (v hfRepoView) writeRefs(refs map[string]string) error {
	for r, commit := range refs {
		if err := ValidatePath(r); err != nil {
			continue
		}
		p := filepath.Join(v.base, "refs", filepath.FromSlash(r))
		if cur, err := os.ReadFile(p); err == nil && string(cur) == commit {
			continue
		}
		// What stands in the way is a ref nothing wants any more (wanted
		// refs do not nest): a directory where the ref goes, or a file
		// where one of its parent directories goes.
		if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
			os.RemoveAll(p)
		}
		for d := filepath.Dir(p); d != filepath.Join(v.base, "refs") && strings.HasPrefix(d, v.base); d = filepath.Dir(d) {
			if fi, err := os.Lstat(d); err == nil && !fi.IsDir() {
				os.Remove(d)
			}
		}
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := renameio.WriteFile(p, []byte(commit), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// prune removes the refs, snapshots and blobs nothing serves.
func (v hfRepoView) prune(want map[string]*hfSnapshot, usedBlobs map[string]bool, refs map[string]string) {
	filepath.WalkDir(filepath.Join(v.base, "refs"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(filepath.Join(v.base, "refs"), p)
		if _, ok := refs[filepath.ToSlash(rel)]; !ok {
			os.Remove(p)
		}
		return nil
	})
	if ents, err := os.ReadDir(filepath.Join(v.base, "snapshots")); err == nil {
		for _, e := range ents {
			if want[e.Name()] == nil {
				removeTree(v.s.root, v.s.log, filepath.Join(v.base, "snapshots", e.Name()))
			}
		}
	}
	if ents, err := os.ReadDir(filepath.Join(v.base, "blobs")); err == nil {
		for _, e := range ents {
			if !usedBlobs[e.Name()] {
				os.Remove(filepath.Join(v.base, "blobs", e.Name()))
			}
		}
	}
}

func isHexN(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
