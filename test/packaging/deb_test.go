package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/internal/testenv"
)

// TestDebPackage builds the .deb as make deb does, runs lintian on it,
// installs it into a throwaway root with dpkg (maintainer scripts run
// chrootless, honouring DPKG_ROOT), checks files, modes, the group and
// modelcached --version, then removes it (the cache stays) and purges it
// (the cache goes).
func TestDebPackage(t *testing.T) {
	testenv.Require(t, "dpkg-deb", "apt-get install dpkg")
	lintian := testenv.Require(t, "lintian", "apt-get install --no-install-recommends lintian")
	testenv.Require(t, "systemd-sysusers", "apt-get install systemd")
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (dpkg --root installs files owned by root)", "run the tests as root, as CI does")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	for _, c := range []string{"modelcached", "modelctl"} {
		cmd := exec.Command("go", "build", "-trimpath", "-buildmode=pie", "-ldflags", "-s -w -X main.version=9.9.9-test", "-o", filepath.Join(bin, c), "github.com/modelcache/modelcache/cmd/"+c)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("build %s: %v\n%s", c, err, out)
		}
	}
	out, err := exec.Command(filepath.Join("..", "..", "packaging", "deb", "build.sh"), bin, "9.9.9", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("build.sh: %v\n%s", err, out)
	}
	deb := strings.TrimSpace(string(out))

	if out, err := exec.Command(lintian, "--fail-on", "warning,error", deb).CombinedOutput(); err != nil {
		t.Fatalf("lintian: %v\n%s", err, out)
	}

	root := filepath.Join(dir, "root")
	for _, d := range []string{"var/lib/dpkg/updates", "var/lib/dpkg/info", "etc"} {
		os.MkdirAll(filepath.Join(root, d), 0o755)
	}
	for _, f := range []string{"var/lib/dpkg/status", "etc/group", "etc/passwd"} {
		os.WriteFile(filepath.Join(root, f), nil, 0o644)
	}
	dpkg := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("dpkg", append([]string{"--root=" + root, "--force-script-chrootless", "--force-depends"}, args...)...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("dpkg %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	dpkg("-i", deb)

	modes := map[string]os.FileMode{
		"usr/bin/modelcached":                               0o755,
		"usr/bin/modelctl":                                  0o755,
		"usr/lib/systemd/system/modelcached.service":        0o644,
		"usr/lib/systemd/system/modelcached.socket":         0o644,
		"usr/lib/sysusers.d/modelcache.conf":                0o644,
		"usr/lib/tmpfiles.d/modelcache.conf":                0o644,
		"etc/modelcached/config.yaml":                       0o644,
		"etc/modelcached/models.d":                          0o755 | os.ModeDir,
		"usr/share/bash-completion/completions/modelctl":    0o644,
		"usr/share/zsh/vendor-completions/_modelctl":        0o644,
		"usr/share/fish/vendor_completions.d/modelctl.fish": 0o644,
		"usr/share/man/man1/modelctl.1.gz":                  0o644,
		"usr/share/man/man8/modelcached.8.gz":               0o644,
		"var/lib/modelcache":                                0o755 | os.ModeDir,
	}
	for p, want := range modes {
		fi, err := os.Stat(filepath.Join(root, p))
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", p, fi.Mode(), want)
		}
	}
	// The shipped completions are what 'modelctl completion SHELL' prints.
	for sh, p := range map[string]string{"bash": "usr/share/bash-completion/completions/modelctl", "zsh": "usr/share/zsh/vendor-completions/_modelctl", "fish": "usr/share/fish/vendor_completions.d/modelctl.fish"} {
		want, err := exec.Command(filepath.Join(bin, "modelctl"), "completion", sh).Output()
		got, _ := os.ReadFile(filepath.Join(root, p))
		if err != nil || len(want) == 0 || string(got) != string(want) {
			t.Errorf("%s: not the script of 'modelctl completion %s' (%v)", p, sh, err)
		}
	}
	if g, _ := os.ReadFile(filepath.Join(root, "etc/group")); !strings.Contains(string(g), "modelcache:x:") {
		t.Errorf("postinst did not create the modelcache group: %q", g)
	}
	v, err := exec.Command(filepath.Join(root, "usr/bin/modelcached"), "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(v), "9.9.9-test") {
		t.Errorf("modelcached --version: %q %v", v, err)
	}
	if s := dpkg("-s", "modelcache"); !strings.Contains(s, "Status: install ok installed") || !strings.Contains(s, "Conffiles:") {
		t.Errorf("dpkg -s: %s", s)
	}
	// The cached data survives a remove and goes with a purge.
	blob := filepath.Join(root, "var/lib/modelcache/index.db")
	os.WriteFile(blob, []byte("cache"), 0o644)
	dpkg("-r", "modelcache")
	if _, err := os.Stat(blob); err != nil {
		t.Fatalf("remove must leave the cache: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "usr/bin/modelcached")); err == nil {
		t.Fatal("remove left the binary")
	}
	dpkg("-P", "modelcache")
	if _, err := os.Stat(filepath.Join(root, "var/lib/modelcache")); !os.IsNotExist(err) {
		t.Fatalf("purge must delete the cache: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/modelcached/config.yaml")); !os.IsNotExist(err) {
		t.Fatalf("purge must delete the conffile: %v", err)
	}
}
