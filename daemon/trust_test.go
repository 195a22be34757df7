package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/daemon/kernels"
	"github.com/modelcache/modelcache/daemon/sources"
	"github.com/modelcache/modelcache/internal/testenv"
)

// peerGroup is the socket group of the trust tests: a member may mutate.
const peerGroup = 4242

// TestHelperPeerPull is not a test: TestSocketPeerReads runs it as another
// uid (setpriv) to pull through the socket as that peer.
func TestHelperPeerPull(t *testing.T) {
	sock := os.Getenv("MODELCACHE_HELPER_SOCKET")
	if sock == "" {
		t.Skip("a helper process of TestSocketPeerReads")
	}
	var req api.PullRequest
	json.Unmarshal([]byte(os.Getenv("MODELCACHE_HELPER_REQUEST")), &req)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := (&api.Client{Socket: sock}).Pull(ctx, req, true, nil)
	out := map[string]string{}
	if err != nil {
		out["error"] = err.Error()
		var e *api.Error
		if errors.As(err, &e) {
			out["code"] = e.Code
		}
	} else {
		out["phase"] = string(a.Phase)
	}
	b, _ := json.Marshal(out)
	fmt.Println("RESULT " + string(b))
}

// pullAs pulls req through the socket as uid 65534 in group peerGroup (a
// member of the socket group: it may mutate) and returns the outcome.
func pullAs(t *testing.T, sock string, req api.PullRequest) map[string]string {
	t.Helper()
	setpriv := testenv.Require(t, "setpriv", "apt-get install util-linux")
	raw, _ := json.Marshal(req)
	cmd := exec.Command(setpriv, "--reuid=65534", fmt.Sprintf("--regid=%d", peerGroup), "--clear-groups", os.Args[0], "-test.run=^TestHelperPeerPull$", "-test.count=1")
	cmd.Env = append(os.Environ(), "MODELCACHE_HELPER_SOCKET="+sock, "MODELCACHE_HELPER_REQUEST="+string(raw))
	out, err := cmd.CombinedOutput()
	for _, l := range strings.Split(string(out), "\n") {
		if r, ok := strings.CutPrefix(l, "RESULT "); ok {
			var m map[string]string
			json.Unmarshal([]byte(r), &m)
			return m
		}
	}
	t.Fatalf("helper as uid 65534: %v\n%s", err, out)
	return nil
}

// traversable opens dir and its parents up to the temp root to everyone
// (t.TempDir is 0700), so another uid reaches the socket and the files.
func traversable(t *testing.T, dir string) {
	t.Helper()
	for d := dir; d != "/" && d != filepath.Clean(os.TempDir()); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSocketPeerReads: a member of the socket group pulls over the socket
// only what its own uid and groups may read. /etc/shadow and another
// user's 0600 file are refused with a clear reason before anything is
// persisted, and nothing of them reaches the store; a world-readable file
// is pulled; root still pulls the private file.
func TestSocketPeerReads(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (to run a socket peer as another uid with setpriv)", "run the tests as root, as CI does")
	}
	cfg := testConfig(t)
	cfg.SocketGroup = fmt.Sprint(peerGroup)
	traversable(t, filepath.Dir(cfg.Socket))
	src := t.TempDir()
	traversable(t, src)
	os.WriteFile(filepath.Join(src, "public.bin"), []byte("public weights"), 0o644)
	os.WriteFile(filepath.Join(src, "private.bin"), []byte("PRIVATE someone's weights"), 0o600)
	h := start(t, cfg)

	for _, c := range []struct{ name, uri string }{
		{"shadow", "file:///etc/shadow"},
		{"private", "file://" + src + "/private.bin"},
	} {
		got := pullAs(t, cfg.Socket, api.PullRequest{Name: c.name, URI: c.uri})
		if got["code"] != api.CodeForbidden || !strings.Contains(got["error"], "requester") {
			t.Errorf("%s as a socket-group member: %v; want forbidden, naming the requester", c.uri, got)
		}
		if _, err := h.c.Get(context.Background(), c.name); !errors.Is(err, api.ErrNotFound) {
			t.Errorf("%s: a refused pull left a desire or an artifact: %v", c.name, err)
		}
	}
	if got := pullAs(t, cfg.Socket, api.PullRequest{Name: "public", URI: "file://" + src + "/public.bin"}); got["phase"] != string(api.PhaseReady) {
		t.Fatalf("a world-readable file as a member: %v", got)
	}
	if s := h.read("public", "public.bin"); s != "public weights" {
		t.Fatalf("public.bin: %q", s)
	}
	// The requester is recorded: a later re-pull (after a restart too)
	// reads as the member, not as the daemon.
	a, err := h.c.Get(context.Background(), "public")
	if err != nil || a.Desire == nil || a.Desire.Requester == nil || a.Desire.Requester.UID != 65534 {
		t.Fatalf("the desire does not record its requester: %+v %v", a.Desire, err)
	}
	if _, err := h.pull(api.PullRequest{Name: "rootpull", URI: "file://" + src + "/private.bin"}); err != nil {
		t.Fatalf("root pulls a root-only file: %v", err)
	}
	// Bytes of refused sources never reach a blob.
	filepath.Walk(filepath.Join(cfg.Root, "blobs"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			if bytes.HasPrefix(b, []byte("root:")) {
				t.Errorf("blob %s holds /etc/shadow", p)
			}
		}
		return nil
	})
}

// TestSocketRequestNamesNoNodePath: no field of a socket request makes the
// daemon open a path of the node: key and trusted-root paths (/dev/zero, a
// FIFO, a root-only file) are refused at once, a local source that is a
// device or a FIFO is refused by type, and nothing hangs or grows.
func TestSocketRequestNamesNoNodePath(t *testing.T) {
	cfg := testConfig(t)
	h := start(t, cfg)
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(t.TempDir(), "root-only.json")
	os.WriteFile(secret, []byte(`{"mediaType":"SECRET-FIELD"}`), 0o600)
	kc := func(p api.SignaturePolicy) api.PullRequest {
		return api.PullRequest{Name: "k", Kind: api.KindKernelCache, URI: "oci://127.0.0.1:1/k:v1", Signature: &p}
	}
	for _, c := range []struct {
		what string
		req  api.PullRequest
		want string
	}{
		{"key /dev/zero", kc(api.SignaturePolicy{Keys: []string{"/dev/zero"}}), "must be PEM text"},
		{"key FIFO", kc(api.SignaturePolicy{Keys: []string{fifo}}), "must be PEM text"},
		{"trusted root /dev/zero", kc(api.SignaturePolicy{Identity: "a@b", Issuer: "i", TrustedRoot: "/dev/zero"}), "must be its content"},
		{"trusted root FIFO", kc(api.SignaturePolicy{Identity: "a@b", Issuer: "i", TrustedRoot: fifo}), "must be its content"},
		{"trusted root root-only file", kc(api.SignaturePolicy{Identity: "a@b", Issuer: "i", TrustedRoot: secret}), "must be its content"},
		{"source /dev/zero", api.PullRequest{Name: "z", URI: "file:///dev/zero"}, "character device"},
		{"source FIFO", api.PullRequest{Name: "f", URI: "file://" + fifo}, "FIFO"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		_, err := h.c.Pull(ctx, c.req, false, nil)
		cancel()
		if err == nil || !strings.Contains(err.Error(), c.want) || errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: %v; want a refusal containing %q", c.what, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "SECRET-FIELD") {
			t.Errorf("%s: the error leaks the file's content: %v", c.what, err)
		}
	}
	if arts, _ := h.c.List(context.Background()); len(arts) != 0 {
		t.Fatalf("refused requests left desires: %+v", arts)
	}
}

// rawPull posts body to /v1/pull as this (root) process.
func rawPull(t *testing.T, sock, body string) (int, string) {
	t.Helper()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := hc.Post("http://modelcached/v1/pull", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestKernelCacheInjection: a socket client cannot attach a kernel cache
// to a model declared in models.d (the internal serves field is not part of
// the request), cannot turn signature checks off below the node's policy,
// and cannot take the name of a declared model's kernel cache; env of the
// declared model never points at what the client pulled.
func TestKernelCacheInjection(t *testing.T) {
	srv := newFileServer(t, map[string][]byte{"m/config.json": []byte(`{"model_type":"llama"}`)})
	cfg := testConfig(t)
	os.MkdirAll(cfg.ModelsDir, 0o755)
	os.WriteFile(filepath.Join(cfg.ModelsDir, "llama.yaml"), []byte(fmt.Sprintf(
		"name: llama\nuri: %s/m/config.json\nkernelCaches:\n- uri: oci://127.0.0.1:1/kernels/llama:sm90\n", srv.URL)), 0o644)
	h := start(t, cfg)
	h.waitPhase("llama", api.PhaseReady)

	evil := `{"name":"evil","uri":"oci://127.0.0.1:1/attacker/cache:v1","kind":"kernelcache","serves":"llama","signature":{"policy":"off"}}`
	if code, body := rawPull(t, cfg.Socket, evil); code != http.StatusBadRequest || !strings.Contains(body, `unknown field \"serves\"`) {
		t.Fatalf("a request carrying serves: %d %s", code, body)
	}
	for _, field := range []string{`"origin":"file:/etc/modelcached/models.d/x.yaml"`, `"requester":{"uid":0,"gid":0}`} {
		if code, body := rawPull(t, cfg.Socket, `{"name":"x","uri":"https://example.com/w.bin",`+field+`}`); code != http.StatusBadRequest || !strings.Contains(body, "unknown field") {
			t.Errorf("a request carrying %s: %d %s", field, code, body)
		}
	}
	off := `{"name":"evil","uri":"oci://127.0.0.1:1/attacker/cache:v1","kind":"kernelcache","signature":{"policy":"off"}}`
	if code, body := rawPull(t, cfg.Socket, off); code != http.StatusForbidden || !strings.Contains(body, "never turn it off") {
		t.Fatalf("policy off over the socket on a node that requires signatures: %d %s", code, body)
	}
	taken := `{"name":"llama.kc0","uri":"oci://127.0.0.1:1/attacker/cache:v1","kind":"kernelcache","signature":{"keys":["-----BEGIN PUBLIC KEY-----\nx\n-----END PUBLIC KEY-----"]}}`
	if code, body := rawPull(t, cfg.Socket, taken); code != http.StatusConflict || !strings.Contains(body, "llama") {
		t.Fatalf("a socket pull taking the name of a declared model's kernel cache: %d %s", code, body)
	}
	nested := `{"name":"j13","uri":"` + srv.URL + `/m/config.json","kernelCaches":[{"name":"llama.kc0","uri":"oci://127.0.0.1:1/attacker/cache:v1","signature":{"keys":["-----BEGIN PUBLIC KEY-----\nx\n-----END PUBLIC KEY-----"]}}]}`
	if code, body := rawPull(t, cfg.Socket, nested); code != http.StatusConflict || !strings.Contains(body, "llama.kc0") {
		t.Fatalf("a socket model listing a kernel cache under a declared model's kernel cache name: %d %s", code, body)
	}
	h.d.mu.Lock()
	kc := h.d.desires.merged()["llama.kc0"]
	h.d.mu.Unlock()
	if kc.Serves != "llama" || kc.URI != "oci://127.0.0.1:1/kernels/llama:sm90" {
		t.Fatalf("the declared kernel cache was replaced: %+v", kc)
	}
	env, err := h.c.Env(context.Background(), "llama")
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range env {
		if strings.Contains(v, "evil") || strings.Contains(v, "attacker") {
			t.Fatalf("env of the declared model points at the attacker's cache: %s=%s", k, v)
		}
	}
}

// TestNodeSignatureFloor: on a node whose policy is off a socket pull may
// still ask for required (tighten), and the node's policy is every
// desire's default.
func TestNodeSignatureFloor(t *testing.T) {
	floor := api.PolicyOff
	if p := kernels.EffectivePolicy(floor, api.Desire{Origin: sources.OriginAPI}, ""); p != api.PolicyOff {
		t.Fatalf("default on an off node: %s", p)
	}
	if p := kernels.EffectivePolicy(floor, api.Desire{Origin: sources.OriginAPI}, api.PolicyRequired); p != api.PolicyRequired {
		t.Fatalf("a pull tightening an off node: %s", p)
	}
	floor = api.PolicyRequired
	// A socket desire persisted before the floor existed is raised to it.
	if p := kernels.EffectivePolicy(floor, api.Desire{Origin: sources.OriginAPI}, api.PolicyOff); p != api.PolicyRequired {
		t.Fatalf("a persisted socket desire with policy off on a required node: %s", p)
	}
	if p := kernels.EffectivePolicy(floor, api.Desire{Origin: "file:/etc/modelcached/models.d/k.yaml"}, api.PolicyOff); p != api.PolicyOff {
		t.Fatalf("the node's own configuration may turn it off: %s", p)
	}
}

// TestBorrowedCredentials: a desire that claims to serve a ModelCache's
// model gets none of that model's Secret unless the daemon expanded it
// from the model's own desire, for the URI the model names.
func TestBorrowedCredentials(t *testing.T) {
	d := &Daemon{desires: newDesireSet(nil)}
	set, err := sources.New(sources.Config{}, nil, func() map[string]api.Desire { return d.desires.merged() })
	if err != nil {
		t.Fatal(err)
	}
	d.sources = set
	d.sources.SetCredentials(map[string]map[string]string{"llama": {"HF_TOKEN": "hf_secret"}})
	d.desires.cluster["llama"] = api.Desire{Name: "llama", URI: "hf://org/llama", Origin: "cluster:llama",
		KernelCaches: []api.KernelCacheRef{{URI: "oci://reg/kernels:sm90"}}}
	// A socket desire persisted by an older daemon that still carries serves.
	d.desires.api["thief"] = trustSocketDesire(api.Desire{Name: "thief", URI: "oci://attacker/x:v1", Origin: sources.OriginAPI, Serves: "llama"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	d.desires.api["thief2"] = api.Desire{Name: "thief2", URI: "oci://attacker/x:v1", Origin: "cluster:llama", Serves: "llama", Kind: api.KindKernelCache}
	if c := d.sources.CredentialsFor("thief"); c != nil {
		t.Fatalf("a socket desire borrowed the model's credentials: %v", c)
	}
	if c := d.sources.CredentialsFor("thief2"); c != nil {
		t.Fatalf("a desire not listed by the model borrowed its credentials: %v", c)
	}
	if c := d.sources.CredentialsFor("llama.kc0"); c["HF_TOKEN"] != "hf_secret" {
		t.Fatalf("the model's own kernel cache lost its credentials: %v", c)
	}
}

// TestCredentialsFile: a models.d desire gives an http source its
// Authorization header from a credentials file; the header reaches the
// source, the token reaches no view, log line or index record, and a bad
// file is refused by line and key without its values.
func TestCredentialsFile(t *testing.T) {
	const token = "Bearer TOPSECRET-42"
	w := data(3000, 77)
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	srv.hook = func(rw http.ResponseWriter, r *http.Request) bool {
		if r.Header.Get("Authorization") != token {
			http.Error(rw, "no", http.StatusUnauthorized)
			return true
		}
		return false
	}
	cfg := testConfig(t)
	var logs syncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	creds := filepath.Join(t.TempDir(), "src.env")
	os.WriteFile(creds, []byte("# the artifact server\nexport HTTP_AUTHORIZATION=\""+token+"\"\n"), 0o600)
	os.MkdirAll(cfg.ModelsDir, 0o755)
	os.WriteFile(filepath.Join(cfg.ModelsDir, "w.yaml"), []byte(fmt.Sprintf("name: w\nuri: %s/w.bin\ncredentialsFile: %s\n", srv.URL, creds)), 0o644)
	h := start(t, cfg)
	h.waitPhase("w", api.PhaseReady)
	if got := h.read("w", "w.bin"); got != string(w) {
		t.Fatalf("w.bin: %d bytes", len(got))
	}
	a, _ := h.c.Get(context.Background(), "w")
	view, _ := json.Marshal(a)
	raw, _ := h.d.Store().Records().Desires()
	st, _ := json.Marshal(raw)
	for what, s := range map[string]string{"inspect": string(view), "index": string(st), "log": logs.String()} {
		if strings.Contains(s, "TOPSECRET") {
			t.Errorf("%s shows the token", what)
		}
	}
	// Without the file the source refuses: the header came from it.
	if _, err := h.pull(api.PullRequest{Name: "bare", URI: srv.URL + "/w.bin"}); err == nil {
		t.Fatal("the source served without the Authorization header")
	}

	bad := filepath.Join(t.TempDir(), "bad.env")
	os.WriteFile(bad, []byte("HF_TOKEN=ok\nPASSWORD=hunter2\n"), 0o600)
	if _, err := sources.ReadCredentialsFile(bad); err == nil || !strings.Contains(err.Error(), "line 2") || !strings.Contains(err.Error(), `"PASSWORD"`) || strings.Contains(err.Error(), "hunter2") {
		t.Fatalf("an unknown key: %v", err)
	}
	fifo := filepath.Join(t.TempDir(), "fifo.env")
	syscall.Mkfifo(fifo, 0o600)
	if _, err := sources.ReadCredentialsFile(fifo); err == nil || !strings.Contains(err.Error(), "FIFO") {
		t.Fatalf("a FIFO as credentials file: %v", err)
	}
}

// TestHelperPidReuse is not a test: TestPeerGroupsNotFromProc runs it as
// another uid. Role "connect" connects to the socket, hands the
// connection to a "hold" process and exits, so its pid is free for reuse;
// "hold" waits for the go file, then posts a pull on that connection.
func TestHelperPidReuse(t *testing.T) {
	switch os.Getenv("MODELCACHE_HELPER_ROLE") {
	case "connect":
		c, err := net.Dial("unix", os.Getenv("MODELCACHE_HELPER_SOCKET"))
		if err != nil {
			fmt.Println("RESULT dial: " + err.Error())
			return
		}
		f, _ := c.(*net.UnixConn).File()
		cmd := exec.Command(os.Args[0], "-test.run=^TestHelperPidReuse$", "-test.count=1")
		cmd.Env = append(os.Environ(), "MODELCACHE_HELPER_ROLE=hold")
		cmd.ExtraFiles = []*os.File{f}
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Start(); err != nil {
			fmt.Println("RESULT start: " + err.Error())
			return
		}
		fmt.Printf("CONNECTED %d\n", os.Getpid())
	case "hold":
		c, err := net.FileConn(os.NewFile(3, "conn"))
		if err != nil {
			fmt.Println("RESULT fileconn: " + err.Error())
			return
		}
		for {
			if _, err := os.Stat(os.Getenv("MODELCACHE_HELPER_GO")); err == nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		body := `{"name":"borrowed","uri":"https://example.com/w.bin"}`
		fmt.Fprintf(c, "POST /v1/pull HTTP/1.1\r\nHost: d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		b := make([]byte, 12)
		io.ReadFull(c, b)
		fmt.Println("RESULT " + string(b))
	default:
		t.Skip("a helper process of TestPeerGroupsNotFromProc")
	}
}

// TestPeerGroupsNotFromProc: a plain user connects, hands the connection
// to another process and exits; a member of the socket group then gets
// the dead process's pid. The plain user's request on the old connection
// must not borrow that member's groups: the groups are the socket's own
// record from connect time (SO_PEERGROUPS), not /proc/<pid>.
func TestPeerGroupsNotFromProc(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (to run peers as other uids and steer pid allocation)", "run the tests as root, as CI does")
	}
	setpriv := testenv.Require(t, "setpriv", "apt-get install util-linux")
	if _, err := os.Stat("/proc/sys/kernel/ns_last_pid"); err != nil {
		testenv.Missing(t, "/proc/sys/kernel/ns_last_pid", "a Linux kernel with checkpoint/restore support")
	}
	cfg := testConfig(t)
	cfg.SocketGroup = fmt.Sprint(peerGroup)
	traversable(t, filepath.Dir(cfg.Socket))
	start(t, cfg)
	// The helper re-executes itself as uid 65534: a copy of the test
	// binary it may execute (go test's build dir is 0700).
	bin := filepath.Join(t.TempDir(), "daemon.test")
	traversable(t, filepath.Dir(bin))
	if b, err := os.ReadFile(os.Args[0]); err != nil || os.WriteFile(bin, b, 0o755) != nil {
		t.Fatalf("copy the test binary: %v", err)
	}
	gofile := filepath.Join(t.TempDir(), "go")
	const attempts = 200
	for attempt := 0; attempt < attempts; attempt++ {
		cmd := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", bin, "-test.run=^TestHelperPidReuse$", "-test.count=1")
		cmd.Env = append(os.Environ(), "MODELCACHE_HELPER_ROLE=connect", "MODELCACHE_HELPER_SOCKET="+cfg.Socket, "MODELCACHE_HELPER_GO="+gofile)
		var out syncBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pid := cmd.Process.Pid // setpriv execs the helper: the same pid
		// The connecting process is gone once it exits; "hold" has the
		// connection (and the output pipe, so cmd.Wait would wait for it).
		cmd.Process.Wait()
		testenv.Poll(time.Second, func() error { // the output is checked below
			if s := out.String(); !strings.Contains(s, "CONNECTED") && !strings.Contains(s, "RESULT") {
				return errors.New("nothing yet")
			}
			return nil
		})
		if !strings.Contains(out.String(), fmt.Sprintf("CONNECTED %d", pid)) {
			t.Fatalf("helper: %s", out.String())
		}
		if err := os.WriteFile("/proc/sys/kernel/ns_last_pid", []byte(fmt.Sprint(pid-1)), 0); err != nil {
			// A kernel permission of this machine, not a tool to install:
			// CI's machine must grant it, as it grants root.
			testenv.Missing(t, fmt.Sprintf("a writable /proc/sys/kernel/ns_last_pid (%v), to stage the pid-reuse attack", err),
				"run the tests as root in the initial pid namespace, or with CAP_CHECKPOINT_RESTORE")
		}
		member := exec.Command(setpriv, "--reuid=65534", "--regid=65534", fmt.Sprintf("--groups=%d", peerGroup), "sleep", "30")
		if err := member.Start(); err != nil {
			t.Fatal(err)
		}
		if member.Process.Pid != pid {
			member.Process.Kill()
			member.Wait()
			os.WriteFile(gofile, nil, 0o644) // release this attempt's holder
			time.Sleep(100 * time.Millisecond)
			os.Remove(gofile)
			continue
		}
		os.WriteFile(gofile, nil, 0o644)
		testenv.Poll(20*time.Second, func() error { // the verdict is checked below, with what came
			if !strings.Contains(out.String(), "RESULT") {
				return errors.New("no RESULT yet")
			}
			return nil
		})
		member.Process.Kill()
		member.Wait()
		res := out.String()
		if !strings.Contains(res, "RESULT HTTP/1.1 403") {
			t.Fatalf("a plain user's old connection, its pid now a socket-group member's: %q; want 403", res)
		}
		return
	}
	// Another process took the pid every time: on a busy machine one
	// attempt in a few loses the race for the pid, never two hundred.
	t.Fatalf("could not give the dead peer's pid to a socket-group member in %d attempts: the attack was not staged", attempts)
}

// TestSharedKernelCacheWinnerIsStable: two models naming the same kernel
// cache give it the same source every time (the first model by name; a
// declared model over a socket one), not whichever map order comes up.
func TestSharedKernelCacheWinnerIsStable(t *testing.T) {
	d := &Daemon{desires: newDesireSet(nil)}
	for _, n := range []string{"m3", "m1", "m2", "m4", "m5"} {
		d.desires.api[n] = api.Desire{Name: n, URI: "hf://o/" + n, Origin: sources.OriginAPI,
			KernelCaches: []api.KernelCacheRef{{Name: "shared", URI: "oci://r/" + n + ":sm90"}}}
	}
	for i := 0; i < 200; i++ {
		if got := d.desires.merged()["shared"]; got.Serves != "m1" {
			t.Fatalf("pass %d: the shared kernel cache serves %s (%s), want m1", i, got.Serves, got.URI)
		}
	}
	d.desires.file["z9"] = api.Desire{Name: "z9", URI: "hf://o/z9", Origin: sources.OriginFile + "/etc/modelcached/models.d/z9.yaml",
		KernelCaches: []api.KernelCacheRef{{Name: "shared", URI: "oci://r/z9:sm90"}}}
	for i := 0; i < 200; i++ {
		if got := d.desires.merged()["shared"]; got.Serves != "z9" {
			t.Fatalf("pass %d: a declared model's kernel cache lost to a socket one: %s", i, got.Serves)
		}
	}
}
