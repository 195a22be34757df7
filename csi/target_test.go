package csi

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/modelcache/modelcache/internal/testenv"
)

// memBackend holds in memory: every volume shows tree. hold, when set,
// is called inside Hold (a test's gate).
type memBackend struct {
	tree string
	hold func(Volume)
	mu   sync.Mutex
	vols map[string]Volume
}

func (b *memBackend) Hold(_ context.Context, v Volume) (string, string, error) {
	if b.hold != nil {
		b.hold(v)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.vols == nil {
		b.vols = map[string]Volume{}
	}
	if h, ok := b.vols[v.ID]; ok {
		return h.Revision, b.tree, nil
	}
	v.Revision = "r1"
	b.vols[v.ID] = v
	return v.Revision, b.tree, nil
}

func (b *memBackend) Release(_ context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.vols, id)
	return nil
}

func (b *memBackend) Holds() ([]Volume, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []Volume
	for _, v := range b.vols {
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

func publishReq(id, target string) *csipb.NodePublishVolumeRequest {
	return &csipb.NodePublishVolumeRequest{
		VolumeId: id, TargetPath: target, Readonly: true,
		VolumeContext: map[string]string{AttrModelCache: "m", attrEphemeral: "true"},
		VolumeCapability: &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
			AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}},
	}
}

// mountUnder is a mount of the mount table under a test's directory.
type mountUnder struct{ id, parent, point string }

// mountsUnder lists the mounts under dir. A mount whose parent is mounted
// at the same point is stacked on it. (Not "a point listed twice": the
// table is read in pieces, so a mount made at a point after another went
// from it may be read beside the one that went.)
func mountsUnder(t *testing.T, dir string) []mountUnder {
	t.Helper()
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []mountUnder
	for _, l := range strings.Split(string(raw), "\n") {
		f := strings.Fields(l)
		if len(f) > 4 && strings.HasPrefix(unescapeMountinfo(f[4]), dir+"/") {
			out = append(out, mountUnder{id: f[0], parent: f[1], point: unescapeMountinfo(f[4])})
		}
	}
	return out
}

// TestPublishRacesASwappedParent: while publishes and unpublishes run, a
// goroutine swaps a parent directory of each target for a symlink to a
// decoy outside the pods directory, again and again, for seconds. No
// mount ever appears outside the pods directory (the decoy, laid out
// like the pods' directories, stays empty), no target ever has two
// mounts stacked, and each volume published unpublishes once the swaps
// stop, releasing its hold.
func TestPublishRacesASwappedParent(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (to bind-mount CSI volumes)", "run the tests as root, as CI does")
	}
	dir := t.TempDir()
	pods, decoy, tree := filepath.Join(dir, "pods"), filepath.Join(dir, "decoy"), filepath.Join(dir, "tree")
	if err := os.MkdirAll(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(tree, "w.bin"), []byte("weights"), 0o644)
	t.Cleanup(func() { // whatever a failure left mounted
		for _, m := range mountsUnder(t, dir) {
			unix.Unmount(m.point, unix.MNT_DETACH)
		}
	})
	const nPods = 6
	type pod struct {
		id, target    string
		volumes, link string // the swapped pair: the real directory and a symlink into the decoy
		swapped       bool
	}
	var ps []*pod
	for i := range nPods {
		uid := fmt.Sprintf("uid-%d", i)
		p := &pod{id: fmt.Sprintf("vol-%d", i), volumes: filepath.Join(pods, uid, "volumes"), link: filepath.Join(pods, uid, "volumes-swap")}
		p.target = filepath.Join(p.volumes, "kubernetes.io~csi", "model", "mount")
		if err := os.MkdirAll(filepath.Dir(p.target), 0o750); err != nil {
			t.Fatal(err)
		}
		// The decoy has the same layout, so a mount through the symlink
		// would land at decoy/<uid>/kubernetes.io~csi/model/mount.
		if err := os.MkdirAll(filepath.Join(decoy, uid, "kubernetes.io~csi", "model", "mount"), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join(decoy, uid), p.link); err != nil {
			t.Fatal(err)
		}
		ps = append(ps, p)
	}
	b := &memBackend{tree: tree}
	d, err := New(Config{Socket: filepath.Join(dir, "csi.sock"), PodsDir: pods, NodeID: "n"}, b)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	var bad atomic.Value // the first thing seen wrong
	check := func() {
		mounts := mountsUnder(t, dir)
		at := map[string]string{} // mount ID → point
		for _, m := range mounts {
			at[m.id] = m.point
		}
		for _, m := range mounts {
			switch {
			case !strings.HasPrefix(m.point, pods+"/"):
				bad.CompareAndSwap(nil, "a mount outside the pods directory: "+m.point)
			case at[m.parent] == m.point:
				bad.CompareAndSwap(nil, "two mounts stacked at "+m.point)
			}
		}
	}

	stop := make(chan struct{})
	var swaps atomic.Int64
	var swapper sync.WaitGroup
	swapper.Add(1)
	go func() {
		defer swapper.Done()
		for {
			for _, p := range ps {
				select {
				case <-stop:
					return
				default:
				}
				if err := unix.Renameat2(unix.AT_FDCWD, p.volumes, unix.AT_FDCWD, p.link, unix.RENAME_EXCHANGE); err != nil {
					bad.CompareAndSwap(nil, "swap: "+err.Error())
					return
				}
				p.swapped = !p.swapped
				swaps.Add(1)
			}
		}
	}()

	var published, refused, unpublishRefused atomic.Int64
	var workers sync.WaitGroup
	mounted := make([]bool, nPods) // published and not yet unpublished, per pod
	for i, p := range ps {
		workers.Add(1)
		go func() {
			defer workers.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if !mounted[i] {
					_, err := d.NodePublishVolume(ctx, publishReq(p.id, p.target))
					if err == nil {
						published.Add(1)
						mounted[i] = true
					} else if c := status.Code(err); c == codes.InvalidArgument || c == codes.NotFound {
						refused.Add(1) // the path had a symlink in it, or was mid-swap
					} else {
						bad.CompareAndSwap(nil, "publish: "+err.Error())
					}
					// A repeated publish (kubelet retries) never stacks;
					// it may be the one that mounts.
					if _, err := d.NodePublishVolume(ctx, publishReq(p.id, p.target)); err == nil && !mounted[i] {
						published.Add(1)
						mounted[i] = true
					}
				}
				check()
				if mounted[i] {
					if _, err := d.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: p.id, TargetPath: p.target}); err == nil {
						mounted[i] = false
					} else if status.Code(err) == codes.InvalidArgument {
						unpublishRefused.Add(1) // through the symlink: kubelet retries
					} else {
						bad.CompareAndSwap(nil, "unpublish: "+err.Error())
					}
				}
				check()
			}
		}()
	}
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) && bad.Load() == nil {
		check()
	}
	close(stop)
	swapper.Wait()
	workers.Wait()
	if msg := bad.Load(); msg != nil {
		t.Fatal(msg)
	}
	for _, p := range ps { // the swaps stop with each real directory in place
		if p.swapped {
			if err := unix.Renameat2(unix.AT_FDCWD, p.volumes, unix.AT_FDCWD, p.link, unix.RENAME_EXCHANGE); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("%d swaps; %d publishes mounted, %d refused; %d unpublishes refused mid-swap", swaps.Load(), published.Load(), refused.Load(), unpublishRefused.Load())
	if published.Load() == 0 {
		t.Fatal("no publish succeeded: the test raced nothing")
	}
	check()
	if msg := bad.Load(); msg != nil {
		t.Fatal(msg)
	}
	for i, p := range ps {
		if mounted[i] {
			if _, err := d.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: p.id, TargetPath: p.target}); err != nil {
				t.Fatalf("unpublish of %s after the swaps: %v", p.id, err)
			}
		}
	}
	if left := mountsUnder(t, dir); len(left) != 0 {
		t.Fatalf("mounts left after every volume was unpublished: %v", left)
	}
	if held, _ := b.Holds(); len(held) != 0 {
		t.Fatalf("holds left after every volume was unpublished: %v", held)
	}
}

// TestOpenDirBeneath: with openat2 and with the walk older kernels get,
// a directory opens, and a symlink anywhere on the way (even one that
// leads back inside) is refused, as a missing directory is.
func TestOpenDirBeneath(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.Symlink(t.TempDir(), filepath.Join(dir, "a", "out"))
	os.Symlink("b", filepath.Join(dir, "a", "in"))
	os.WriteFile(filepath.Join(dir, "a", "f"), nil, 0o644)
	root, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(root)
	for name, open := range map[string]func(int, string) (int, error){"openat2": openDirBeneath, "walk": walkDirBeneath} {
		for rel, ok := range map[string]bool{"a": true, "a/b": true, "a/out": false, "a/out/x": false, "a/in": false, "a/in/x": false, "a/f": false, "a/none": false, "../x": false} {
			fd, err := open(root, rel)
			if err == nil {
				unix.Close(fd)
			}
			if (err == nil) != ok {
				t.Errorf("%s %s: %v, want ok %v", name, rel, err, ok)
			}
		}
	}
}

// TestOneTargetPerVolume: a volume ID is published at one target; at a
// second one it is refused while the first is mounted, and once that
// mount is gone (its pod went while nothing unpublished it) the publish
// at the second target holds afresh for it.
func TestOneTargetPerVolume(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (to bind-mount CSI volumes)", "run the tests as root, as CI does")
	}
	dir := t.TempDir()
	pods, tree := filepath.Join(dir, "pods"), filepath.Join(dir, "tree")
	first, second := filepath.Join(pods, "a", "mount"), filepath.Join(pods, "b", "mount")
	for _, p := range []string{tree, filepath.Dir(first), filepath.Dir(second)} {
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, m := range mountsUnder(t, dir) {
			unix.Unmount(m.point, unix.MNT_DETACH)
		}
	})
	b := &memBackend{tree: tree}
	d, err := New(Config{Socket: filepath.Join(dir, "csi.sock"), PodsDir: pods, NodeID: "n"}, b)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := d.NodePublishVolume(ctx, publishReq("vol", first)); err != nil {
		t.Fatal(err)
	}
	if _, err := d.NodePublishVolume(ctx, publishReq("vol", second)); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a second target while the first is mounted: %v, want FailedPrecondition", err)
	}
	if err := unix.Unmount(first, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := d.NodePublishVolume(ctx, publishReq("vol", second)); err != nil {
		t.Fatalf("the second target once the first mount went: %v", err)
	}
	if held, _ := b.Holds(); len(held) != 1 || held[0].Target != second {
		t.Fatalf("holds %+v, want the volume held for %s", held, second)
	}
	if _, err := d.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: "vol", TargetPath: second}); err != nil {
		t.Fatal(err)
	}
	if held, _ := b.Holds(); len(held) != 0 {
		t.Fatalf("holds left: %+v", held)
	}
}
