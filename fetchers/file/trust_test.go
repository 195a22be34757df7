package file

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/fetchers/file/filetest"
	"github.com/modelcache/modelcache/internal/testenv"
)

var nobody = &fetchers.Identity{UID: 65534, GID: 65534}

// requireRoot: the identity tests switch credentials, which needs root
// (CI runs as root).
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (to read as another uid)", "run the tests as root, as CI does")
	}
}

// openTree makes dir and its parents up to the test's temp root
// traversable by everyone (t.TempDir is 0700).
func openTree(t *testing.T, dir string) {
	t.Helper()
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
}

func readAll(t *testing.T, f *Fetcher, src fetchers.Source) (map[string]string, error) {
	t.Helper()
	res, err := f.Resolve(context.Background(), src)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, fl := range res.Files {
		rc, err := f.Open(context.Background(), fl, 0)
		if err != nil {
			return out, err
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return out, err
		}
		out[fl.Path] = string(b)
	}
	return out, nil
}

// TestReadsAsRequester: a requester reads only what its uid and groups
// may: /etc/shadow and another user's 0600 file are refused to nobody, a
// world-readable file is not, and root (the daemon's own configuration)
// still reads the private one.
func TestReadsAsRequester(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	openTree(t, dir)
	write(t, filepath.Join(dir, "public/w.bin"), "public weights")
	write(t, filepath.Join(dir, "private/w.bin"), "someone's weights")
	os.Chmod(filepath.Join(dir, "private/w.bin"), 0o600)
	write(t, filepath.Join(dir, "closed/w.bin"), "behind a closed directory")
	os.Chmod(filepath.Join(dir, "closed"), 0o700)
	f := New()

	if got, err := readAll(t, f, fetchers.Source{URI: "file://" + dir + "/public", As: nobody}); err != nil || got["w.bin"] != "public weights" {
		t.Fatalf("world-readable file as nobody: %v %v", got, err)
	}
	for _, uri := range []string{"file:///etc/shadow", "file://" + dir + "/private/w.bin", "file://" + dir + "/private", "file://" + dir + "/closed", "file://" + dir + "/closed/w.bin"} {
		got, err := readAll(t, f, fetchers.Source{URI: uri, As: nobody})
		if err == nil || !errors.Is(err, fetchers.ErrUnauthorized) || !fetchers.IsPermanent(err) {
			t.Errorf("%s as nobody: read %q, err %v; want a permanent access denied", uri, got, err)
		}
		if err != nil && !strings.Contains(err.Error(), "requester") {
			t.Errorf("%s: %v; want the message to say the requester may not read it", uri, err)
		}
	}
	// The refusal names the component that refused and the identity: a
	// directory on the way that nobody may not search.
	write(t, filepath.Join(dir, "deep/sub/w.bin"), "two levels down")
	os.Chmod(filepath.Join(dir, "deep"), 0o700)
	_, err := readAll(t, f, fetchers.Source{URI: "file://" + dir + "/deep/sub/w.bin", As: nobody})
	for _, want := range []string{"the directory " + dir + "/deep (drwx------ root:root) on the way to", "uid 65534", "search (x)"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("behind a 0700 directory: %v; want %q", err, want)
		}
	}
	// A group the requester is in opens a group-readable file.
	os.Chown(filepath.Join(dir, "private/w.bin"), 0, 4242)
	os.Chmod(filepath.Join(dir, "private/w.bin"), 0o640)
	member := &fetchers.Identity{UID: 65534, GID: 65534, Groups: []uint32{4242}}
	if got, err := readAll(t, f, fetchers.Source{URI: "file://" + dir + "/private/w.bin", As: member}); err != nil || got["w.bin"] != "someone's weights" {
		t.Fatalf("group-readable file as a member: %v %v", got, err)
	}
	if _, err := readAll(t, f, fetchers.Source{URI: "file://" + dir + "/private/w.bin", As: nobody}); !errors.Is(err, fetchers.ErrUnauthorized) {
		t.Fatalf("group-readable file as a non-member: %v", err)
	}
	if got, err := readAll(t, f, fetchers.Source{URI: "file://" + dir + "/private/w.bin"}); err != nil || got["w.bin"] != "someone's weights" {
		t.Fatalf("the daemon's own desire: %v %v", got, err)
	}
}

// TestRoots: with roots configured nothing outside them is read, whoever asks.
func TestRoots(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "in/w.bin"), "in")
	write(t, filepath.Join(dir, "inner/w.bin"), "a sibling whose name starts like the root")
	f := New(WithRoots(filepath.Join(dir, "in")))
	if _, err := readAll(t, f, fetchers.Source{URI: "file://" + dir + "/in"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/etc/hostname", dir + "/inner", dir} {
		if _, err := f.Resolve(context.Background(), fetchers.Source{URI: "file://" + p}); !errors.Is(err, fetchers.ErrUnauthorized) || !strings.Contains(err.Error(), "--file-roots") {
			t.Errorf("%s outside the roots: %v", p, err)
		}
	}
}

// TestSymlinkInSourcePath: the source path itself crosses no symlink, so
// a directory a user owns cannot be turned into a link to /etc.
func TestSymlinkInSourcePath(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "real/w.bin"), "x")
	os.Symlink(filepath.Join(dir, "real"), filepath.Join(dir, "link"))
	os.Symlink("/etc", filepath.Join(dir, "etc"))
	for _, uri := range []string{"file://" + dir + "/link", "file://" + dir + "/link/w.bin", "file://" + dir + "/etc/hostname", "file://" + dir + "/etc"} {
		_, err := New().Resolve(context.Background(), fetchers.Source{URI: uri})
		if !errors.Is(err, fetchers.ErrBadSource) || !strings.Contains(err.Error(), "real path") {
			t.Errorf("%s: %v; want a refusal naming the real path", uri, err)
		}
	}
}

// TestFIFONeverBlocks: a FIFO listed in a tree is refused by name, and one
// swapped in for a listed file after Resolve is refused at Open without
// blocking.
func TestFIFONeverBlocks(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "w.bin"), "weights")
	f := New()
	res, err := f.Resolve(context.Background(), fetchers.Source{URI: "file://" + dir})
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, "w.bin"))
	if err := syscall.Mkfifo(filepath.Join(dir, "w.bin"), 0o666); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		rc, err := f.Open(context.Background(), res.Files[0], 0)
		if rc != nil {
			rc.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, fetchers.ErrBadSource) || !strings.Contains(err.Error(), "replaced") {
			t.Fatalf("FIFO swapped in: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Open blocked on a FIFO")
	}
	if _, err := f.Resolve(context.Background(), fetchers.Source{URI: "file://" + dir}); err == nil || !strings.Contains(err.Error(), "FIFO") {
		t.Fatalf("a tree holding a FIFO: %v", err)
	}
	if _, err := f.Resolve(context.Background(), fetchers.Source{URI: "file://" + dir + "/w.bin"}); err == nil || !strings.Contains(err.Error(), "FIFO") {
		t.Fatalf("a FIFO as the source: %v", err)
	}
}

// TestDirectorySwapRace: while the tree root is pulled, another user swaps
// it for a symlink to a directory holding a secret, and back, as fast as it
// can. Whatever instant the swap hits, no read returns the secret: either
// the pull reads the real tree or it fails naming the swap.
func TestDirectorySwapRace(t *testing.T) {
	base := t.TempDir()
	secretDir := filepath.Join(base, "etc")
	write(t, filepath.Join(secretDir, "w.bin"), "SECRET root-only content")
	write(t, filepath.Join(secretDir, "config.json"), "SECRET config")
	real := filepath.Join(base, "model")
	write(t, filepath.Join(real, "w.bin"), "weights")
	write(t, filepath.Join(real, "config.json"), "{}")
	aside := filepath.Join(base, "aside")
	link := filepath.Join(base, "link")
	os.Symlink(secretDir, link)

	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the attacker: model <-> symlink to the secret
		defer wg.Done()
		for !stop.Load() {
			os.Rename(real, aside)
			os.Rename(link, real)
			os.Rename(real, link)
			os.Rename(aside, real)
		}
	}()
	f := New()
	var ok, refused int
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; i < 5000 && time.Now().Before(deadline); i++ {
		got, err := readAll(t, f, fetchers.Source{URI: "file://" + real})
		for p, b := range got {
			if strings.Contains(b, "SECRET") {
				stop.Store(true)
				wg.Wait()
				t.Fatalf("attempt %d read the swapped-in secret as %s: %q", i, p, b)
			}
		}
		if err != nil {
			refused++
		} else {
			ok++
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d pulls read the real tree, %d were refused during a swap", ok, refused)
	if refused == 0 {
		t.Log("the swap window was never hit; the invariant held for every attempt")
	}
}

// TestDeepTree: a tree deeper than maxDepth is refused with a short
// message, and a deep tree within it resolves and leaves no descriptor
// open.
func TestDeepTree(t *testing.T) {
	build := func(depth int) string {
		root := t.TempDir()
		p := root
		for i := 0; i < depth; i++ {
			p = filepath.Join(p, "d")
		}
		write(t, filepath.Join(p, "w.bin"), "deep")
		return root
	}
	fds := func() int { ents, _ := os.ReadDir("/proc/self/fd"); return len(ents) }
	before := fds()
	res, err := New().Resolve(context.Background(), fetchers.Source{URI: "file://" + build(maxDepth)})
	if err != nil || len(res.Files) != 1 {
		t.Fatalf("a tree %d deep: %v", maxDepth, err)
	}
	if after := fds(); after > before+2 {
		t.Fatalf("the walk leaked descriptors: %d before, %d after", before, after)
	}
	_, err = New().Resolve(context.Background(), fetchers.Source{URI: "file://" + build(maxDepth+5)})
	if !errors.Is(err, fetchers.ErrBadSource) || !strings.Contains(err.Error(), "deeper than") || len(err.Error()) > 1000 {
		t.Fatalf("a tree deeper than %d: %v", maxDepth, err)
	}
}

// TestKernelViewsRefused: file:// never reads the daemon's own /proc
// entries (its maps, environment, descriptors) nor anything under /proc or
// /sys, for a requester or the daemon's own configuration: refused by path
// before any open, and by filesystem type where procfs is mounted
// elsewhere (a DaemonSet's /host/proc).
func TestKernelViewsRefused(t *testing.T) {
	f := New()
	pid := strconv.Itoa(os.Getpid())
	for _, p := range []string{"/proc/self/maps", "/proc/thread-self/environ", "/proc/" + pid + "/maps", "/proc/" + pid, "/proc", "/sys/kernel", "/proc/self/fd/"} {
		for _, as := range []*fetchers.Identity{nobody, nil} {
			_, err := f.Resolve(context.Background(), fetchers.Source{URI: "file://" + p, As: as})
			if !errors.Is(err, fetchers.ErrUnauthorized) || !fetchers.IsPermanent(err) || !strings.Contains(err.Error(), "kernel's view") {
				t.Errorf("%s as %v: %v, want a permanent refusal naming the kernel's view", p, as, err)
			}
		}
		if err := f.CheckRoots("file://" + p); !errors.Is(err, fetchers.ErrUnauthorized) {
			t.Errorf("CheckRoots(%s): %v, want refused before the pull is saved", p, err)
		}
	}
	// /procfoo is not /proc.
	dir := filepath.Join(t.TempDir(), "procfoo")
	if err := kernelFS("file://"+dir, dir); err != nil {
		t.Errorf("%s: %v", dir, err)
	}

	requireRoot(t)
	host := filepath.Join(t.TempDir(), "host", "proc")
	if err := os.MkdirAll(host, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("proc", host, "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		testenv.Missing(t, "a procfs mount ("+err.Error()+")", "run the tests as root, as CI does")
	}
	t.Cleanup(func() { syscall.Unmount(host, syscall.MNT_DETACH) })
	for _, p := range []string{host + "/" + pid + "/environ", host + "/self", host + "/" + pid} {
		_, err := f.Resolve(context.Background(), fetchers.Source{URI: "file://" + p})
		if !errors.Is(err, fetchers.ErrUnauthorized) || !strings.Contains(err.Error(), "procfs") {
			t.Errorf("%s: %v, want refused as procfs", p, err)
		}
	}
}

// TestMissingUnderPrivateTmp: under systemd, a missing path under /tmp
// says that the unit's PrivateTmp hides the user's /tmp from the daemon.
func TestMissingUnderPrivateTmp(t *testing.T) {
	f := New()
	t.Setenv("INVOCATION_ID", "0123")
	_, err := f.Resolve(context.Background(), fetchers.Source{URI: "file:///tmp/no-such-model-here"})
	if !errors.Is(err, fetchers.ErrNotFound) || !strings.Contains(err.Error(), "PrivateTmp") {
		t.Fatalf("%v; want not found, naming PrivateTmp", err)
	}
	t.Setenv("INVOCATION_ID", "")
	_, err = f.Resolve(context.Background(), fetchers.Source{URI: "file:///tmp/no-such-model-here"})
	if !errors.Is(err, fetchers.ErrNotFound) || strings.Contains(err.Error(), "PrivateTmp") {
		t.Fatalf("%v; outside systemd the hint does not apply", err)
	}
}

// TestDeniedDirs: kubelet's directory and the daemon's own state are
// never read, even under a root that contains them, by path, through a
// bind mount or a symlinked name; no error names the hidden timestamped
// directory inside.
func TestDeniedDirs(t *testing.T) {
	dir := t.TempDir()
	openTree(t, dir)
	kubelet := filepath.Join(dir, "kubelet")
	vol := filetest.ProjectedVolume(t, filepath.Join(kubelet, "pods"))
	write(t, filepath.Join(dir, "models", "llama", "w.bin"), "weights")
	os.Symlink(kubelet, filepath.Join(dir, "kubelet-link"))
	f := New(WithRoots(dir), WithDenied(filepath.Join(dir, "kubelet-link"), filepath.Join(dir, "state")))
	g := New(WithRoots(dir), WithDenied(kubelet))
	check := func(f *Fetcher, uri string) {
		t.Helper()
		for _, as := range []*fetchers.Identity{nil, nobody} {
			if os.Geteuid() != 0 && as != nil {
				continue
			}
			got, err := readAll(t, f, fetchers.Source{URI: uri, As: as})
			if !errors.Is(err, fetchers.ErrUnauthorized) || !fetchers.IsPermanent(err) || !strings.Contains(err.Error(), "never reads") {
				t.Errorf("%s as %v: read %v, err %v; want a permanent refusal", uri, as, got, err)
			}
			if err != nil && strings.Contains(err.Error(), "..2026") {
				t.Errorf("%s: the error names what lies beyond the refused path: %v", uri, err)
			}
		}
	}
	for _, uri := range []string{"file://" + vol, "file://" + vol + "/token", "file://" + kubelet, "file://" + dir + "/kubelet/pods"} {
		check(g, uri) // by path
		check(f, uri) // by where a denied symlink leads
	}
	check(g, "file://"+dir) // a root that holds kubelet's directory
	if err := f.CheckRoots("file://" + dir + "/state/index.db"); !errors.Is(err, fetchers.ErrUnauthorized) {
		t.Errorf("the daemon's state by path: %v", err)
	}
	if got, err := readAll(t, g, fetchers.Source{URI: "file://" + dir + "/models"}); err != nil || got["llama/w.bin"] != "weights" {
		t.Fatalf("a model beside kubelet's directory: %v %v", got, err)
	}

	requireRoot(t)
	bind := filepath.Join(dir, "models", "pods")
	os.MkdirAll(bind, 0o755)
	if err := syscall.Mount(filepath.Join(kubelet, "pods"), bind, "", syscall.MS_BIND, ""); err != nil {
		testenv.Missing(t, "a bind mount ("+err.Error()+")", "run the tests as root, as CI does")
	}
	t.Cleanup(func() { syscall.Unmount(bind, syscall.MNT_DETACH) })
	check(g, "file://"+bind+"/0f1e2d3c-uid/volumes/kubernetes.io~projected/kube-api-access-abcde")
	check(g, "file://"+bind)
	check(g, "file://"+dir+"/models")
}

// TestConfined: a confined fetcher (a ModelCache's source) reads nothing
// until roots are configured, and then only under them.
func TestConfined(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "in/w.bin"), "in")
	write(t, filepath.Join(dir, "out/w.bin"), "out")
	for _, uri := range []string{"file://" + dir + "/in", "file:///etc/hostname"} {
		_, err := New().Confined().Resolve(context.Background(), fetchers.Source{URI: uri})
		if !errors.Is(err, fetchers.ErrUnauthorized) || !strings.Contains(err.Error(), "--file-roots") {
			t.Errorf("%s with no roots: %v; want a refusal naming --file-roots", uri, err)
		}
		if err := New().Confined().CheckRoots(uri); !errors.Is(err, fetchers.ErrUnauthorized) {
			t.Errorf("CheckRoots(%s) with no roots: %v", uri, err)
		}
	}
	f := New(WithRoots(filepath.Join(dir, "in"))).Confined()
	if got, err := readAll(t, f, fetchers.Source{URI: "file://" + dir + "/in"}); err != nil || got["w.bin"] != "in" {
		t.Fatalf("under the root: %v %v", got, err)
	}
	if _, err := f.Resolve(context.Background(), fetchers.Source{URI: "file://" + dir + "/out"}); !errors.Is(err, fetchers.ErrUnauthorized) {
		t.Fatalf("outside the root: %v", err)
	}
	// The fetcher it came from is not confined.
	if _, err := readAll(t, New(), fetchers.Source{URI: "file://" + dir + "/out"}); err != nil {
		t.Fatal(err)
	}
}

// TestErrorsNameNothingBeyond: an unreadable directory deep in a tree, or
// a projected volume copied under a root, fails with the source path and
// at most the first entry beyond it: not the hidden directory's name, not
// a symlink's target.
func TestErrorsNameNothingBeyond(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	openTree(t, dir)
	write(t, filepath.Join(dir, "tree/a/b/hidden-7f3a/w.bin"), "x")
	openTree(t, filepath.Join(dir, "tree/a/b"))
	os.Chmod(filepath.Join(dir, "tree/a/b/hidden-7f3a"), 0o700)
	_, err := New().Resolve(context.Background(), fetchers.Source{URI: "file://" + dir + "/tree", As: nobody})
	if !errors.Is(err, fetchers.ErrUnauthorized) || strings.Contains(err.Error(), "hidden-7f3a") || strings.Contains(err.Error(), "/b") || !strings.Contains(err.Error(), dir+"/tree/a") {
		t.Errorf("unreadable deep directory: %v; want access denied naming %s/tree/a and nothing deeper", err, dir)
	}
	vol := filetest.ProjectedVolume(t, filepath.Join(dir, "copy"))
	openTree(t, filepath.Join(vol, filetest.HiddenDir))
	for _, as := range []*fetchers.Identity{nil, nobody} {
		got, err := readAll(t, New(), fetchers.Source{URI: "file://" + vol, As: as})
		if err == nil || strings.Contains(err.Error(), "..2026") {
			t.Errorf("projected layout as %v: read %v, err %v; want refused without naming the hidden directory", as, got, err)
		}
	}
	os.Symlink("/etc/secret-place", filepath.Join(dir, "tree", "esc"))
	os.Chmod(filepath.Join(dir, "tree/a/b/hidden-7f3a"), 0o755)
	_, err = New().Resolve(context.Background(), fetchers.Source{URI: "file://" + dir + "/tree"})
	if err == nil || strings.Contains(err.Error(), "secret-place") {
		t.Errorf("escaping symlink: %v; want refused without its target", err)
	}
}

// TestBindMountedKernelAndStateFilesRefused: a procfs inside a tree, a
// procfs file bind-mounted over a plain file (read alone or within a
// tree), and a file of a denied directory bind-mounted elsewhere are never
// read: the filesystem type is checked on every directory walked and every
// file opened, the denied identities include a denied directory's files.
func TestBindMountedKernelAndStateFilesRefused(t *testing.T) {
	requireRoot(t)
	mount := func(src, dst, fstype string, flags uintptr) {
		t.Helper()
		if err := syscall.Mount(src, dst, fstype, flags, ""); err != nil {
			testenv.Missing(t, "a mount ("+err.Error()+")", "run the tests as root, as CI does")
		}
		t.Cleanup(func() { syscall.Unmount(dst, syscall.MNT_DETACH) })
	}
	dir := t.TempDir()
	openTree(t, dir)
	tree := filepath.Join(dir, "tree")
	write(t, filepath.Join(tree, "w.bin"), "weights")
	os.MkdirAll(filepath.Join(tree, "p"), 0o755)
	mount("proc", filepath.Join(tree, "p"), "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC)
	one := filepath.Join(dir, "one", "version")
	write(t, one, "")
	mount(filepath.Join(tree, "p", "version"), one, "", syscall.MS_BIND)
	state := filepath.Join(dir, "state")
	write(t, filepath.Join(state, "index.db"), "the index")
	idx := filepath.Join(dir, "elsewhere", "idx")
	write(t, idx, "")
	mount(filepath.Join(state, "index.db"), idx, "", syscall.MS_BIND)

	f := New(WithDenied(state))
	for _, as := range []*fetchers.Identity{nil, nobody} {
		for _, uri := range []string{"file://" + tree, "file://" + one, "file://" + filepath.Dir(one)} {
			got, err := readAll(t, f, fetchers.Source{URI: uri, As: as})
			if !errors.Is(err, fetchers.ErrUnauthorized) || !strings.Contains(err.Error(), "procfs") {
				t.Errorf("%s as %v: read %d files, err %v; want refused as procfs", uri, as, len(got), err)
			}
		}
		for _, uri := range []string{"file://" + idx, "file://" + filepath.Dir(idx)} {
			got, err := readAll(t, f, fetchers.Source{URI: uri, As: as})
			if !errors.Is(err, fetchers.ErrUnauthorized) || len(got) > 0 {
				t.Errorf("%s as %v: read %v, err %v; want the daemon's index.db refused through its bind mount", uri, as, got, err)
			}
		}
	}
}

// TestKernelTraversalRules: file:// asks of the requester what the kernel
// asks: search on each directory of the path, read on the file, read on a
// directory only where the pull lists it. A directory that may be
// traversed but not listed (0711) does not refuse a file or a
// subdirectory under it; a refusal names the component that refused, the
// permission it lacks and the identity the read used.
func TestKernelTraversalRules(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	openTree(t, dir)
	write(t, filepath.Join(dir, "m/w.bin"), "weights through a 0711 directory")
	write(t, filepath.Join(dir, "m/sub/config.json"), "{}")
	os.Chmod(filepath.Join(dir, "m"), 0o711)
	os.Chmod(filepath.Join(dir, "m/sub"), 0o755)
	write(t, filepath.Join(dir, "closed/inner/w.bin"), "x")
	openTree(t, filepath.Join(dir, "closed/inner"))
	os.Chmod(filepath.Join(dir, "closed"), 0o700)
	f := New()

	if got, err := readAll(t, f, fetchers.Source{URI: "file://" + dir + "/m/w.bin", As: nobody}); err != nil || got["w.bin"] != "weights through a 0711 directory" {
		t.Fatalf("a file through a traversable, unlistable directory: %v %v", got, err)
	}
	if got, err := readAll(t, f, fetchers.Source{URI: "file://" + dir + "/m/sub", As: nobody}); err != nil || got["config.json"] != "{}" {
		t.Fatalf("a listable tree under a traversable, unlistable directory: %v %v", got, err)
	}
	for _, c := range []struct{ uri, want string }{
		{"file://" + dir + "/m", "the path " + dir + "/m (drwx--x--x root:root) refuses uid 65534 (nobody)"},
		{"file://" + dir + "/closed/inner/w.bin", "the directory " + dir + "/closed (drwx------ root:root) on the way to " + dir + "/closed/inner/w.bin refuses uid 65534 (nobody)"},
		{"file://" + dir + "/closed/inner", "the directory " + dir + "/closed (drwx------ root:root) on the way to " + dir + "/closed/inner refuses uid 65534 (nobody)"},
	} {
		_, err := readAll(t, f, fetchers.Source{URI: c.uri, As: nobody})
		if !errors.Is(err, fetchers.ErrUnauthorized) || !strings.Contains(fmt.Sprint(err), c.want) {
			t.Errorf("%s as nobody: %v; want access denied saying %q", c.uri, err, c.want)
		}
	}
	if _, err := readAll(t, f, fetchers.Source{URI: "file://" + dir + "/m", As: nobody}); !strings.Contains(fmt.Sprint(err), "list (r)") {
		t.Errorf("listing a 0711 directory: %v; want it to say list (r) is what it lacks", err)
	}
	// The file itself unreadable: the file is named, and read is what it lacks.
	os.Chmod(filepath.Join(dir, "m/w.bin"), 0o600)
	_, err := readAll(t, f, fetchers.Source{URI: "file://" + dir + "/m/w.bin", As: nobody})
	if want := "the path " + dir + "/m/w.bin (-rw------- root:root) refuses uid 65534 (nobody)"; !strings.Contains(fmt.Sprint(err), want) || !strings.Contains(fmt.Sprint(err), "read (r)") {
		t.Errorf("an unreadable file: %v; want %q and read (r)", err, want)
	}
}
