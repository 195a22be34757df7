package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/csi"
	"github.com/modelcache/modelcache/fetchers/file/filetest"
	"github.com/modelcache/modelcache/internal/testenv"
)

// kubeletCopy lays out a copy of kubelet's directory under dir with one
// pod's projected service-account token (filetest.ProjectedVolume). It
// returns kubelet's directory and the volume's.
func kubeletCopy(t *testing.T, dir string) (kubelet, vol string) {
	kubelet = filepath.Join(dir, "kubelet")
	return kubelet, filetest.ProjectedVolume(t, filepath.Join(kubelet, "pods"))
}

// clusterDesire is a ModelCache's desire as k8ssync hands it over.
func clusterDesire(name, uri string) api.Desire {
	return api.Desire{Name: name, URI: uri, State: api.StatePresent, Origin: "k8s:" + name}
}

// committedNothing fails the test if name has a tree in the store or any
// blob holds the token.
func committedNothing(t *testing.T, h *harness, name string) {
	t.Helper()
	if _, err := lstatTree(h.cfg.Root, name); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s: a refused source was committed (%v)", name, err)
	}
	filepath.Walk(filepath.Join(h.cfg.Root, "blobs"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			if b, _ := os.ReadFile(p); strings.Contains(string(b), filetest.Token) {
				t.Errorf("blob %s holds the pod's token", p)
			}
		}
		return nil
	})
}

// TestClusterFileSources: a ModelCache's file:// source is refused until
// --file-roots names directories, naming the flag; it never reads under
// kubelet's directory (here a copy of its projected-volume layout,
// configured as the CSI plugin's kubelet dir) even through a root that
// contains it, and no error names the hidden ..<timestamp> directory; it
// reads as --file-identity (nobody by default), so a root-only file under
// a root is refused and a world-readable one is pulled.
func TestClusterFileSources(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (to read as nobody, and for the CSI plugin)", "run the tests as root, as CI does")
	}
	dir := t.TempDir()
	traversable(t, dir)
	kubelet, vol := kubeletCopy(t, dir)
	models := filepath.Join(dir, "models")
	os.MkdirAll(filepath.Join(models, "public"), 0o755)
	os.MkdirAll(filepath.Join(models, "private"), 0o755)
	os.WriteFile(filepath.Join(models, "public", "w.bin"), []byte("public weights"), 0o644)
	os.WriteFile(filepath.Join(models, "private", "w.bin"), []byte("root's weights"), 0o600)

	config := func(roots ...string) Config {
		cfg := testConfig(t)
		cfg.FileRoots = roots
		cfg.CSI = &csi.Config{Socket: filepath.Join(t.TempDir(), "csi.sock"), PodsDir: filepath.Join(kubelet, "pods"), NodeID: "node-a"}
		return cfg
	}

	t.Run("no roots", func(t *testing.T) {
		h := start(t, config())
		for _, uri := range []string{"file://" + models + "/public", "file://" + vol} {
			err := (clusterNode{h.d}).SetClusterDesires(map[string]api.Desire{"m": clusterDesire("m", uri)}, nil)
			if err == nil || !strings.Contains(err.Error(), "--file-roots") || strings.Contains(err.Error(), "..2026") {
				t.Errorf("%s without --file-roots: %v; want refused naming --file-roots and nothing of the tree", uri, err)
			}
			if _, err := h.c.Get(context.Background(), "m"); !errors.Is(err, api.ErrNotFound) {
				t.Errorf("%s: a refused cluster desire became an artifact: %v", uri, err)
			}
			committedNothing(t, h, "m")
		}
		// The elected daemon's resolution for the cluster is refused too.
		if _, _, err := (clusterNode{h.d}).Resolve(context.Background(), clusterDesire("m", "file://"+models+"/public"), nil); err == nil || !strings.Contains(err.Error(), "--file-roots") {
			t.Errorf("cluster resolution without --file-roots: %v", err)
		}
	})

	t.Run("kubelet under a root", func(t *testing.T) {
		h := start(t, config(dir)) // a root that contains kubelet's directory
		for _, uri := range []string{"file://" + vol, "file://" + vol + "/token", "file://" + kubelet + "/pods"} {
			err := (clusterNode{h.d}).SetClusterDesires(map[string]api.Desire{"k": clusterDesire("k", uri)}, nil)
			if err == nil || !strings.Contains(err.Error(), "never reads") || strings.Contains(err.Error(), "..2026") {
				t.Errorf("%s: %v; want refused as kubelet's, naming nothing inside", uri, err)
			}
			committedNothing(t, h, "k")
		}
		// The root itself holds kubelet's directory: the walk refuses it.
		if err := (clusterNode{h.d}).SetClusterDesires(map[string]api.Desire{"all": clusterDesire("all", "file://"+dir)}, nil); err != nil {
			t.Fatal(err)
		}
		a := h.waitPhase("all", api.PhaseFailed)
		if !strings.Contains(a.Message, "never reads") || strings.Contains(a.Message, "..2026") {
			t.Errorf("a root holding kubelet's directory: %q; want refused, naming nothing inside", a.Message)
		}
		committedNothing(t, h, "all")
	})

	t.Run("identity", func(t *testing.T) {
		h := start(t, config(models))
		err := (clusterNode{h.d}).SetClusterDesires(map[string]api.Desire{
			"private": clusterDesire("private", "file://"+models+"/private"),
			"public":  clusterDesire("public", "file://"+models+"/public"),
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		a := h.waitPhase("private", api.PhaseFailed)
		if a.Reason != api.ReasonAccessDenied || !strings.Contains(a.Message, "--file-identity") {
			t.Errorf("a root-only file under the root: %s %q; want access denied to the configured identity", a.Reason, a.Message)
		}
		committedNothing(t, h, "private")
		h.waitPhase("public", api.PhaseReady)
		if s := h.read("public", "w.bin"); s != "public weights" {
			t.Errorf("public: %q", s)
		}
	})
}

// TestFileIdentityAndDenied: --file-identity takes UID:GID and says how
// when it is anything else; the default reads as nobody when the daemon
// is root; kubelet's directories (the default and the CSI plugin's,
// with its parent as kubelet's root) and the daemon's own state are
// denied; a socket outside /run/modelcached denies itself, not the
// directory it shares (with the models of a dev run, or /tmp).
func TestFileIdentityAndDenied(t *testing.T) {
	cfg := testConfig(t)
	for _, bad := range []string{"nobody", "1000", "1000:", "-1:0", "1:2:3"} {
		cfg.FileIdentity = bad
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--file-identity") {
			t.Errorf("--file-identity %q: %v", bad, err)
		}
	}
	cfg.FileIdentity = "1000:100"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if id := cfg.fileIdentity(); id.UID != 1000 || id.GID != 100 {
		t.Errorf("1000:100 read as %+v", id)
	}
	cfg.FileIdentity = ""
	if id := cfg.fileIdentity(); os.Geteuid() == 0 && (id.UID != nobody || id.GID != nobody) {
		t.Errorf("the default as root is %+v, want nobody", id)
	}

	cfg.CSI = &csi.Config{Socket: "/data/kubelet/plugins/csi.modelcache.io/csi.sock", PodsDir: "/data/kubelet/pods", RegistrationDir: "/data/kubelet/plugins_registry"}
	cfg.ConfigFile = "/etc/modelcached/config.yaml"
	denied := strings.Join(cfg.fileDenied(), " ") + " "
	for _, want := range []string{DefaultKubeletDir, "/data/kubelet", "/data/kubelet/pods", cfg.Root, cfg.Socket, "/run/modelcached", cfg.ModelsDir, cfg.ConfigFile} {
		if !strings.Contains(denied, want+" ") {
			t.Errorf("%s is not denied: %s", want, denied)
		}
	}
	cfg.Socket = "/tmp/modelcached.sock"
	if d := cfg.fileDenied(); strings.Contains(strings.Join(d, " ")+" ", "/tmp ") || !strings.Contains(strings.Join(d, " "), cfg.Socket) {
		t.Errorf("a socket in /tmp: denied %v; want the socket, not /tmp", d)
	}
}
