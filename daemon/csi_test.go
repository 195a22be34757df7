package daemon

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/csi"
	"github.com/modelcache/modelcache/internal/testenv"
)

// csiRig is a daemon serving the CSI driver (Run's --csi-socket path) and
// a client of it, with a pods directory of the test's own.
type csiRig struct {
	*harness
	node csipb.NodeClient
	pods string
}

func csiConfig(t testing.TB) Config {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (to bind-mount CSI volumes)", "run the tests as root, as CI does")
	}
	cfg := testConfig(t)
	dir := t.TempDir()
	cfg.CSI = &csi.Config{Socket: filepath.Join(dir, "csi.sock"), PodsDir: filepath.Join(dir, "pods"), NodeID: "node-a"}
	if err := os.MkdirAll(cfg.CSI.PodsDir, 0o750); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func startCSI(t testing.TB, cfg Config) *csiRig {
	t.Helper()
	h := start(t, cfg)
	conn, err := grpc.NewClient("unix://"+cfg.CSI.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r := &csiRig{harness: h, node: csipb.NewNodeClient(conn), pods: cfg.CSI.PodsDir}
	testenv.Eventually(t, "the CSI socket answers", 10*time.Second, func() error {
		_, err := r.node.NodeGetInfo(context.Background(), &csipb.NodeGetInfoRequest{})
		return err
	})
	return r
}

// target is where kubelet would publish volume vol of pod uid (kubelet
// makes the parent; the driver makes the mount directory). A mount a
// failed test leaves there is detached at its end.
func (r *csiRig) target(uid, vol string) string {
	dir := filepath.Join(r.pods, uid, "volumes", "kubernetes.io~csi", vol)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		r.t.Fatal(err)
	}
	target := filepath.Join(dir, "mount")
	r.t.Cleanup(func() {
		for isMounted(r.t, target) && syscall.Unmount(target, syscall.MNT_DETACH) == nil {
		}
	})
	return target
}

func (r *csiRig) publish(id, target string, attrs map[string]string) error {
	ctx := map[string]string{"csi.storage.k8s.io/ephemeral": "true", "csi.storage.k8s.io/pod.namespace": "ml", "csi.storage.k8s.io/pod.name": "pod-" + id, "csi.storage.k8s.io/pod.uid": "uid-" + id}
	for k, v := range attrs {
		ctx[k] = v
	}
	_, err := r.node.NodePublishVolume(context.Background(), &csipb.NodePublishVolumeRequest{
		VolumeId: id, TargetPath: target, Readonly: true, VolumeContext: ctx,
		VolumeCapability: &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
			AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}},
	})
	return err
}

func (r *csiRig) unpublish(id, target string) error {
	_, err := r.node.NodeUnpublishVolume(context.Background(), &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	return err
}

// unpublishGone unpublishes a volume and checks its mount is gone.
func (r *csiRig) unpublishGone(id, target string) {
	r.t.Helper()
	if err := r.unpublish(id, target); err != nil {
		r.t.Fatal(err)
	}
	if isMounted(r.t, target) {
		r.t.Fatalf("%s still mounted after unpublish", target)
	}
}

// released checks that nothing holds the artifacts names any more and
// that no hold record is left, in the index or under holds/.
func (r *csiRig) released(names ...string) {
	r.t.Helper()
	for _, n := range names {
		if got := holders(r.t, r.harness, n); len(got) != 0 {
			r.t.Fatalf("%s still held: %v", n, got)
		}
	}
	if raw, _ := r.d.records.Holds(); len(raw) != 0 {
		r.t.Fatalf("hold records left in the index: %v", raw)
	}
	if ents, _ := os.ReadDir(filepath.Join(r.cfg.Root, "holds")); len(ents) != 0 {
		r.t.Fatalf("holds/ keeps %d entries", len(ents))
	}
}

func isMounted(t testing.TB, p string) bool {
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(l); len(f) > 4 && f[4] == p {
			return true
		}
	}
	return false
}

// files lists the regular files under dir with their contents.
func files(t testing.TB, dir string) map[string]string {
	out := map[string]string{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		out[rel] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func holders(t testing.TB, h *harness, name string) []string {
	t.Helper()
	a, err := h.c.Get(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, x := range a.InUse {
		out = append(out, x.String()+"@"+x.Revision)
	}
	sort.Strings(out)
	return out
}

// TestCSIPublishHoldsTheRevision: the pod's path shows exactly the
// revision's files, read-only; when current moves on the mount stays on
// its revision, which eviction does not take; unpublish unmounts and
// releases, and the old revision goes.
func TestCSIPublishHoldsTheRevision(t *testing.T) {
	v1a, v1b, v2 := data(4000, 1), data(3000, 2), data(5000, 3)
	srv := newFileServer(t, map[string][]byte{"v1/a.bin": v1a, "v1/b.bin": v1b, "v2/a.bin": v2})
	cfg := csiConfig(t)
	cfg.Capacity.KeepRevisions = 0 // an old revision goes as soon as nothing holds it
	cfg.Capacity.MinAge = 0
	r := startCSI(t, cfg)
	defer r.stop()
	if _, err := r.pull(api.PullRequest{Name: "m", URI: srv.URL + "/v1/a.bin#sha256=" + sha(v1a)}); err != nil {
		t.Fatal(err)
	}
	a1, _ := r.c.Get(context.Background(), "m")
	rev1 := a1.Revision

	target := r.target("uid-1", "model")
	if err := r.publish("vol-1", target, map[string]string{"modelCache": "m"}); err != nil {
		t.Fatal(err)
	}
	if err := r.publish("vol-1", target, map[string]string{"modelCache": "m"}); err != nil { // kubelet retries
		t.Fatalf("a repeated publish: %v", err)
	}
	if !isMounted(t, target) {
		t.Fatal("target is not a mount point")
	}
	if got := files(t, target); len(got) != 1 || got["a.bin"] != string(v1a) {
		t.Fatalf("mount shows %d files, want exactly a.bin of %s", len(got), rev1)
	}
	if err := os.WriteFile(filepath.Join(target, "a.bin"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write into the mount: %v, want EROFS", err)
	}
	if err := os.WriteFile(filepath.Join(target, "new"), []byte("x"), 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("create in the mount: %v, want EROFS", err)
	}
	if got := holders(t, r.harness, "m"); len(got) != 1 || got[0] != "pod ml/pod-vol-1@"+rev1 {
		t.Fatalf("inUse %v, want the pod holding %s", got, rev1)
	}

	// current moves on (a refresh to another source).
	if _, err := r.pull(api.PullRequest{Name: "m", URI: srv.URL + "/v2/a.bin#sha256=" + sha(v2), Replace: true}); err != nil {
		t.Fatal(err)
	}
	if a, _ := r.c.Get(context.Background(), "m"); a.Revision == rev1 {
		t.Fatal("current did not move")
	}
	if _, err := r.d.space.evictPass(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	if got := files(t, target); got["a.bin"] != string(v1a) {
		t.Fatal("after current moved, the mount no longer shows the old revision")
	}
	if _, err := os.Stat(r.d.store.TreePath("model", "m", rev1)); err != nil {
		t.Fatalf("the held revision was evicted: %v", err)
	}
	// A second pod gets the new current; the first keeps its own.
	target2 := r.target("uid-2", "model")
	if err := r.publish("vol-2", target2, map[string]string{"modelCache": "m"}); err != nil {
		t.Fatal(err)
	}
	if got := files(t, target2); got["a.bin"] != string(v2) {
		t.Fatal("a new pod does not get the new current")
	}
	// The old revision is no longer declared (the desire moved on): a
	// pod cannot name it and so keep it from eviction for ever; the
	// current one by name is honoured.
	target3 := r.target("uid-3", "model")
	err := r.publish("vol-3", target3, map[string]string{"modelCache": "m", "revision": rev1})
	if status.Code(err) != codes.NotFound || !strings.Contains(status.Convert(err).Message(), "not one its owner declares") {
		t.Fatalf("a pod named a revision its owner let go of: %v, want NotFound", err)
	}
	a2, _ := r.c.Get(context.Background(), "m")
	if err := r.publish("vol-3", target3, map[string]string{"modelCache": "m", "revision": a2.Revision}); err != nil {
		t.Fatal(err)
	}
	if got := files(t, target3); got["a.bin"] != string(v2) {
		t.Fatal("revision attribute not honoured")
	}

	for _, v := range []struct{ id, target string }{{"vol-1", target}, {"vol-3", target3}, {"vol-2", target2}} {
		if err := r.unpublish(v.id, v.target); err != nil {
			t.Fatal(err)
		}
		if isMounted(t, v.target) {
			t.Fatalf("%s still mounted after unpublish", v.target)
		}
		if _, err := os.Stat(v.target); !os.IsNotExist(err) {
			t.Fatalf("%s left behind: %v", v.target, err)
		}
	}
	if err := r.unpublish("vol-1", target); err != nil { // idempotent
		t.Fatalf("a repeated unpublish: %v", err)
	}
	if got := holders(t, r.harness, "m"); len(got) != 0 {
		t.Fatalf("holds after unpublish: %v", got)
	}
	if _, err := r.d.space.evictPass(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(r.d.store.TreePath("model", "m", rev1)); !os.IsNotExist(err) {
		t.Fatalf("the released old revision is still there after an eviction pass: %v", err)
	}
}

// TestCSIRestartKeepsHolds: a daemon restart between publish and
// unpublish loses no hold and leaves no mount; a volume whose mount went
// while the daemon was down is released at start.
func TestCSIRestartKeepsHolds(t *testing.T) {
	w := data(4000, 5)
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	cfg := csiConfig(t)
	r := startCSI(t, cfg)
	if _, err := r.pull(api.PullRequest{Name: "m", URI: srv.URL + "/w.bin#sha256=" + sha(w)}); err != nil {
		t.Fatal(err)
	}
	t1, t2 := r.target("uid-1", "model"), r.target("uid-2", "model")
	for i, tg := range []string{t1, t2} {
		if err := r.publish([]string{"vol-1", "vol-2"}[i], tg, map[string]string{"modelCache": "m"}); err != nil {
			t.Fatal(err)
		}
	}
	r.stop()
	if !isMounted(t, t1) {
		t.Fatal("stopping the daemon unmounted a pod's volume")
	}
	// Pod 2 went while the daemon was down (its mount with it).
	if err := syscall.Unmount(t2, 0); err != nil {
		t.Fatal(err)
	}
	r = startCSI(t, cfg)
	defer r.stop()
	got := holders(t, r.harness, "m")
	if len(got) != 1 || !strings.Contains(got[0], "ml/pod-vol-1@") {
		t.Fatalf("after restart inUse is %v, want pod-vol-1 only", got)
	}
	r.unpublishGone("vol-1", t1)
	r.released("m")
}

// TestCSIPublishWhileDownloading: Unavailable with the progress, then a
// success once Ready.
func TestCSIPublishWhileDownloading(t *testing.T) {
	w := data(1<<20, 6)
	gate := make(chan struct{})
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	srv.hook = func(rw http.ResponseWriter, r *http.Request) bool {
		if r.Method == http.MethodGet {
			<-gate
		}
		return false
	}
	r := startCSI(t, csiConfig(t))
	defer r.stop()
	if _, err := r.c.Pull(context.Background(), api.PullRequest{Name: "m", URI: srv.URL + "/w.bin#sha256=" + sha(w)}, false, nil); err != nil {
		t.Fatal(err)
	}
	r.waitPhase("m", api.PhaseDownloading)
	target := r.target("uid-1", "model")
	err := r.publish("vol-1", target, map[string]string{"modelCache": "m"})
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "model m downloading") {
		t.Fatalf("publish while downloading: %v, want Unavailable with progress", err)
	}
	t.Logf("kubelet would show: %s", status.Convert(err).Message())
	if isMounted(t, target) {
		t.Fatal("mounted while not Ready")
	}
	if got := holders(t, r.harness, "m"); len(got) != 0 {
		t.Fatalf("a failed publish holds: %v", got)
	}
	close(gate)
	testenv.Eventually(t, "publish once Ready", 30*time.Second, func() error {
		err := r.publish("vol-1", target, map[string]string{"modelCache": "m"})
		if err != nil && status.Code(err) != codes.Unavailable {
			t.Fatal(err)
		}
		return err
	})
	if got := files(t, target); got["w.bin"] != string(w) {
		t.Fatal("mount after Ready does not show the model")
	}
	if err := r.unpublish("vol-1", target); err != nil {
		t.Fatal(err)
	}
}

// TestCSIRefusals: what a pod may not ask, with the code kubelet sees and
// a message naming the problem.
func TestCSIRefusals(t *testing.T) {
	w := data(1000, 7)
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	cfg := csiConfig(t)
	r := startCSI(t, cfg)
	defer r.stop()
	if _, err := r.pull(api.PullRequest{Name: "known", URI: srv.URL + "/w.bin#sha256=" + sha(w)}); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(t.TempDir(), "mount")
	escape := r.target("uid-x", "v") // then a symlink in the pods dir leading out
	link := filepath.Join(r.pods, "uid-link")
	if err := os.Symlink(filepath.Dir(outside), link); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, target string
		attrs        map[string]string
		code         codes.Code
		want         string
	}{
		{"unknown model", escape, map[string]string{"modelCache": "nope"}, codes.NotFound, `pods of namespace "ml" can mount: known`},
		{"no modelCache", escape, map[string]string{}, codes.InvalidArgument, "volumeAttributes.modelCache"},
		{"bad kernelCaches", escape, map[string]string{"modelCache": "known", "kernelCaches": "all"}, codes.InvalidArgument, "volumeAttributes.kernelCaches"},
		{"unknown attribute", escape, map[string]string{"modelCache": "known", "revison": "x"}, codes.InvalidArgument, "revison"},
		{"bad revision", escape, map[string]string{"modelCache": "known", "revision": "../x"}, codes.InvalidArgument, "volumeAttributes.revision"},
		{"revision not held", escape, map[string]string{"modelCache": "known", "revision": "abc"}, codes.NotFound, "not one its owner declares"},
		{"name with a slash", escape, map[string]string{"modelCache": "../etc"}, codes.InvalidArgument, "volumeAttributes.modelCache"},
		{"target outside pods", outside, map[string]string{"modelCache": "known"}, codes.InvalidArgument, "not under kubelet's pods directory"},
		{"target with ..", r.pods + "/a/../../x", map[string]string{"modelCache": "known"}, codes.InvalidArgument, "clean absolute path"},
		{"target through a symlink", filepath.Join(link, "mount"), map[string]string{"modelCache": "known"}, codes.InvalidArgument, "resolves outside"},
		{"persistent volume", escape, map[string]string{"modelCache": "known", "csi.storage.k8s.io/ephemeral": "false"}, codes.InvalidArgument, "ephemeral"},
	} {
		err := r.publish("vol-"+strings.ReplaceAll(c.name, " ", "-"), c.target, c.attrs)
		if status.Code(err) != c.code || !strings.Contains(status.Convert(err).Message(), c.want) {
			t.Errorf("%s: %v, want %s naming %q", c.name, err, c.code, c.want)
		}
	}
	if _, err := os.Stat(outside); !os.IsNotExist(err) {
		t.Errorf("a refused publish created %s", outside)
	}
	if got := holders(t, r.harness, "known"); len(got) != 0 {
		t.Errorf("refused publishes hold: %v", got)
	}
}

func TestCSINotReadyStatus(t *testing.T) {
	next := time.Now().Add(time.Minute)
	for _, c := range []struct {
		a    api.Artifact
		code codes.Code
		want string
	}{
		{api.Artifact{Name: "llama", Phase: api.PhaseDownloading, Progress: &api.Progress{BytesDone: 41 << 20, BytesTotal: 100 << 20}}, codes.Unavailable, "model llama downloading 41 percent, 41.0 MiB of 100.0 MiB"},
		{api.Artifact{Name: "llama", Phase: api.PhasePending, Message: "waiting for a pull slot"}, codes.Unavailable, "Pending on this node: waiting for a pull slot"},
		{api.Artifact{Name: "llama", Phase: api.PhaseFailed, Reason: "NotFound", Message: "404 from the hub"}, codes.FailedPrecondition, "model llama is Failed on this node (NotFound): 404 from the hub"},
		{api.Artifact{Name: "llama", Phase: api.PhaseFailed, Message: "connection reset", NextRetry: &next}, codes.Unavailable, "retries at"},
		{api.Artifact{Name: "kc", Phase: api.PhaseIncompatible, Message: "built for sm_90"}, codes.FailedPrecondition, "Incompatible on this node: built for sm_90"},
	} {
		err := notReadyStatus(&c.a)
		if status.Code(err) != c.code || !strings.Contains(status.Convert(err).Message(), c.want) {
			t.Errorf("%s %s: %v, want %s with %q", c.a.Name, c.a.Phase, err, c.code, c.want)
		}
		// kubelet's events take the message as a format string.
		if m := status.Convert(err).Message(); strings.Contains(m, "%") {
			t.Errorf("%s %s: %q has a %%", c.a.Name, c.a.Phase, m)
		}
	}
}

// TestCSIHoldsSurviveALostIndex: the index is lost while a pod mounts a
// revision, and the daemon rebuilds it from the trees at start. The pod's
// hold comes back (from its record under holds/, with the pod's name; or,
// with that gone too, from the mount table and kubelet's vol_data.json,
// with the pod's UID until the cluster names the pod of that UID), the
// revision survives an eviction pass that takes
// everything it can, and unpublish releases it as usual.
func TestCSIHoldsSurviveALostIndex(t *testing.T) {
	for _, c := range []struct {
		name, lose, holder string
	}{
		{"records on disk", "index.db", "pod ml/pod-vol-1@"},
		{"mount table", "index.db and holds/", "pod uid uid-1@"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, o := data(4000, 11), data(3000, 12)
			srv := newFileServer(t, map[string][]byte{"w.bin": w, "o.bin": o})
			cfg := csiConfig(t)
			cfg.Capacity.MinAge = 0
			r := startCSI(t, cfg)
			for name, uri := range map[string]string{"m": srv.URL + "/w.bin#sha256=" + sha(w), "other": srv.URL + "/o.bin#sha256=" + sha(o)} {
				if _, err := r.pull(api.PullRequest{Name: name, URI: uri}); err != nil {
					t.Fatal(err)
				}
			}
			a, _ := r.c.Get(context.Background(), "m")
			rev := a.Revision
			a, _ = r.c.Get(context.Background(), "other")
			otherRev := a.Revision
			target := r.target("uid-1", "model")
			// What kubelet writes beside the mount before it publishes.
			if err := os.WriteFile(filepath.Join(filepath.Dir(target), "vol_data.json"), []byte(`{"driverName":"csi.modelcache.io","volumeHandle":"vol-1","specVolID":"model","volumeLifecycleMode":"Ephemeral"}`), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := r.publish("vol-1", target, map[string]string{"modelCache": "m"}); err != nil {
				t.Fatal(err)
			}
			r.stop()
			if err := os.Remove(filepath.Join(cfg.Root, "index.db")); err != nil {
				t.Fatal(err)
			}
			if c.lose != "index.db" {
				if err := os.RemoveAll(filepath.Join(cfg.Root, "holds")); err != nil {
					t.Fatal(err)
				}
			}

			r = startCSI(t, cfg)
			defer r.stop()
			if got := holders(t, r.harness, "m"); len(got) != 1 || got[0] != c.holder+rev {
				t.Fatalf("after the index was rebuilt inUse is %v, want [%s%s]", got, c.holder, rev)
			}
			// The cluster sync names the node's pods by UID: a hold known
			// only by its pod's UID then shows the pod's namespace/name.
			clusterNode{r.d}.SetPodHolders(nil, map[string]string{"uid-1": "ml/pod-vol-1", "uid-2": "ml/other"})
			if got := holders(t, r.harness, "m"); len(got) != 1 || got[0] != "pod ml/pod-vol-1@"+rev {
				t.Fatalf("with the pod's UID named by the cluster inUse is %v, want [pod ml/pod-vol-1@%s]", got, rev)
			}
			if _, err := r.d.space.evictPass(context.Background(), 1<<40); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(r.d.store.TreePath("model", "other", otherRev)); !os.IsNotExist(err) {
				t.Fatalf("the eviction pass left the unheld model (%v): the test exerts no pressure", err)
			}
			if _, err := os.Stat(r.d.store.TreePath("model", "m", rev)); err != nil {
				t.Fatalf("the held revision was evicted: %v", err)
			}
			if got := files(t, target); got["w.bin"] != string(w) {
				t.Fatal("the pod's mount no longer shows the model")
			}

			r.unpublishGone("vol-1", target)
			r.released("m")
			if _, err := r.d.space.evictPass(context.Background(), 1<<40); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(r.d.store.TreePath("model", "m", rev)); !os.IsNotExist(err) {
				t.Fatalf("the released revision survived an eviction pass under pressure: %v", err)
			}
		})
	}
}

// TestCSIHoldersOncePerPod: kubelet's retries of one publish (1,000 of
// them, many at once), publishes of other volume IDs racing for the same
// target, the same volume ID at a second target (refused while the first
// is mounted), and a second volume of the same model in the same pod
// leave each pod listed once among the model's holders, and one mount
// per target.
func TestCSIHoldersOncePerPod(t *testing.T) {
	w := data(1000, 13)
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	r := startCSI(t, csiConfig(t))
	defer r.stop()
	if _, err := r.pull(api.PullRequest{Name: "m", URI: srv.URL + "/w.bin#sha256=" + sha(w)}); err != nil {
		t.Fatal(err)
	}
	target := r.target("uid-1", "model")
	const retries, parallel = 1000, 8
	errs := make(chan error, retries+parallel)
	var wg sync.WaitGroup
	for g := range parallel {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < retries; i += parallel {
				errs <- r.publish("vol-1", target, map[string]string{"modelCache": "m"})
			}
			// Another volume ID at the same target: refused, never stacked.
			err := r.publish(fmt.Sprintf("vol-other-%d", g), target, map[string]string{"modelCache": "m"})
			if status.Code(err) != codes.AlreadyExists {
				errs <- fmt.Errorf("another volume at a mounted target: %v, want AlreadyExists", err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// The same volume at another target while mounted at the first.
	if err := r.publish("vol-1", r.target("uid-1", "elsewhere"), map[string]string{"modelCache": "m"}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("the volume at a second target: %v, want FailedPrecondition", err)
	}
	// The same pod's second volume of the model.
	second := r.target("uid-1", "model-2")
	if err := r.publish("vol-2", second, map[string]string{"modelCache": "m", "csi.storage.k8s.io/pod.name": "pod-vol-1"}); err != nil {
		t.Fatal(err)
	}
	a, _ := r.c.Get(context.Background(), "m")
	if got := holders(t, r.harness, "m"); len(got) != 1 || got[0] != "pod ml/pod-vol-1@"+a.Revision {
		t.Fatalf("holders %v, want the one pod once", got)
	}
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(raw), " "+target+" "); n != 1 {
		t.Fatalf("%d mounts at the target, want 1", n)
	}
	r.unpublishGone("vol-1", target)
	if got := holders(t, r.harness, "m"); len(got) != 1 {
		t.Fatalf("with one of its volumes unpublished the pod should still hold m: %v", got)
	}
	r.unpublishGone("vol-2", second)
	r.released("m")
}
