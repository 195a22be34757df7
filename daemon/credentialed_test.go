package daemon

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
)

// treeMode is the mode of the directory of name's current version.
func treeMode(t *testing.T, h *harness, name string) os.FileMode {
	t.Helper()
	a := h.waitPhase(name, api.PhaseReady)
	tree := h.d.store.TreePath(a.Kind, name, a.Revision)
	fi, err := os.Stat(tree)
	if err != nil {
		t.Fatal(err)
	}
	// A closed tree is a private artifact's, under private/ (where no
	// local PV may point); an open one is under models/.
	want := filepath.Join(h.cfg.Root, "models", name, a.Revision)
	if fi.Mode().Perm() != 0o755 {
		want = filepath.Join(h.cfg.Root, "private", "models", name, a.Revision)
	}
	if tree != want {
		t.Errorf("%s: a tree of mode %o at %s, want %s", name, fi.Mode().Perm(), tree, want)
	}
	return fi.Mode().Perm()
}

// wantModes checks the tree modes of artifacts (name → mode) once each is Ready.
func wantModes(t *testing.T, h *harness, what string, want map[string]os.FileMode) {
	t.Helper()
	for name, mode := range want {
		if m := treeMode(t, h, name); m != mode {
			t.Errorf("%s, %s: tree %o, want %o", what, name, m, mode)
		}
	}
}

// hfViewOf reports whether the hf/ view serves repo.
func hfViewOf(h *harness, repo string) bool {
	_, err := os.Stat(filepath.Join(h.cfg.Root, "hf", "models--"+repo[:4]+"--"+repo[5:]))
	return err == nil
}

// gatedHub is a test hub that answers only the token tok, holding the
// gated repo acme/gate.
func gatedHub(t *testing.T, tok string) *hubtest.Hub {
	hub := hubtest.New()
	t.Cleanup(hub.Close)
	hub.Token = tok
	hub.Commit("acme/gate", hubModel(1, 3), "main")
	t.Setenv("HF_ENDPOINT", hub.URL())
	t.Setenv("HF_HOME", t.TempDir())
	return hub
}

// TestCredentialedPullIsPrivate: what the daemon fetches with its own
// token (a socket pull) or a models.d credentialsFile is private (its
// tree root's only, no hf/ view, no pod mounts it) unless the operator
// says public (pull --public, public: true).
func TestCredentialedPullIsPrivate(t *testing.T) {
	gatedHub(t, "daemon-token")
	t.Setenv("HF_TOKEN", "daemon-token")
	cfg := testConfig(t)
	os.MkdirAll(cfg.ModelsDir, 0o755)
	h := start(t, cfg)

	if _, err := h.pull(api.PullRequest{Name: "gate", URI: "hf://acme/gate"}); err != nil {
		t.Fatal(err)
	}
	if m := treeMode(t, h, "gate"); m != 0o700 {
		t.Errorf("a socket pull with the daemon's token: tree %o, want 0700", m)
	}
	if hfViewOf(h, "acme/gate") {
		t.Errorf("a private artifact has an hf/ view (world-readable)")
	}
	a, _ := h.c.Get(context.Background(), "gate")
	if a.Desire == nil || !a.Desire.Credentialed {
		t.Errorf("the desire does not say it is fetched with credentials: %+v", a.Desire)
	}
	h.d.mu.Lock()
	ds := h.d.desires.merged()["gate"]
	h.d.mu.Unlock()
	if mayMount(ds, "default") {
		t.Errorf("a pod of namespace default may mount the private artifact")
	}

	if _, err := h.pull(api.PullRequest{Name: "gate-pub", URI: "hf://acme/gate", Public: true}); err != nil {
		t.Fatal(err)
	}
	if m := treeMode(t, h, "gate-pub"); m != 0o755 {
		t.Errorf("pull --public: tree %o, want 0755", m)
	}
	if !hfViewOf(h, "acme/gate") {
		t.Errorf("pull --public: no hf/ view")
	}

	// models.d: a credentialsFile makes it private; public: true opens it.
	creds := filepath.Join(t.TempDir(), "creds")
	os.WriteFile(creds, []byte("HF_TOKEN=daemon-token\n"), 0o600)
	os.WriteFile(filepath.Join(cfg.ModelsDir, "f.yaml"), []byte("models:\n- name: fpriv\n  uri: hf://acme/gate\n  credentialsFile: "+creds+
		"\n- name: fpub\n  uri: hf://acme/gate\n  credentialsFile: "+creds+"\n  public: true\n"), 0o644)
	wantModes(t, h, "models.d with credentialsFile (fpub: and public: true)", map[string]os.FileMode{"fpriv": 0o700, "fpub": 0o755})
}

// TestCredentialedURIAndCluster: credentials in a source URI make a
// socket pull private; a ModelCache's desire fetched with the daemon's own
// token is private unless spec.public (Desire.Public) says otherwise.
func TestCredentialedURIAndCluster(t *testing.T) {
	gatedHub(t, "daemon-token")
	t.Setenv("HF_TOKEN", "daemon-token")
	w := data(3000, 8)
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	h := start(t, testConfig(t))
	withUser := strings.Replace(srv.URL, "http://", "http://user:secret@", 1)
	for name, uri := range map[string]string{"userinfo": withUser + "/w.bin#sha256=" + sha(w), "plain": srv.URL + "/w.bin#sha256=" + sha(w)} {
		if _, err := h.pull(api.PullRequest{Name: name, URI: uri}); err != nil {
			t.Fatal(err)
		}
	}
	wantModes(t, h, "credentials in the URI (plain: none)", map[string]os.FileMode{"userinfo": 0o700, "plain": 0o755})
	priv, pub := clusterDesire("cpriv", "hf://acme/gate"), clusterDesire("cpub", "hf://acme/gate")
	pub.Public = true
	if err := (clusterNode{h.d}).SetClusterDesires(map[string]api.Desire{"cpriv": priv, "cpub": pub}, nil); err != nil {
		t.Fatal(err)
	}
	wantModes(t, h, "a ModelCache fetched with the daemon's token (cpub: spec.public)", map[string]os.FileMode{"cpriv": 0o700, "cpub": 0o755})
}

// TestCredentialedMigration: an artifact an older daemon fetched with
// its token, public then (tree 0755, an hf/ view, a kept desire that
// records nothing of credentials), is private once the daemon restarts
// on the same store: its tree 0700 and its hf/ view gone before anything
// is served; pulled again with --public it is public again.
func TestCredentialedMigration(t *testing.T) {
	gatedHub(t, "")
	t.Setenv("HF_TOKEN", "")
	cfg := testConfig(t)
	h := start(t, cfg)
	if _, err := h.pull(api.PullRequest{Name: "old", URI: "hf://acme/gate"}); err != nil {
		t.Fatal(err)
	}
	if m := treeMode(t, h, "old"); m != 0o755 || !hfViewOf(h, "acme/gate") {
		t.Fatalf("before the upgrade: tree %o, hf view %v; want the public layout", m, hfViewOf(h, "acme/gate"))
	}
	h.stop()

	t.Setenv("HF_TOKEN", "daemon-token") // the daemon fetches hf:// with a token
	h = start(t, cfg)
	if m := treeMode(t, h, "old"); m != 0o700 {
		t.Errorf("after the upgrade: tree %o, want 0700", m)
	}
	if hfViewOf(h, "acme/gate") {
		t.Errorf("after the upgrade: the hf/ view still serves the now private artifact")
	}
	if _, err := h.pull(api.PullRequest{Name: "old", URI: "hf://acme/gate", Public: true}); err != nil {
		t.Fatal(err)
	}
	if m := treeMode(t, h, "old"); m != 0o755 {
		t.Errorf("pulled again with --public: tree %o, want 0755", m)
	}
}
