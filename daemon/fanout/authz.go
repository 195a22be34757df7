package fanout

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/k8ssync"
	p2p "github.com/modelcache/modelcache/peer"
)

// Authz is the peer port's authorizer in a cluster (p2p.Authorizer):
// which node may have which blob, so that a daemon token stolen from one
// node fetches from its peers only what that node is selected for. A blob
// goes to a caller when an artifact that holds it here is public (its
// bytes are anyone's: the public source serves them), or is private to
// namespaces (cluster credentials) and its ModelCache selects the node
// the caller's token is bound to (k8ssync.NodeSelection: the Node's
// labels against spec.nodeSelector), and the request comes from an
// address of the pod the token is bound to (of the Node, for a token
// bound to a Node): a token is a bearer credential, and one a daemon sent
// to a peer address that a compromised node advertised could be replayed
// from there. A caller whose token names no node gets public blobs only;
// an artifact private to a local group (models.d) is this node's alone.
// Public blobs cost no API call; the private ones cost what
// NodeSelection reads (a GET of the caller's Pod, of its Node and of the
// ModelCache, each per TTL).
//
// Which artifacts hold a blob: the versions in the store (blobIndex, kept
// current from the store's summaries), the blobs this node's pulls
// fetched through fanout before their version commits, and those they
// are fetching now (a node that is downloading serves what it has, and
// the part of a blob it has written so far, to the nodes that wait for
// it: the same rules, whole or not). A blob
// two pulls want at once is fetched by one (download.go's flights) and
// recorded as that one's artifact's until a version holds it: a caller
// the other artifact would admit may be answered not found meanwhile,
// and asks another peer or waits.
//
// It takes no lock of the daemon's: what the desires say of each
// artifact it reads from Accesses, which the daemon publishes on each
// change of its desires.
type Authz struct {
	st     BlobStore
	access Accesses
	sel    NodeSelector

	mu       sync.Mutex // guards idx, fresh and inflight; taken with no caller's lock held (the store's are below it)
	idx      blobIndex
	fresh    map[string]map[string]bool // digest → artifacts whose pulls fetched it, while no indexed version of theirs holds it
	inflight map[string]map[string]int  // digest → artifacts whose pulls are fetching it now → how many
}

// NodeSelector says whether a ModelCache selects a node, and whether a
// request comes from what its token is bound to (k8ssync.NodeSelection).
type NodeSelector interface {
	Selects(ctx context.Context, modelCache, node string) (bool, error)
	From(ctx context.Context, b k8ssync.Bound, src netip.Addr) (bool, error)
}

// boundName names what a token is bound to, for an error.
func boundName(b k8ssync.Bound) string {
	if b.Pod != "" {
		return fmt.Sprintf("pod %s/%s on node %s", b.Namespace, b.Pod, b.Node)
	}
	return "node " + b.Node
}

// BlobStore is what Authz reads of the store (a *cachestore.Store): the
// versions (their summaries, and a new one's manifest) and whether a blob
// is still there.
type BlobStore interface {
	ListSummaries() ([]cachestore.Artifact, error)
	Get(name string) (*cachestore.Artifact, error)
	HasBlob(digest string) bool
}

// Access is what the desires say of one artifact, for the peer port:
// whether its bytes are anyone's (Public: no namespaces nor local group
// restrict it), and, for one private to namespaces, the ModelCache it
// comes from ("" when none: a socket or models.d desire's).
type Access struct {
	Public     bool
	ModelCache string
}

// Accesses says what the desires make of artifact name (false: no
// desire declares it).
type Accesses interface {
	Access(name string) (Access, bool)
}

// AccessTable is Accesses as a snapshot the daemon replaces on each
// change of its desires (Set); reads take no lock. The zero value
// declares nothing.
type AccessTable struct {
	m atomic.Pointer[map[string]Access]
}

// Set replaces the table.
func (t *AccessTable) Set(m map[string]Access) { t.m.Store(&m) }

// Access implements Accesses.
func (t *AccessTable) Access(name string) (Access, bool) {
	m := t.m.Load()
	if m == nil {
		return Access{}, false
	}
	a, ok := (*m)[name]
	return a, ok
}

// NewAuthz returns the authorizer of the blobs of st, by the artifacts'
// access and sel's selections.
func NewAuthz(st BlobStore, access Accesses, sel NodeSelector) *Authz {
	return &Authz{st: st, access: access, sel: sel, idx: newBlobIndex(), fresh: map[string]map[string]bool{}, inflight: map[string]map[string]int{}}
}

// Authorize gives caller blob digest when an artifact holding it allows
// it (the type's rules). The artifacts are tried public first; an error
// reading the cluster is returned only when no artifact allowed the blob.
func (a *Authz) Authorize(ctx context.Context, caller p2p.Identity, digest string) error {
	names, err := a.holders(digest)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return fmt.Errorf("blob %s: no artifact here holds it: %w", digest, cachestore.ErrNotFound)
	}
	var owners []string // the ModelCaches of the private artifacts that hold it
	for _, n := range names {
		ac, ok := a.access.Access(n)
		switch {
		case !ok:
			// No desire says whether it is private: it is not given.
		case ac.Public:
			return nil
		case ac.ModelCache != "" && !slices.Contains(owners, ac.ModelCache):
			owners = append(owners, ac.ModelCache)
		}
	}
	if caller.Node == "" {
		return fmt.Errorf("blob %s: private here, and the caller's token is bound to no node: %w", digest, p2p.ErrForbidden)
	}
	if len(owners) == 0 {
		return fmt.Errorf("blob %s: of artifacts %v, none public, and none of a ModelCache: %w", digest, names, p2p.ErrForbidden)
	}
	// The token must come from what it is bound to: a node's peer
	// address is its own claim, so a token sent there could be replayed
	// from it.
	bound := k8ssync.Bound{Namespace: caller.Namespace, Pod: caller.Pod, PodUID: caller.PodUID, Node: caller.Node}
	switch from, err := a.sel.From(ctx, bound, caller.Source); {
	case err != nil:
		return fmt.Errorf("blob %s: is %s an address of %s: %w", digest, caller.Source, boundName(bound), err)
	case !from:
		return fmt.Errorf("blob %s: the request comes from %s, not an address of %s: %w", digest, caller.Source, boundName(bound), p2p.ErrSourceMismatch)
	}
	var undecided error
	for _, mc := range owners {
		ok, err := a.sel.Selects(ctx, mc, caller.Node)
		if err != nil {
			undecided = fmt.Errorf("blob %s: does ModelCache %s select node %s: %w", digest, mc, caller.Node, err)
			continue
		}
		if ok {
			return nil
		}
	}
	if undecided != nil {
		return undecided
	}
	return fmt.Errorf("blob %s: of artifacts %v, none public, and no ModelCache of theirs selects node %s: %w", digest, names, caller.Node, p2p.ErrForbidden)
}

// Fetched records that the pull of artifact fetched blob digest (Fetch):
// until a version of artifact holds it, it is that artifact's. Nothing
// when a is nil (a static fleet).
func (a *Authz) Fetched(digest, artifact string) {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fresh[digest] == nil {
		a.fresh[digest] = map[string]bool{}
	}
	a.fresh[digest][artifact] = true
}

// Fresh is the artifacts whose pulls fetched digest (Fetched) and that
// no indexed version of theirs held at the index's last update, sorted.
func (a *Authz) Fresh(digest string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Sorted(maps.Keys(a.fresh[digest]))
}

// Fetching records that the pull of artifact is fetching blob digest
// now: until done is called the blob is that artifact's too, so that
// what it has written so far goes to the nodes the artifact may go to,
// and to no other. Call done once the fetch ended (after Fetched, when
// it committed). Nothing when a is nil (a static fleet).
func (a *Authz) Fetching(digest, artifact string) (done func()) {
	if a == nil {
		return func() {}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inflight[digest] == nil {
		a.inflight[digest] = map[string]int{}
	}
	a.inflight[digest][artifact]++
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		if a.inflight[digest][artifact]--; a.inflight[digest][artifact] <= 0 {
			delete(a.inflight[digest], artifact)
		}
		if len(a.inflight[digest]) == 0 {
			delete(a.inflight, digest)
		}
	}
}

// holders are the artifacts that hold digest here, sorted: the versions'
// (the index brought up to date first), the fresh blobs' of pulls and the
// blobs pulls are fetching now.
func (a *Authz) holders(digest string) ([]string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	changed, err := a.idx.update(a.st)
	if err != nil {
		return nil, err
	}
	if changed {
		a.prune()
	}
	out := map[string]bool{}
	for n := range a.idx.holders[digest] {
		out[n] = true
	}
	for n := range a.fresh[digest] {
		out[n] = true
	}
	for n := range a.inflight[digest] {
		out[n] = true
	}
	return slices.Sorted(maps.Keys(out)), nil
}

// prune drops the fresh blobs that a version of their artifact now holds,
// and those gone from the store (a failed pull's, collected); called with
// a.mu held when the versions changed.
func (a *Authz) prune() {
	for d, arts := range a.fresh {
		for n := range arts {
			if a.idx.holders[d][n] > 0 {
				delete(arts, n)
			}
		}
		if len(arts) == 0 || !a.st.HasBlob(d) {
			delete(a.fresh, d)
		}
	}
}

// blobIndex maps each blob to the artifacts whose versions hold it. It is
// brought up to date by comparing the store's versions (its summaries,
// which the store decodes once per state of its index) with those it
// indexed: a version that appeared has its manifest read once, one that
// went has its blobs dropped. No request reads every manifest.
type blobIndex struct {
	versions map[versionKey][]string   // the blobs of each indexed version
	holders  map[string]map[string]int // digest → artifact → its indexed versions that hold it
}

// versionKey names one committed version: a version rebuilt under the
// same revision has another manifest digest.
type versionKey struct{ name, revision, manifest string }

func newBlobIndex() blobIndex {
	return blobIndex{versions: map[versionKey][]string{}, holders: map[string]map[string]int{}}
}

// update brings the index up to date with the store's versions and says
// whether it changed anything.
func (x *blobIndex) update(st BlobStore) (bool, error) {
	arts, err := st.ListSummaries()
	if err != nil {
		return false, err
	}
	// The common case first, without allocating: every version indexed,
	// and as many as indexed (so none went).
	n, same := 0, true
	for _, art := range arts {
		for _, v := range art.Versions {
			n++
			if _, ok := x.versions[versionKey{art.Name, v.Revision, v.ManifestDigest}]; !ok {
				same = false
			}
		}
	}
	if same && n == len(x.versions) {
		return false, nil
	}
	now := make(map[versionKey]bool, n)
	var added []string // artifacts with a version not indexed
	for _, art := range arts {
		for _, v := range art.Versions {
			k := versionKey{art.Name, v.Revision, v.ManifestDigest}
			now[k] = true
			if _, ok := x.versions[k]; !ok && !slices.Contains(added, art.Name) {
				added = append(added, art.Name)
			}
		}
	}
	changed := len(added) > 0
	for k, blobs := range x.versions {
		if !now[k] {
			x.drop(k, blobs)
			changed = true
		}
	}
	for _, name := range added {
		art, err := st.Get(name)
		if err != nil {
			continue // gone since the summaries: the next update drops it
		}
		for _, v := range art.Versions {
			k := versionKey{art.Name, v.Revision, v.ManifestDigest}
			if _, ok := x.versions[k]; ok || !now[k] {
				continue // indexed, or newer than the summaries: the next update adds it
			}
			set := make(map[string]bool, len(v.Manifest))
			for _, e := range v.Manifest {
				set[e.Digest] = true
			}
			blobs := slices.Collect(maps.Keys(set))
			x.versions[k] = blobs
			for _, d := range blobs {
				if x.holders[d] == nil {
					x.holders[d] = map[string]int{}
				}
				x.holders[d][art.Name]++
			}
		}
	}
	return changed, nil
}

// drop takes version k and its blobs out of the index.
func (x *blobIndex) drop(k versionKey, blobs []string) {
	delete(x.versions, k)
	for _, d := range blobs {
		if x.holders[d][k.name]--; x.holders[d][k.name] <= 0 {
			delete(x.holders[d], k.name)
		}
		if len(x.holders[d]) == 0 {
			delete(x.holders, d)
		}
	}
}
