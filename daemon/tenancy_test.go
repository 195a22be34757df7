package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/internal/testenv"
)

// privateRig is a CSI rig with two cluster desires of the same bytes: p,
// fetched with credentials and private to team-a, and q, public.
func privateRig(t *testing.T) (r *csiRig, shared []byte) {
	r, shared, _ = privateRigWith(t, csiConfig(t))
	return r, shared
}

func privateRigWith(t *testing.T, cfg Config) (r *csiRig, shared []byte, srv *fileServer) {
	shared = data(6000, 41)
	srv = newFileServer(t, map[string][]byte{"p/w.bin": shared, "q/w.bin": shared})
	r = startCSI(t, cfg)
	t.Cleanup(r.stop)
	p := clusterDesire("p", srv.URL+"/p/w.bin#sha256="+sha(shared))
	p.AllowedNamespaces = []string{"team-a"}
	q := clusterDesire("q", srv.URL+"/q/w.bin#sha256="+sha(shared))
	if err := (clusterNode{r.d}).SetClusterDesires(map[string]api.Desire{"p": p, "q": q}, nil); err != nil {
		t.Fatal(err)
	}
	r.waitPhase("p", api.PhaseReady)
	r.waitPhase("q", api.PhaseReady)
	return r, shared, srv
}

// publishAs publishes volume id for a pod of namespace ns.
func (r *csiRig) publishAs(ns, id, target string, attrs map[string]string) error {
	attrs["csi.storage.k8s.io/pod.namespace"] = ns
	return r.publish(id, target, attrs)
}

// TestCSIPrivateArtifactOnlyToAllowedNamespaces: a pod of a namespace the
// private artifact's desire does not allow is refused (PermissionDenied
// naming the model and the pod's namespace, nothing else), and holds
// nothing; the NotFound answer a pod of that namespace gets for an
// unknown model lists only what it may mount; a pod of team-a mounts it
// and reads its bytes; the public artifact mounts in any namespace.
func TestCSIPrivateArtifactOnlyToAllowedNamespaces(t *testing.T) {
	r, shared := privateRig(t)

	tb := r.target("uid-b", "model")
	err := r.publishAs("team-b", "vol-b", tb, map[string]string{"modelCache": "p"})
	msg := status.Convert(err).Message()
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(msg, "model p ") || !strings.Contains(msg, `"team-b"`) {
		t.Fatalf("a pod of team-b asked for team-a's private model: %v, want PermissionDenied naming p and team-b", err)
	}
	if strings.Contains(msg, "team-a") {
		t.Errorf("the refusal names the namespaces that may mount it: %s", msg)
	}
	if isMounted(t, tb) || len(holders(t, r.harness, "p")) != 0 {
		t.Fatal("a refused publish mounted or holds the private model")
	}
	// Without the pod's namespace (a CSIDriver without podInfoOnMount):
	// refused too.
	err = r.publish("vol-none", tb, map[string]string{"modelCache": "p", "csi.storage.k8s.io/pod.namespace": ""})
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), "podInfoOnMount") {
		t.Fatalf("a pod of no known namespace: %v, want PermissionDenied naming podInfoOnMount", err)
	}

	err = r.publishAs("team-b", "vol-x", tb, map[string]string{"modelCache": "nope"})
	msg = status.Convert(err).Message()
	if status.Code(err) != codes.NotFound || !strings.Contains(msg, "can mount: q") || strings.Contains(msg, "p,") || strings.Contains(msg, ", p") {
		t.Fatalf("NotFound for team-b: %v, want it to list q and not p", err)
	}
	if err := r.publishAs("team-a", "vol-x", tb, map[string]string{"modelCache": "nope"}); !strings.Contains(status.Convert(err).Message(), "can mount: p, q") {
		t.Fatalf("NotFound for team-a: %v, want it to list p and q", err)
	}

	ta := r.target("uid-a", "model")
	if err := r.publishAs("team-a", "vol-a", ta, map[string]string{"modelCache": "p"}); err != nil {
		t.Fatalf("a pod of team-a: %v", err)
	}
	if got := files(t, ta); got["w.bin"] != string(shared) {
		t.Fatal("team-a's pod does not read the private model's bytes")
	}
	if got := holders(t, r.harness, "p"); len(got) != 1 || !strings.HasPrefix(got[0], "pod team-a/") {
		t.Fatalf("holders of p: %v", got)
	}
	tq := r.target("uid-q", "model")
	if err := r.publishAs("team-b", "vol-q", tq, map[string]string{"modelCache": "q"}); err != nil {
		t.Fatalf("the public model in team-b: %v", err)
	}
	r.unpublishGone("vol-a", ta)
	r.unpublishGone("vol-q", tq)
	r.released("p", "q")
}

// TestPrivateTreesNotReadableByLocalUsers: on the node a local user (uid
// 65534) reads the public artifact's file, but neither the private
// artifact's tree nor any blob by its digest, though it is the same
// inode; a pod of team-a reads the private model through its volume as
// that same uid (its own tree, reachable only through the bind mount).
// The directories above the store are opened to everyone first, so that
// only the store's own modes stand in the way.
func TestPrivateTreesNotReadableByLocalUsers(t *testing.T) {
	r, shared := privateRig(t)
	root := r.cfg.Root
	openAbove(filepath.Dir(root))
	openAbove(r.pods)
	read := func(p string) error { return readAs(t, 65534, 65534, p, shared) }
	p, _ := r.c.Get(context.Background(), "p")
	q, _ := r.c.Get(context.Background(), "q")
	pTree := r.d.store.TreePath("model", "p", p.Revision)
	qTree := r.d.store.TreePath("model", "q", q.Revision)
	if fi, err := os.Stat(pTree); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the private version's tree: %v %v, want mode 0700", fi.Mode(), err)
	}
	if err := read(filepath.Join(qTree, "w.bin")); err != nil {
		t.Fatalf("the public model is not readable by a local user: %v", err)
	}
	if err := read(filepath.Join(pTree, "w.bin")); err == nil {
		t.Fatal("a local user read the private model's tree")
	}
	if err := read(filepath.Join(filepath.Dir(pTree), "current", "w.bin")); err == nil {
		t.Fatal("a local user read the private model through current")
	}
	if want := filepath.Join(root, "private", "models", "p", p.Revision); pTree != want {
		t.Fatalf("the private model's tree is at %s, want %s (no local PV may name private/)", pTree, want)
	}
	if _, err := os.Lstat(filepath.Join(root, "models", "p")); !os.IsNotExist(err) {
		t.Fatalf("models/p exists beside the private tree: %v", err)
	}
	blob, _ := r.d.store.BlobPath("sha256:" + sha(shared))
	if err := read(blob); err == nil {
		t.Fatal("a local user read a blob by its digest")
	}

	ta := r.target("uid-a", "model")
	os.Chmod(filepath.Dir(ta), 0o755)
	os.Chmod(filepath.Dir(filepath.Dir(ta)), 0o755)
	os.Chmod(filepath.Dir(filepath.Dir(filepath.Dir(ta))), 0o755)
	os.Chmod(filepath.Dir(filepath.Dir(filepath.Dir(filepath.Dir(ta)))), 0o755)
	if err := r.publishAs("team-a", "vol-a", ta, map[string]string{"modelCache": "p"}); err != nil {
		t.Fatal(err)
	}
	if err := read(filepath.Join(ta, "w.bin")); err != nil {
		t.Fatalf("team-a's pod (uid 65534) cannot read the private model through its volume: %v", err)
	}
	r.unpublishGone("vol-a", ta)
}

// allowing returns a func that sets ds, the daemon's one cluster desire,
// with the namespaces given (none: public).
func allowing(t *testing.T, d *Daemon, ds api.Desire) func(...string) {
	return func(allowed ...string) {
		ds.AllowedNamespaces = allowed
		if err := (clusterNode{d}).SetClusterDesires(map[string]api.Desire{ds.Name: ds}, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// openAbove makes dir and the directories above it (up to the temp dir)
// traversable by everyone: the test's own directories, so that only the
// store's modes stand between a local user and a file.
func openAbove(dir string) {
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
}

// readAs reads path as uid:gid with no supplementary groups (setpriv):
// nil when it reads exactly want, ErrPermission when it cannot read it.
func readAs(t *testing.T, uid, gid int, path string, want []byte) error {
	t.Helper()
	setpriv := testenv.Require(t, "setpriv", "apt-get install util-linux")
	out, err := exec.Command(setpriv, fmt.Sprintf("--reuid=%d", uid), fmt.Sprintf("--regid=%d", gid), "--clear-groups", "cat", path).CombinedOutput()
	if err != nil {
		return &os.PathError{Op: fmt.Sprintf("read as %d:%d", uid, gid), Path: path, Err: os.ErrPermission}
	}
	if string(out) != string(want) {
		t.Fatalf("%s as %d:%d: other bytes", path, uid, gid)
	}
	return nil
}

// TestLocalGroupReadsAPrivateTree: a models.d desire that names a local
// group is private to it: its tree is 0750 of that group, a member reads
// it and another local user does not, and no pod mounts it; a group the
// node does not have is refused, naming it.
func TestLocalGroupReadsAPrivateTree(t *testing.T) {
	g, err := user.LookupGroupId("65534")
	if err != nil {
		testenv.Missing(t, "a group of gid 65534 (nogroup)", "Debian has it")
	}
	w := data(3000, 46)
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	cfg := csiConfig(t)
	if err := os.MkdirAll(cfg.ModelsDir, 0o755); err != nil {
		t.Fatal(err)
	}
	file := func(name, group string) {
		y := fmt.Sprintf("name: %s\nuri: %s/w.bin#sha256=%s\nlocalGroup: %q\n", name, srv.URL, sha(w), group)
		if err := os.WriteFile(filepath.Join(cfg.ModelsDir, name+".yaml"), []byte(y), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	file("m", g.Name)
	r := startCSI(t, cfg)
	defer r.stop()
	a := r.waitPhase("m", api.PhaseReady)
	tree := r.d.store.TreePath("model", "m", a.Revision)
	openAbove(filepath.Dir(r.cfg.Root))
	testenv.Eventually(t, "the tree 0750 of the group", 10*time.Second, func() error {
		fi, err := os.Stat(tree)
		if err != nil {
			return err
		}
		if st := fi.Sys().(*syscall.Stat_t); fi.Mode().Perm() != 0o750 || st.Gid != 65534 {
			return fmt.Errorf("mode %v gid %d", fi.Mode().Perm(), st.Gid)
		}
		return nil
	})
	if err := readAs(t, 65534, 65534, filepath.Join(tree, "w.bin"), w); err != nil {
		t.Fatalf("a member of the group: %v", err)
	}
	if err := readAs(t, 65534, 1, filepath.Join(tree, "w.bin"), w); err == nil {
		t.Fatal("a local user outside the group read the tree")
	}
	err = r.publishAs("ml", "vol-1", r.target("uid-1", "model"), map[string]string{"modelCache": "m"})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a pod mounted a model private to a local group: %v", err)
	}
	file("bad", "no-such-group-here")
	if _, err := (modelsDir{r.d}).parse(filepath.Join(cfg.ModelsDir, "bad.yaml")); err == nil || !strings.Contains(err.Error(), `localGroup: "no-such-group-here": no such group`) {
		t.Fatalf("a models.d desire naming a group the node lacks: %v", err)
	}
}

// TestTreeModesFollowTheDesire: a public artifact whose desire becomes
// private (its ModelCache gained credentials) has its trees closed at the
// next pass, and opened again when it is public once more.
func TestTreeModesFollowTheDesire(t *testing.T) {
	w := data(3000, 43)
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	h := start(t, testConfig(t))
	defer h.stop()
	set := allowing(t, h.d, clusterDesire("m", srv.URL+"/w.bin#sha256="+sha(w)))
	set()
	a := h.waitPhase("m", api.PhaseReady)
	public := filepath.Join(h.cfg.Root, "models", "m", a.Revision)
	private := filepath.Join(h.cfg.Root, "private", "models", "m", a.Revision)
	// is checks that the tree is at dir, with mode, and nowhere else.
	is := func(dir string, mode os.FileMode) error {
		if got := h.d.store.TreePath("model", "m", a.Revision); got != dir {
			return fmt.Errorf("the store says the tree is at %s, want %s", got, dir)
		}
		fi, err := os.Stat(dir)
		if err != nil {
			return err
		}
		if fi.Mode().Perm() != mode {
			return fmt.Errorf("%s: mode %v, want %v", dir, fi.Mode().Perm(), mode)
		}
		other := map[string]string{public: private, private: public}[dir]
		if _, err := os.Lstat(filepath.Dir(other)); !os.IsNotExist(err) {
			return fmt.Errorf("%s is there too: %v", filepath.Dir(other), err)
		}
		return nil
	}
	if err := is(public, 0o755); err != nil {
		t.Fatalf("a public tree: %v", err)
	}
	set("team-a")
	testenv.Eventually(t, "the tree closed, under private/ (no local PV may name it)", 10*time.Second, func() error { return is(private, 0o700) })
	set()
	testenv.Eventually(t, "the tree open again, under models/", 10*time.Second, func() error { return is(public, 0o755) })
}

// TestPrivateHFModelHasNoHFView: the hf/ view is world-readable by
// design; a private hub model gets none (its pods read it through their
// volume), a public one of the same hub does.
func TestPrivateHFModelHasNoHFView(t *testing.T) {
	h, hub := startWithHub(t)
	hub.Commit("acme/private", hubModel(1, 5), "main")
	hub.Commit("acme/public", hubModel(1, 6), "main")
	p := clusterDesire("p", "hf://acme/private")
	p.AllowedNamespaces = []string{"team-a"}
	if err := (clusterNode{h.d}).SetClusterDesires(map[string]api.Desire{"p": p, "q": clusterDesire("q", "hf://acme/public")}, nil); err != nil {
		t.Fatal(err)
	}
	h.waitPhase("p", api.PhaseReady)
	h.waitPhase("q", api.PhaseReady)
	if _, err := os.Stat(filepath.Join(h.cfg.Root, "hf", "models--acme--public")); err != nil {
		t.Fatalf("the public model's hf/ view: %v", err)
	}
	if _, err := os.Stat(filepath.Join(h.cfg.Root, "hf", "models--acme--private")); !os.IsNotExist(err) {
		t.Fatalf("a private model has an hf/ view: %v", err)
	}
}

// TestTreeStaysOpenWhileAPodMountsIt: a public model that a pod mounts
// directly, and whose desire then becomes private, keeps its tree open
// while the volume is there (the pod, of any uid, keeps reading it), and
// closes once the volume goes; a new pod of another namespace is refused.
func TestTreeStaysOpenWhileAPodMountsIt(t *testing.T) {
	w := data(2000, 44)
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	r := startCSI(t, csiConfig(t))
	defer r.stop()
	set := allowing(t, r.d, clusterDesire("m", srv.URL+"/w.bin#sha256="+sha(w)))
	set()
	a := r.waitPhase("m", api.PhaseReady)
	target := r.target("uid-1", "model")
	if err := r.publishAs("team-b", "vol-1", target, map[string]string{"modelCache": "m"}); err != nil {
		t.Fatal(err)
	}
	set("team-a")
	r.d.modes.all() // what the pass after the change does
	// The tree moved under private/; the pod's bind mount went with it.
	tree := r.d.store.TreePath("model", "m", a.Revision)
	if !strings.HasPrefix(tree, filepath.Join(r.cfg.Root, "private")+"/") {
		t.Fatalf("a private artifact's tree is at %s, not under private/", tree)
	}
	if fi, err := os.Stat(tree); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("the tree a pod mounts was closed under it: %v %v", fi.Mode(), err)
	}
	if got, err := os.ReadFile(filepath.Join(target, "w.bin")); err != nil || string(got) != string(w) {
		t.Fatalf("the pod's volume after its tree moved: %v", err)
	}
	if err := r.publishAs("team-b", "vol-2", r.target("uid-2", "model"), map[string]string{"modelCache": "m"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a new pod of team-b: %v, want PermissionDenied", err)
	}
	r.unpublishGone("vol-1", target)
	testenv.Eventually(t, "the tree closed once the volume went", 10*time.Second, func() error {
		if fi, err := os.Stat(tree); err != nil || fi.Mode().Perm() != 0o700 {
			return &os.PathError{Op: "mode", Path: tree, Err: os.ErrInvalid}
		}
		return nil
	})
}

// TestPrivacyOutlivesARestart: the allow-list is kept with the desire: a
// daemon restarted without the cluster (no new desires) still refuses a
// pod of another namespace, and the origin is not needed for it.
func TestPrivacyOutlivesARestart(t *testing.T) {
	cfg := csiConfig(t)
	r, _, srv := privateRigWith(t, cfg)
	r.stop()
	srv.Close()
	r = startCSI(t, cfg)
	defer r.stop()
	tb := r.target("uid-b", "model")
	if err := r.publishAs("team-b", "vol-b", tb, map[string]string{"modelCache": "p"}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("after a restart a pod of team-b: %v, want PermissionDenied", err)
	}
	ta := r.target("uid-a", "model")
	if err := r.publishAs("team-a", "vol-a", ta, map[string]string{"modelCache": "p"}); err != nil {
		t.Fatalf("after a restart a pod of team-a: %v", err)
	}
	r.unpublishGone("vol-a", ta)
}

// TestCSIUndeclaredArtifactNotMountable: an artifact whose owner let go
// of it (the ModelCache is gone; its bytes stay as cache until space is
// needed) mounts in no pod: a pod cannot hold what nobody declares, so
// that it is never evicted.
func TestCSIUndeclaredArtifactNotMountable(t *testing.T) {
	w := data(2000, 45)
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	r := startCSI(t, csiConfig(t))
	defer r.stop()
	allowing(t, r.d, clusterDesire("m", srv.URL+"/w.bin#sha256="+sha(w)))()
	r.waitPhase("m", api.PhaseReady)
	if err := (clusterNode{r.d}).SetClusterDesires(map[string]api.Desire{}, nil); err != nil {
		t.Fatal(err)
	}
	if a, err := r.d.store.Summary("m"); err != nil || len(a.Versions) == 0 {
		t.Fatalf("the test needs m still stored after its desire went: %+v %v", a, err)
	}
	err := r.publish("vol-1", r.target("uid-1", "model"), map[string]string{"modelCache": "m"})
	if status.Code(err) != codes.NotFound || !strings.Contains(status.Convert(err).Message(), "not declared") {
		t.Fatalf("a pod mounted an artifact nobody declares: %v, want NotFound", err)
	}
}

// TestInspectHidesAPrivateModelsFiles: over the socket, which any local
// user may read, inspect of a private model shows its files and metadata
// only to a peer that may mutate (root here); a local user (uid 65534)
// gets none of them, and the public model's files in full.
func TestInspectHidesAPrivateModelsFiles(t *testing.T) {
	r, _ := privateRig(t)
	get := func(name string, uid uint32) *api.Artifact {
		req := httptest.NewRequest("GET", "/v1/artifacts/"+name, nil)
		req.SetPathValue("name", name)
		req = req.WithContext(context.WithValue(req.Context(), credKey{}, &peer{Ucred: unix.Ucred{Uid: uid, Gid: uid}}))
		rec := httptest.NewRecorder()
		if err := viewsOf(r.d).handleGet(rec, req); err != nil {
			t.Fatal(err)
		}
		var a api.Artifact
		if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil || len(a.Versions) == 0 {
			t.Fatalf("%s: %v %s", name, err, rec.Body.String())
		}
		return &a
	}
	if a := get("p", 0); len(a.Versions[0].Files) == 0 {
		t.Fatal("root does not see the private model's files")
	}
	if a := get("p", 65534); len(a.Versions[0].Files) != 0 || a.Metadata != nil {
		t.Fatalf("a local user sees the private model's files: %+v", a.Versions[0].Files)
	}
	if a := get("q", 65534); len(a.Versions[0].Files) == 0 {
		t.Fatal("a local user does not see the public model's files")
	}
}

// TestNewOpensPublicTreesBeforeServing: startup repair rebuilds a lost
// tree closed (0700, cachestore); New opens a public model's tree before
// the daemon serves anything, and leaves a private one closed.
func TestNewOpensPublicTreesBeforeServing(t *testing.T) {
	cfg := testConfig(t)
	w := data(2000, 46)
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	h := start(t, cfg)
	a, err := h.pull(api.PullRequest{Name: "pub", URI: srv.URL + "/w.bin#sha256=" + sha(w)})
	if err != nil {
		t.Fatal(err)
	}
	tree := h.d.store.TreePath(cachestore.KindModel, "pub", a.Revision)
	h.stop()
	if err := os.Chmod(tree, 0o700); err != nil { // as repair leaves a tree it rebuilt
		t.Fatal(err)
	}
	d, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d.store.Close()
	if fi, err := os.Stat(tree); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("a public model's tree after New: %v %v, want 0755 before anything is served", fi.Mode(), err)
	}
}
