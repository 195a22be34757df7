// Package packaging checks the files under packaging/ with the tools
// their platforms use.
package packaging

import (
	"github.com/modelcache/modelcache/internal/testenv"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSystemdUnitsVerify runs systemd-analyze verify on the units, with
// ExecStart pointing at a freshly built modelcached.
func TestSystemdUnitsVerify(t *testing.T) {
	sa := testenv.Require(t, "systemd-analyze", "apt-get install systemd")
	dir := t.TempDir()
	bin := filepath.Join(dir, "modelcached")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/modelcache/modelcache/cmd/modelcached").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	var units []string
	for _, u := range []string{"modelcached.service", "modelcached.socket"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "packaging", "systemd", u))
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, u)
		os.WriteFile(p, []byte(strings.ReplaceAll(string(b), "/usr/bin/modelcached", bin)), 0o644)
		units = append(units, p)
	}
	out, err := exec.Command(sa, append([]string{"verify", "--man=no"}, units...)...).CombinedOutput()
	if err != nil || strings.Contains(string(out), "modelcached") {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
	// The flags in ExecStart are ones the binary accepts.
	svc, _ := os.ReadFile(units[0])
	for _, line := range strings.Split(string(svc), "\n") {
		if args, ok := strings.CutPrefix(line, "ExecStart="+bin+" "); ok {
			f := strings.Fields(args)
			for _, a := range f {
				if strings.HasPrefix(a, "--") {
					help, _ := exec.Command(bin, "--help").CombinedOutput()
					if !strings.Contains(string(help), a+" ") {
						t.Errorf("ExecStart uses %s, which modelcached does not know", a)
					}
				}
			}
		}
	}
}
