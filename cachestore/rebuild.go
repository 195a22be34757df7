package cachestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
)

// RebuildReport says what Open rebuilt when it found an index with no
// records (a new, emptied or deleted index.db) over a root that still
// holds trees. Nothing on disk is deleted for want of a record then.
type RebuildReport struct {
	Versions    []string `json:"versions,omitempty"`    // name@revision rebuilt Ready from its tree
	Quarantined []string `json:"quarantined,omitempty"` // trees that could not be read as ours, moved to quarantine/
	HFVersions  int      `json:"hfVersions,omitempty"`  // versions given back their place in the HF cache view
}

// rebuildMessage marks a version whose record was rebuilt from disk.
const rebuildMessage = "rebuilt from disk after the index was lost; source, pin and desire unknown until pulled again"

// storeHasTrees reports whether any kind dir holds an artifact directory.
func storeHasTrees(root string) bool {
	for _, d := range []string{kindDirs[KindModel], kindDirs[KindKernelCache]} {
		for _, p := range []string{d, filepath.Join(dirPrivate, d)} {
			if ents, err := os.ReadDir(filepath.Join(root, p)); err == nil && len(ents) > 0 {
				return true
			}
		}
	}
	return false
}

// rebuildIndex records every tree on disk as a Ready version. Trees are
// hardlinks into blobs/, so each file names its blob by inode; a file that
// is not one (copied in by hand) is hashed, and adopted as a blob when the
// store lacks it. The revision is the tree's directory name, the current
// one the current link's target. Lost for good, because only the index held
// them: the source URI, the desire of a modelctl pull, pins, the file
// modes (trees share the blobs' read-only inodes), a kernel cache's
// recorded signature and compatibility checks, and the fingerprint that
// tells the daemon the version came from today's desire (it pulls once
// more, fetching only what the store lacks). An HF cache view on disk
// gives back the repo, a ref and the hub's etags of its versions.
// Called before repair, with the index freshly initialised.
func (s *Store) rebuildIndex(ctx context.Context) (*RebuildReport, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, err := newRebuilder(s)
	if err != nil {
		return nil, err
	}
	var arts []Artifact
	for _, ab := range s.artifactBases() {
		kind, base := ab.kind, ab.dir
		names, _ := os.ReadDir(base)
		for _, n := range names {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			if !n.IsDir() || ValidateName(n.Name()) != nil {
				continue // repair removes it as before: nothing of ours
			}
			if where, _ := s.treeBase(kind, n.Name()); where != base {
				continue // a public copy of a private name: repair removes it
			}
			a, err := b.artifact(ctx, kind, base, n.Name())
			if err != nil {
				return nil, err
			}
			if len(a.Versions) > 0 {
				arts = append(arts, a)
			}
		}
	}
	if len(arts) == 0 {
		return b.rep, nil
	}
	if err := b.record(arts); err != nil {
		return nil, fmt.Errorf("rebuild index: %w", err)
	}
	sort.Strings(b.rep.Versions)
	return b.rep, nil
}

// inode names a file by device and inode: a tree's file is its blob's.
type inode struct{ dev, ino uint64 }

// rebuilder is one run of rebuildIndex: the blobs on disk by inode, the
// HF view on disk, and what it rebuilt so far.
type rebuilder struct {
	s       *Store
	rep     *RebuildReport
	byInode map[inode]string
	hf      hfScan
	now     time.Time
}

func newRebuilder(s *Store) (*rebuilder, error) {
	onDisk, err := blobsOnDisk(s.root, s.log)
	if err != nil {
		return nil, err
	}
	byInode := map[inode]string{}
	for d := range onDisk {
		p, _ := s.BlobPath(d)
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err == nil {
			byInode[inode{uint64(st.Dev), st.Ino}] = d
		}
	}
	return &rebuilder{s: s, rep: &RebuildReport{}, byInode: byInode, hf: scanHFView(s.root), now: s.now().UTC()}, nil
}

// artifact rebuilds the versions of one artifact from its trees under
// base/name; current is the current link's target, else the newest tree.
func (b *rebuilder) artifact(ctx context.Context, kind, base, name string) (Artifact, error) {
	dir := filepath.Join(base, name)
	a := Artifact{Name: name}
	revs, _ := os.ReadDir(dir)
	var newest time.Time
	for _, r := range revs {
		if r.Name() == currentLink || !r.IsDir() || ValidateName(r.Name()) != nil {
			continue
		}
		v, err := b.version(ctx, kind, dir, name, r)
		if err != nil {
			return a, err
		}
		if v == nil {
			continue
		}
		if v.Created.After(newest) {
			newest, a.Current = v.Created, v.Revision
		}
		a.Versions = append(a.Versions, *v)
		b.rep.Versions = append(b.rep.Versions, v.Name+"@"+v.Revision)
	}
	if cur, err := os.Readlink(filepath.Join(dir, currentLink)); err == nil {
		for _, v := range a.Versions {
			if v.Revision == cur {
				a.Current = cur
			}
		}
	}
	return a, nil
}

// version rebuilds one version from its tree, dir/<rev>; nil when the
// tree is not a store tree and was moved to quarantine/.
func (b *rebuilder) version(ctx context.Context, kind, dir, name string, r fs.DirEntry) (*Version, error) {
	tree := filepath.Join(dir, r.Name())
	m, err := b.manifestOfTree(ctx, tree)
	if err == nil {
		err = m.Validate()
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		q := filepath.Join(b.s.root, dirQuarantine, fmt.Sprintf("tree-%s-%s-%s-%d", kindDirs[kind], name, r.Name(), b.now.Unix()))
		if rerr := os.Rename(tree, q); rerr != nil {
			return nil, fmt.Errorf("rebuild: %s: %v; and it cannot be moved aside: %w", tree, err, rerr)
		}
		b.s.log.Warn("index rebuild: tree is not a store tree; moved to quarantine", "tree", tree, "to", q, "err", err)
		b.rep.Quarantined = append(b.rep.Quarantined, name+"@"+r.Name())
		return nil, nil
	}
	created := b.now
	if fi, err := r.Info(); err == nil {
		created = fi.ModTime().UTC()
	}
	v := &Version{
		Name: name, Kind: kind, Revision: r.Name(), Manifest: m, ManifestDigest: m.Digest(),
		State: StateReady, Message: rebuildMessage, Created: created, LastUsed: created, Bytes: m.Bytes(),
	}
	if repo, ref, etags, ok := b.hf.match(v.Revision, m); ok && kind == KindModel {
		v.HFRepo, v.HFRef = repo, ref
		for i := range v.Manifest {
			if oid := etags[v.Manifest[i].Path]; oid != v.Manifest[i].Digest[len(DigestPrefix):] {
				v.Manifest[i].Etag = oid
			}
		}
		b.rep.HFVersions++
	}
	v.Metadata = readMetadata(b.s, v.Manifest)
	return v, nil
}

// record writes the rebuilt artifacts into the index in one transaction.
func (b *rebuilder) record(arts []Artifact) error {
	return b.s.db.Update(func(tx *bolt.Tx) error {
		for _, a := range arts {
			ab, err := tx.Bucket(bucketArtifacts).CreateBucketIfNotExists([]byte(a.Name))
			if err != nil {
				return err
			}
			if ab.Get(keyCurrent) != nil {
				// The same name under models/ and kernels/: the first kept wins;
				// repair removes the other tree, which no record names.
				b.s.log.Warn("index rebuild: a name exists under both models/ and kernels/; keeping the model", "artifact", a.Name)
				continue
			}
			for i := range a.Versions {
				if err := putVersion(ab, &a.Versions[i]); err != nil {
					return err
				}
			}
			if err := ab.Put(keyCurrent, []byte(a.Current)); err != nil {
				return err
			}
		}
		return nil
	})
}

// manifestOfTree lists the files under tree with the blob each one is. A
// symlink or special file means the tree is not one the store built.
func (b *rebuilder) manifestOfTree(ctx context.Context, tree string) (Manifest, error) {
	var m Manifest
	err := filepath.WalkDir(tree, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(tree, p)
		rel = filepath.ToSlash(rel)
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file", rel)
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		dg := b.byInode[inode{uint64(st.Dev), st.Ino}]
		if dg == "" {
			if dg, err = b.adoptTreeFile(ctx, p); err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
		}
		m = append(m, Entry{Path: rel, Digest: dg, Size: st.Size})
		return nil
	})
	if err == nil && len(m) == 0 {
		err = errors.New("no files")
	}
	return m, err
}

// adoptTreeFile hashes a tree file that is not a hardlink of a blob and
// makes it one when the store lacks that blob.
func (b *rebuilder) adoptTreeFile(ctx context.Context, p string) (string, error) {
	h := sha256.New()
	if err := hashFile(ctx, p, h); err != nil {
		return "", err
	}
	dg := DigestPrefix + hex.EncodeToString(h.Sum(nil))
	if b.s.HasBlob(dg) {
		return dg, nil
	}
	dst, _ := b.s.BlobPath(dg)
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", err
	}
	if err := os.Link(p, dst); err != nil && !errors.Is(err, os.ErrExist) {
		return "", err
	}
	os.Chmod(dst, 0o444)
	return dg, nil
}

// hfScan is what the HF cache view on disk says: per commit, the repo,
// the refs that name it and the blob name (the hub's etag) of each path.
type hfScan map[string]*hfSnap

type hfSnap struct {
	repo  string
	refs  []string
	etags map[string]string
}

// scanHFView reads the HF cache view under root.
func scanHFView(root string) hfScan {
	out := hfScan{}
	top := filepath.Join(root, dirHF)
	repos, _ := os.ReadDir(top)
	for _, r := range repos {
		repo, ok := strings.CutPrefix(r.Name(), "models--")
		if !ok {
			continue
		}
		repo = strings.ReplaceAll(repo, "--", "/")
		if validHFRepo(repo) != nil {
			continue
		}
		base := filepath.Join(top, r.Name())
		snaps, _ := os.ReadDir(filepath.Join(base, "snapshots"))
		for _, sn := range snaps {
			if !isHexN(sn.Name(), 40) {
				continue
			}
			dir := filepath.Join(base, "snapshots", sn.Name())
			etags := map[string]string{}
			filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
				if err != nil || d.Type()&fs.ModeSymlink == 0 {
					return nil
				}
				if t, err := os.Readlink(p); err == nil {
					rel, _ := filepath.Rel(dir, p)
					etags[filepath.ToSlash(rel)] = filepath.Base(t)
				}
				return nil
			})
			out[sn.Name()] = &hfSnap{repo: repo, etags: etags}
		}
		refs := filepath.Join(base, "refs")
		filepath.WalkDir(refs, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return nil
			}
			b, err := os.ReadFile(p)
			if sn := out[strings.TrimSpace(string(b))]; err == nil && sn != nil && sn.repo == repo {
				rel, _ := filepath.Rel(refs, p)
				sn.refs = append(sn.refs, filepath.ToSlash(rel))
			}
			return nil
		})
	}
	for _, sn := range out {
		sort.Strings(sn.refs)
	}
	return out
}

// match finds the HF view snapshot of revision rev with exactly m's paths.
// The ref is the first that names it (a ref that other artifacts of the
// same commit asked for may be lost; the next pull writes it again).
func (h hfScan) match(rev string, m Manifest) (repo, ref string, etags map[string]string, ok bool) {
	sn := h[rev]
	if sn == nil || len(sn.etags) != len(m) {
		return "", "", nil, false
	}
	for _, e := range m {
		if _, ok := sn.etags[e.Path]; !ok {
			return "", "", nil, false
		}
	}
	if len(sn.refs) > 0 {
		ref = sn.refs[0]
	}
	return sn.repo, ref, sn.etags, true
}
