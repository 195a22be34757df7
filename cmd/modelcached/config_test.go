package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
)

// withConfig runs modelcached's command line with a config file holding
// body and the extra args, and returns what the flags read then.
func withConfig(t *testing.T, body string, args ...string) (*cli.Context, error) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	app := newApp()
	var got *cli.Context
	var aerr error
	app.Action = func(c *cli.Context) error {
		got, aerr = c, applyConfigFile(c, c.App.Flags, f)
		return nil
	}
	if err := app.Run(append([]string{"modelcached", "--config", f}, args...)); err != nil {
		t.Fatal(err)
	}
	return got, aerr
}

// TestConfigFileKeysAreFlags: every key is a flag's name and takes what
// the flag takes (sizes with units, durations, lists); the command line
// wins; the keys of earlier releases still work.
func TestConfigFileKeysAreFlags(t *testing.T) {
	c, err := withConfig(t, `
quota: 500Gi
min-age: 10m
high-watermark: 90
bandwidth-limit: 100M
write-buffer-size: 1Mi
file-roots: [/srv/models, /mnt/nfs]
file-identity: 1000:10
direct-io: false
maxConnectionsPerUID: 8
warm: false
warm-share: 0.5
warm-limit: 16Gi
`, "--min-age", "5m")
	if err != nil {
		t.Fatal(err)
	}
	if q := size(c, "quota"); q != 500<<30 {
		t.Errorf("quota %d, want 500Gi", q)
	}
	if b := size(c, "bandwidth-limit"); b != 100_000_000 {
		t.Errorf("bandwidth-limit %d, want 100M", b)
	}
	if b := size(c, "write-buffer-size"); b != 1<<20 {
		t.Errorf("write-buffer-size %d, want 1Mi", b)
	}
	if d := c.Duration("min-age"); d != 5*time.Minute {
		t.Errorf("min-age %s: the command line's 5m must win over the file's 10m", d)
	}
	if h := c.Int("high-watermark"); h != 90 {
		t.Errorf("high-watermark %d", h)
	}
	if r := c.StringSlice("file-roots"); strings.Join(r, ",") != "/srv/models,/mnt/nfs" {
		t.Errorf("file-roots %v", r)
	}
	if id := c.String("file-identity"); id != "1000:10" {
		t.Errorf("file-identity %q, want 1000:10 as written (not YAML 1.1's base 60)", id)
	}
	if c.Bool("direct-io") {
		t.Error("direct-io: false was not applied")
	}
	if n := c.Int("max-connections-per-uid"); n != 8 {
		t.Errorf("the old key maxConnectionsPerUID gave %d, want 8", n)
	}
	if c.Bool("warm") || c.Float64("warm-share") != 0.5 || size(c, "warm-limit") != 16<<30 {
		t.Errorf("warm %v, warm-share %v, warm-limit %d; want false, 0.5, 16Gi", c.Bool("warm"), c.Float64("warm-share"), size(c, "warm-limit"))
	}
}

// TestConfigFileErrors: every bad key and value is named, unknown keys
// with the valid ones (and a close match), and a syntax error says YAML.
func TestConfigFileErrors(t *testing.T) {
	_, err := withConfig(t, "qouta: 5G\nmin-age: 5\nhigh-watermark: [1, 2]\nconfig: other.yaml\n")
	if err == nil {
		t.Fatal("a config with four bad keys was accepted")
	}
	for _, want := range []string{
		`unknown key "qouta" (did you mean "quota"?)`, "the keys are the flags' names:", "min-age, ", // the valid keys are listed
		`min-age: "5": want a duration`, "high-watermark: want one value, not a list", `unknown key "config"`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	_, err = withConfig(t, "quota: [unclosed\n")
	if err == nil || !strings.Contains(err.Error(), "not valid YAML") || strings.Contains(err.Error(), "JSON") {
		t.Fatalf("syntax error: %v; want it to say YAML and not JSON", err)
	}
	_, err = withConfig(t, "- quota\n")
	if err == nil || !strings.Contains(err.Error(), "want a YAML mapping") {
		t.Fatalf("a list instead of a mapping: %v", err)
	}
}

// TestPackagedConfigKeys: every example key of the config file the .deb
// ships, uncommented, is a flag modelcached accepts.
func TestPackagedConfigKeys(t *testing.T) {
	raw, err := os.ReadFile("../../packaging/deb/config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, line := range strings.Split(string(raw), "\n") {
		kv, ok := strings.CutPrefix(line, "# ")
		if k, _, isKey := strings.Cut(kv, ": "); ok && isKey && !strings.Contains(k, " ") {
			keys = append(keys, strings.TrimSpace(kv))
		}
	}
	if len(keys) < 10 {
		t.Fatalf("found %d example keys in the packaged config", len(keys))
	}
	if _, err := withConfig(t, strings.Join(keys, "\n")+"\n"); err != nil {
		t.Fatalf("the packaged config's examples, uncommented: %v", err)
	}
	if _, err := withConfig(t, string(raw)); err != nil {
		t.Fatalf("the packaged config as shipped: %v", err)
	}
}

func TestSpareProcs(t *testing.T) {
	for _, c := range []struct {
		env       string
		def, want int
	}{
		{"", 2, 4},  // two spare Ps beside the CPUs
		{"", 1, 3},  // a cgroup limit of one CPU
		{"3", 2, 0}, // the operator's GOMAXPROCS stands
	} {
		if got := spareProcs(c.env, c.def); got != c.want {
			t.Errorf("spareProcs(%q, %d) = %d, want %d", c.env, c.def, got, c.want)
		}
	}
}

// TestConfigFileReadsValuesAsWritten: a value is read as the flag reads
// its text: socket-mode: 0660 is the octal mode 0660 (YAML 1.1 would make
// it the integer 432), in a list too; a quoted value is the same.
func TestConfigFileReadsValuesAsWritten(t *testing.T) {
	for _, body := range []string{"socket-mode: 0660\n", "socket-mode: \"0660\"\n", "socket-mode: 0o660\n"} {
		c, err := withConfig(t, body)
		if err != nil {
			t.Fatalf("%q: %v", body, err)
		}
		if got := c.String("socket-mode"); strings.TrimPrefix(got, "0o") != "660" && got != "0660" {
			t.Errorf("%q: socket-mode %q, want the text 0660", body, got)
		}
	}
	c, err := withConfig(t, "file-roots: [0755, /srv]\n")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.StringSlice("file-roots"); strings.Join(got, ",") != "0755,/srv" {
		t.Errorf("file-roots %q, want the elements as written", got)
	}
}

// TestPeerSettingsFromConfigFile: the peer settings come from the config
// file like any flag; the advertised address defaults to --peer-addr's
// host, or POD_IP where it names none; the service account to
// POD_NAMESPACE/SERVICE_ACCOUNT_NAME; a peer flag without --peer-addr is
// refused.
func TestPeerSettingsFromConfigFile(t *testing.T) {
	t.Setenv("POD_IP", "10.1.2.3")
	t.Setenv("POD_NAMESPACE", "modelcache-system")
	t.Setenv("SERVICE_ACCOUNT_NAME", "modelcached")
	c, err := withConfig(t, `
peer-addr: ":7435"
peer-max-uploads: 8
peer-upload-rate: 200M
origin-concurrency: 3
peer-wait: 10m
`)
	if err != nil {
		t.Fatal(err)
	}
	p, err := peerConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	if p.Advertise != "http://10.1.2.3:7435" || p.ServiceAccount != "modelcache-system/modelcached" || p.MaxUploads != 8 ||
		p.UploadRate != 200_000_000 || p.OriginConcurrency != 3 || p.Wait != 10*time.Minute {
		t.Fatalf("peer config %+v", p)
	}
	c, err = withConfig(t, `
peer-addr: 192.168.0.7:7435
peer-static-token-file: /etc/modelcached/peer-token
peers: [192.168.0.7:7435, "192.168.0.8:7435,192.168.0.9:7435"]
`)
	if err != nil {
		t.Fatal(err)
	}
	if p, err = peerConfig(c); err != nil || p.Advertise != "http://192.168.0.7:7435" || len(p.Peers) != 3 {
		t.Fatalf("static fleet: %+v, %v", p, err)
	}
	c, err = withConfig(t, "peers: [192.168.0.8:7435]\n")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := peerConfig(c); err == nil || !strings.Contains(err.Error(), "--peer-addr") {
		t.Fatalf("--peers without --peer-addr: %v", err)
	}
}
