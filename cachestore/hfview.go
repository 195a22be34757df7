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
	base := filepath.Join(s.root, dirHF, HFRepoDir(repo))
	type snap struct {
		m    Manifest
		refs []string
		cur  map[string]bool // refs a current version names
	}
	want := map[string]*snap{} // commit → snapshot
	for _, a := range arts {
		for _, v := range a.Versions {
			if v.HFRepo != repo || v.State != StateReady || !isHexN(v.Revision, 40) {
				continue
			}
			sn := want[v.Revision]
			if sn == nil {
				sn = &snap{m: v.Manifest}
				want[v.Revision] = sn
			}
			if v.HFRef != "" && v.HFRef != v.Revision {
				sn.refs = append(sn.refs, v.HFRef)
				if v.Revision == a.Current {
					if sn.cur == nil {
						sn.cur = map[string]bool{}
					}
					sn.cur[v.HFRef] = true
				}
			} else {
				sn.refs = append(sn.refs, "")
			}
		}
	}
	if len(want) == 0 {
		return os.RemoveAll(base)
	}
	for _, d := range []string{"blobs", "snapshots", "refs"} {
		if err := os.MkdirAll(filepath.Join(base, d), 0o755); err != nil {
			return err
		}
	}
	// Blobs first: a snapshot's links must never dangle.
	usedBlobs := map[string]bool{}
	for _, sn := range want {
		for _, e := range sn.m {
			oid := hfOID(e)
			usedBlobs[oid] = true
			dst := filepath.Join(base, "blobs", oid)
			if _, err := os.Lstat(dst); err == nil {
				continue
			}
			src, _ := s.BlobPath(e.Digest)
			if err := os.Link(src, dst); err != nil && !errors.Is(err, os.ErrExist) {
				return fmt.Errorf("hf view %s: blob %s: %w", repo, oid, err)
			}
		}
	}
	for commit, sn := range want {
		dst := filepath.Join(base, "snapshots", commit)
		if _, err := os.Lstat(dst); err == nil {
			continue
		}
		tmp, err := os.MkdirTemp(filepath.Join(s.root, dirTmp), "hfsnap-")
		if err != nil {
			return err
		}
		for _, e := range sn.m {
			p := filepath.Join(tmp, filepath.FromSlash(e.Path))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				os.RemoveAll(tmp)
				return err
			}
			target := strings.Repeat("../", strings.Count(e.Path, "/")+2) + "blobs/" + hfOID(e)
			if err := os.Symlink(target, p); err != nil {
				os.RemoveAll(tmp)
				return err
			}
		}
		os.Chmod(tmp, 0o755)
		if err := os.Rename(tmp, dst); err != nil {
			os.RemoveAll(tmp)
			return err
		}
	}
	// refs: each requested revision names its commit; a commit pulled by
	// sha also gets refs/main when there is none, so scanners that
	// require refs/ find the snapshot.
	// A ref two commits claim (a rollout's staged revision of a branch
	// beside the current one) names the current one's.
	wantRefs := map[string]string{}
	for commit, sn := range want {
		for _, r := range sn.refs {
			if r == "" {
				continue
			}
			if _, taken := wantRefs[r]; !taken || sn.cur[r] {
				wantRefs[r] = commit
			}
		}
	}
	if _, ok := wantRefs["main"]; !ok {
		for commit, sn := range want {
			for _, r := range sn.refs {
				if r == "" {
					wantRefs["main"] = commit
				}
			}
		}
	}
	// Refs nest like git's: "main" and "main/x" cannot both exist (one is
	// a file, the other needs it to be a directory). The shorter wins,
	// every time, and the other is left out with a warning; the snapshot
	// stays reachable by its commit.
	names := make([]string, 0, len(wantRefs))
	for r := range wantRefs {
		names = append(names, r)
	}
	sort.Strings(names)
	for _, r := range names {
		for _, q := range names {
			if _, ok := wantRefs[q]; ok && strings.HasPrefix(q, r+"/") {
				if _, kept := wantRefs[r]; kept {
					s.log.Warn("hf view: revisions whose refs cannot coexist; leaving the longer one out", "repo", repo, "kept", r, "left_out", q)
					delete(wantRefs, q)
				}
			}
		}
	}
	for r, commit := range wantRefs {
		if err := ValidatePath(r); err != nil {
			continue
		}
		p := filepath.Join(base, "refs", filepath.FromSlash(r))
		if cur, err := os.ReadFile(p); err == nil && string(cur) == commit {
			continue
		}
		// What stands in the way is a ref nothing wants any more (wanted
		// refs do not nest): a directory where the ref goes, or a file
		// where one of its parent directories goes.
		if fi, err := os.Lstat(p); err == nil && fi.IsDir() {
			os.RemoveAll(p)
		}
		for d := filepath.Dir(p); d != filepath.Join(base, "refs") && strings.HasPrefix(d, base); d = filepath.Dir(d) {
			if fi, err := os.Lstat(d); err == nil && !fi.IsDir() {
				os.Remove(d)
			}
		}
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := renameio.WriteFile(p, []byte(commit), 0o644); err != nil {
			return err
		}
	}
	// Remove what nothing serves.
	filepath.WalkDir(filepath.Join(base, "refs"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(filepath.Join(base, "refs"), p)
		if _, ok := wantRefs[filepath.ToSlash(rel)]; !ok {
			os.Remove(p)
		}
		return nil
	})
	if ents, err := os.ReadDir(filepath.Join(base, "snapshots")); err == nil {
		for _, e := range ents {
			if want[e.Name()] == nil {
				removeTree(s.root, s.log, filepath.Join(base, "snapshots", e.Name()))
			}
		}
	}
	if ents, err := os.ReadDir(filepath.Join(base, "blobs")); err == nil {
		for _, e := range ents {
			if !usedBlobs[e.Name()] {
				os.Remove(filepath.Join(base, "blobs", e.Name()))
			}
		}
	}
	return nil
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

// hfRepos lists the repos the index and the hf/ directory know.
func (s *Store) hfRepos() map[string]bool {
	out := map[string]bool{}
	if arts, err := s.ListSummaries(); err == nil {
		for _, a := range arts {
			for _, v := range a.Versions {
				if v.HFRepo != "" {
					out[v.HFRepo] = true
				}
			}
		}
	}
	return out
}
