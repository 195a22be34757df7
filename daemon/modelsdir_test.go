package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/internal/testenv"
)

// models.d holds what is not a regular file: a FIFO (which blocked the
// loader for ever), symlinks to files elsewhere (whose content reached the
// world-readable status or became a desire), a directory and an oversized
// file. Each is named in the status and skipped; the regular file counts,
// and later edits are still seen.
func TestModelsDirOnlyRegularFiles(t *testing.T) {
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "w.bin"), []byte("declared"), 0o644)
	traversable(t, src) // models.d reads as --file-identity, nobody by default
	secret := t.TempDir()
	os.WriteFile(filepath.Join(secret, "desire"), []byte("name: leaked\nuri: file:///secret-token-4711\n"), 0o600)
	os.WriteFile(filepath.Join(secret, "shadow"), []byte("secret-token-4712: x\n"), 0o600)

	cfg := testConfig(t)
	md := cfg.ModelsDir
	os.MkdirAll(md, 0o755)
	os.WriteFile(filepath.Join(md, "good.yaml"), []byte("name: good\nuri: file://"+src+"\n"), 0o644)
	if err := syscall.Mkfifo(filepath.Join(md, "fifo.yaml"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Symlink(filepath.Join(secret, "desire"), filepath.Join(md, "link.yaml"))
	os.Symlink(filepath.Join(secret, "shadow"), filepath.Join(md, "shadow.yml"))
	os.Mkdir(filepath.Join(md, "dir.yaml"), 0o755)
	big, _ := os.Create(filepath.Join(md, "big.yaml"))
	big.Truncate(2 << 20)
	big.Close()

	started := make(chan *harness, 1)
	go func() { started <- start(t, cfg) }()
	var h *harness
	select {
	case h = <-started:
	case <-time.After(20 * time.Second):
		// Unblock the loader stuck on the FIFO, and take the FIFO away so
		// that the next reload (and the stop) does not block again.
		if f, err := os.OpenFile(filepath.Join(md, "fifo.yaml"), os.O_RDWR, 0); err == nil {
			os.Remove(filepath.Join(md, "fifo.yaml"))
			f.Close()
		}
		<-started
		t.Fatal("the daemon did not start in 20s with a FIFO in models.d")
	}
	h.waitPhase("good", api.PhaseReady)
	if _, err := h.c.Get(context.Background(), "leaked"); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("a symlinked file became a desire: %v", err)
	}
	s, err := h.c.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(s.ModelsDirError, "\n")
	if strings.Contains(all, "secret-token") {
		t.Fatalf("status echoes the content of a file models.d does not own:\n%s", all)
	}
	for _, n := range []string{"fifo.yaml", "link.yaml", "shadow.yml", "dir.yaml", "big.yaml"} {
		if !strings.Contains(all, filepath.Join(md, n)) {
			t.Errorf("status does not name %s:\n%s", n, all)
		}
	}
	if len(s.ModelsDirError) != 5 {
		t.Errorf("want 5 problems, got %d:\n%s", len(s.ModelsDirError), all)
	}
	// The loader is not wedged: a file added now is seen.
	os.WriteFile(filepath.Join(md, "later.yaml"), []byte("name: later\nuri: file://"+src+"\n"), 0o644)
	h.waitPhase("later", api.PhaseReady)
}

// A models.d file with a key its place does not take is refused with the
// file, the line, the key, the closest valid key and every valid key of
// that place (a model's include credentialsFile and kernelCaches); a key
// only the cluster sync or the daemon sets says so; a value of the wrong
// type names its line and key.
func TestModelsDirBadKeys(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		file, body string
		want       []string
	}{
		{"typo.yaml", "name: m\nuir: file:///x\n", []string{`line 2: unknown key "uir" (did you mean "uri"?); a model's keys are: ` + strings.Join(modelsKeys(reflect.TypeFor[modelsFile]()), ", ")}},
		{"list.yaml", "models:\n- name: a\n  uri: file:///a\n  pinn: true\n", []string{`line 4: unknown key "pinn" (did you mean "pin"?)`}},
		{"pinned.yaml", "name: m\nuri: file:///x\npinned: true\n", []string{`line 3: unknown key "pinned" (did you mean "pin"?)`}},
		{"kc.yaml", "name: m\nuri: file:///x\nkernelCaches:\n- uri: oci://r/k:1\n  signatur:\n    polcy: off\n",
			[]string{`line 5: unknown key "signatur" (did you mean "signature"?); a kernel cache's keys are: name, uri, signature`}},
		{"sig.yaml", "name: m\nuri: oci://r/k:1\nkind: kernelcache\nsignature:\n  polcy: off\n",
			[]string{`line 5: unknown key "polcy" (did you mean "policy"?); a signature policy's keys are: policy, keys, identity, identityRegexp, issuer, issuerRegexp, trustedRoot`}},
		// A value of the wrong type: its line and key, not the decoder's path.
		{"type.yaml", "models:\n- name: a\n  pin: true\n- name: b\n  pin: maybe\n", []string{`line 5: key "pin": want true or false, not a string`}},
		{"digest.yaml", "name: m\nuri: file:///x\ndigest: 123\n", []string{`line 3: key "digest": want a string, not a number`}},
		{"cluster.yaml", "name: m\nuri: file:///x\nstage: true\nrequester: {uid: 0}\n", []string{`line 3: key "stage" is set by the cluster sync`, `line 4: key "requester" is set by the daemon`}},
	} {
		path := filepath.Join(dir, tc.file)
		if err := os.WriteFile(path, []byte(tc.body), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := modelsDir{&Daemon{}}.parse(path)
		if err == nil {
			t.Errorf("%s: accepted", tc.file)
			continue
		}
		for _, w := range append(tc.want, path+": ") {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error lacks %q:\n%v", tc.file, w, err)
			}
		}
	}
	keys := strings.Join(modelsKeys(reflect.TypeFor[modelsFile]()), " ")
	for _, k := range []string{"name", "uri", "digest", "pin", "state", "include", "exclude", "kind", "signature", "kernelCaches", "credentialsFile", "models"} {
		if !strings.Contains(" "+keys+" ", " "+k+" ") {
			t.Errorf("the keys %q lack %q", keys, k)
		}
	}
	// Each field of a desire is a models.d key or one it refuses, and
	// each refused one is a field: neither list can drift from the type.
	dt := reflect.TypeFor[api.Desire]()
	for f := range dt.Fields() {
		n := jsonName(f)
		if _, refused := notInModelsDir[n]; refused == strings.Contains(" "+keys+" ", " "+n+" ") {
			t.Errorf("field %s (%q): a key %v, refused %v", f.Name, n, !refused, refused)
		}
	}
	for k := range notInModelsDir {
		if _, ok := modelsField(dt, k); !ok {
			t.Errorf("notInModelsDir names %q, no field of api.Desire", k)
		}
	}
}

// TestRetryFailedModelsDirDesire: a models.d desire that failed for good
// (its source behind a 0700 directory, read as nobody) names the
// directory that refused and the identity; once the cause is fixed,
// modelctl retry pulls it again, and so does touching its file.
func TestRetryFailedModelsDirDesire(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (models.d reads as nobody; the test makes a directory nobody may not search)", "run the tests as root, as CI does")
	}
	base := t.TempDir()
	traversable(t, base)
	src := filepath.Join(base, "closed", "deep", "m")
	os.MkdirAll(src, 0o755)
	os.WriteFile(filepath.Join(src, "w.bin"), []byte("weights"), 0o644)
	os.Chmod(filepath.Join(base, "closed"), 0o700)
	cfg := testConfig(t)
	os.MkdirAll(cfg.ModelsDir, 0o755)
	file := filepath.Join(cfg.ModelsDir, "m.yaml")
	os.WriteFile(file, []byte("name: m\nuri: file://"+src+"\n"), 0o644)
	h := start(t, cfg)
	a := h.waitPhase("m", api.PhaseFailed)
	for _, want := range []string{"the directory " + filepath.Join(base, "closed") + " (drwx------ root:root) on the way to " + src, "uid 65534", "search (x)"} {
		if !strings.Contains(a.Message, want) {
			t.Errorf("failure %q lacks %q", a.Message, want)
		}
	}
	if a.NextRetry != nil {
		t.Fatalf("an access refusal is retried by itself (%v); the test wants one that is not", a.NextRetry)
	}
	ctx := context.Background()
	if _, err := h.c.Retry(ctx, "nothing", false, nil); !errors.Is(err, api.ErrNotFound) {
		t.Fatalf("retry of an undesired name: %v", err)
	}
	os.Chmod(filepath.Join(base, "closed"), 0o755) // the fix, made elsewhere
	got, err := h.c.Retry(ctx, "m", true, nil)
	if err != nil || got.Phase != api.PhaseReady {
		t.Fatalf("retry after the fix: %+v %v", got, err)
	}
	if _, err := h.c.Retry(ctx, "m", false, nil); !errors.Is(err, api.ErrConflict) || !strings.Contains(err.Error(), "is Ready, not Failed") {
		t.Fatalf("retry of a Ready artifact: %v", err)
	}

	// It fails again (the file changes, the directory closes); touching
	// the models.d file, its content unchanged, retries it.
	os.WriteFile(filepath.Join(src, "w.bin"), []byte("new weights"), 0o644)
	os.Chmod(filepath.Join(base, "closed"), 0o700)
	h.d.mu.Lock()
	h.d.arts["m"].force = true // as a rollout would: pull m again, now refused
	h.d.mu.Unlock()
	h.d.kick()
	h.waitPhase("m", api.PhaseFailed)
	os.Chmod(filepath.Join(base, "closed"), 0o755)
	later := time.Now().Add(time.Second)
	if err := os.Chtimes(file, later, later); err != nil { // touch
		t.Fatal(err)
	}
	h.waitPhase("m", api.PhaseReady)
	if h.read("m", "w.bin") != "new weights" {
		t.Fatal("the retry after the touch did not pull the file anew")
	}
}
