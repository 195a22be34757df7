package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/csi"
)

// Tenancy on the node. An artifact fetched with credentials is private
// (api.Desire.AllowedNamespaces, from k8ssync; or a models.d desire's
// LocalGroup): only pods of those namespaces may mount it (csi.go), and
// on disk only root (and the local group: 0750) reaches its files by a
// path:
//
//   - its version trees (private/models/<name>/<rev>) are 0700: the store
//     makes a private version's tree so, under private/, before it is in
//     place (cachestore.VersionSpec.Private), and treeModes keeps every
//     stored version's place and mode in step with its desire (a desire
//     that becomes private or public; a tree that startup repair rebuilt
//     is 0700 under private/, and New opens it if it is public before
//     anything is served); under models/ are public trees only, so an
//     admission policy that admits local PVs there only keeps private
//     trees out of every PV (cachestore/private.go);
//   - it gets no hf/ view (those are world-readable by design);
//   - blobs/ is 0700 (cachestore): no blob is read by its digest.
//
// A pod that may mount it reads it through a tree of its own volume
// (holds/<hash>/tree, hardlinks to the same read-only inodes, 0755, under
// holds/ which is 0700): its bind mount is the only path to it, and it is
// in the pod's mount namespace only. The pod reads as whatever uid it
// runs as; no fsGroup or idmapped mount is needed, because the files
// themselves stay 0444 and only the directories on the way are closed.
//
// Dedup and privacy: a blob is one inode however many trees link it. A
// file that a public artifact also holds is readable through the public
// tree: those bytes are public (anyone may fetch them from the public
// source). What privacy keeps is the private artifact's own files and
// which files it has; a private artifact's blob that no public tree links
// is reachable by root only.

// private says whether ds's artifacts are private: to some namespaces, to
// a local group, or, fetched with credentials and not declared public, to
// root alone.
func private(ds api.Desire) bool {
	return len(ds.AllowedNamespaces) > 0 || ds.LocalGroup != "" || (credentialed(ds) && !ds.Public)
}

// credentialed says whether ds is fetched with credentials: the daemon
// found some (Desire.Credentialed), or a models.d file names a
// credentialsFile.
func credentialed(ds api.Desire) bool { return ds.Credentialed || ds.CredentialsFile != "" }

// markCredentialed marks the kept desires fetched with credentials
// (New, with the sources' Credentialed): a desire kept by an older
// daemon, which did not record it, is judged by the rule of today, so an
// artifact it fetched with the daemon's credentials becomes private at
// the first pass after the upgrade (the migration, docs/tenancy.md). A
// desire once marked stays so: what it fetched then was fetched with them.
func (s *desireSet) markCredentialed(credentialed func(context.Context, api.Desire) bool) {
	for _, m := range []map[string]api.Desire{s.api, s.cluster} {
		for n, ds := range m {
			if !ds.Credentialed && credentialed(context.Background(), ds) {
				ds.Credentialed = true
				m[n] = ds
			}
		}
	}
}

// localGroupID is the gid of a group named by name or number.
func localGroupID(name string) (int, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		if g, err = user.LookupGroupId(name); err != nil {
			return 0, fmt.Errorf("%q: no such group on this node (getent group %s)", name, name)
		}
	}
	return strconv.Atoi(g.Gid)
}

// mayMount says whether a pod of namespace ns may mount ds's artifact:
// anyone a public one, the allowed namespaces a private one (none when
// only a local group may read it).
func mayMount(ds api.Desire, ns string) bool {
	return !private(ds) || (ns != "" && slices.Contains(ds.AllowedNamespaces, ns))
}

// hidePrivate strips from a private artifact's view what only its trees
// would tell (its files, their digests, the metadata read from them), for
// a socket peer that may not mutate: any local user may read the socket.
func hidePrivate(a *api.Artifact) {
	for i := range a.Versions {
		a.Versions[i].Files = nil
	}
	a.Metadata = nil
}

// volumeHolds is what treeModes reads of the volumes pods hold: which
// version each mounts (csiVolumes; csi.Backend has it too).
type volumeHolds interface {
	Holds() ([]csi.Volume, error)
}

// treeModes keeps the modes of the version trees as their desires want
// them. mu serialises its walks and is taken with no other lock held;
// walked is what the last full walk decided from.
type treeModes struct {
	// Set once in New, read without a lock.
	store   *cachestore.Store
	log     *slog.Logger
	desired func() map[string]api.Desire // the merged desires (it takes the daemon lock)
	volumes volumeHolds                  // the CSI volumes (csiVolumes)

	mu     sync.Mutex
	walked string
	done   bool
}

// all sets the mode of every stored version's tree directory as its
// desire wants it: 0700 for a private artifact, 0755 for a public one. An
// artifact no present desire declares keeps the mode it has (no pod may
// mount it either). A version that a pod's volume mounts directly (it was
// public when the pod mounted it: its bytes were public then) stays open
// until the volume goes: closing it would take the files from under a pod
// that does not run as root. Called after each reconcile pass, without
// locks; it walks the store only when what decides the modes changed since
// its last walk (a desire's privacy or group, the volumes that mount a
// version directly): a version committed meanwhile got its mode at its
// commit (of).
func (m *treeModes) all() {
	want, mounted := m.inputs()
	key := modesKey(want, mounted)
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done && key == m.walked {
		return
	}
	arts, err := m.store.ListSummaries()
	if err != nil {
		return
	}
	for i := range arts {
		m.apply(&arts[i], want, mounted)
	}
	m.walked, m.done = key, true
}

// of sets the modes of name's trees alone (after a commit).
func (m *treeModes) of(name string) {
	want, mounted := m.inputs()
	a, err := m.store.Summary(name)
	if err != nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.apply(a, want, mounted)
}

// modeInputs are what decides tree modes: the present desires and the
// versions a pod's volume mounts directly (model@revision).
func (m *treeModes) inputs() (map[string]api.Desire, map[string]bool) {
	want := m.desired()
	mounted := map[string]bool{}
	if vols, err := m.volumes.Holds(); err == nil {
		for _, v := range vols {
			if !v.Private && len(v.Kernels) == 0 {
				mounted[v.Model+"@"+v.Revision] = true
			}
		}
	}
	return want, mounted
}

// modesKey sums up the mode inputs: each present desire that is not
// plainly public, with its allow-list and group, and the mounted versions.
func modesKey(want map[string]api.Desire, mounted map[string]bool) string {
	var parts []string
	for n, ds := range want {
		if ds.State != api.StateAbsent && private(ds) {
			parts = append(parts, n+"\x00"+strings.Join(ds.AllowedNamespaces, ",")+"\x00"+ds.LocalGroup+"\x00private")
		}
	}
	for k := range mounted {
		parts = append(parts, "mounted\x00"+k)
	}
	sort.Strings(parts)
	return strings.Join(parts, "\n")
}

// apply sets the modes of a's version trees (all's rules). Called with
// m.mu held.
func (m *treeModes) apply(a *cachestore.Artifact, want map[string]api.Desire, mounted map[string]bool) {
	ds, ok := want[a.Name]
	if !ok || ds.State == api.StateAbsent {
		return
	}
	mode, gid := os.FileMode(0o755), -1
	if private(ds) {
		mode = 0o700
	}
	if ds.LocalGroup != "" {
		g, err := localGroupID(ds.LocalGroup)
		if err != nil {
			m.log.Warn("a private artifact's local group is gone; its trees stay root's only", "artifact", a.Name, "err", err)
		} else {
			mode, gid = 0o750, g
		}
	}
	if len(a.Versions) > 0 {
		// A private artifact's trees are under private/, which no local PV
		// may name (cachestore/private.go): moved before their modes change.
		if err := m.store.SetPrivate(a.Versions[0].Kind, a.Name, mode != 0o755); err != nil {
			m.log.Error("moving an artifact's trees to where its privacy puts them", "artifact", a.Name, "private", mode != 0o755, "err", err)
		}
	}
	for _, v := range a.Versions {
		if mode != 0o755 && v.HFRepo != "" {
			// Its hf/ view is world-readable: a version kept from when the
			// artifact was public (an upgrade that made it private) leaves it.
			if err := m.store.HideHFView(a.Name, v.Revision); err != nil {
				m.log.Error("taking a private artifact out of the hf/ view", "artifact", a.Name, "revision", v.Revision, "err", err)
			}
		}
		if mode != 0o755 && mounted[a.Name+"@"+v.Revision] {
			continue
		}
		dir := m.store.TreePath(v.Kind, a.Name, v.Revision)
		fi, err := os.Lstat(dir)
		if err != nil || !fi.IsDir() {
			continue
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && gid >= 0 && int(st.Gid) != gid {
			// The group first: the mode that admits it comes after.
			if err := os.Lchown(dir, -1, gid); err != nil {
				m.log.Error("giving a private artifact's tree to its local group", "artifact", a.Name, "revision", v.Revision, "err", err)
				continue
			}
		}
		if fi.Mode().Perm() == mode {
			continue
		}
		if err := os.Chmod(dir, mode); err != nil {
			m.log.Error("setting the mode of a version's tree (a private artifact's must be 0700)", "artifact", a.Name, "revision", v.Revision, "err", err)
		}
	}
}
