package fanout

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/internal/testenv"
)

// daemonProc is one modelcached process in its namespace.
type daemonProc struct {
	name   string
	addr   netip.Addr
	dir    string
	client *api.Client
	cmd    *exec.Cmd
	log    string // its log file
	exited chan struct{}
	err    error // Wait's, once exited is closed
}

// start runs modelcached as node name in namespace ns: its own root,
// socket and models dir, the cluster through the forwarder, the origin
// on the bridge, and with peers its peer port on addr.
func (h *Harness) start(name, ns string, addr netip.Addr, peers bool) (*daemonProc, error) {
	dir := filepath.Join(h.dir, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	d := &daemonProc{name: name, addr: addr, dir: dir, client: &api.Client{Socket: filepath.Join(dir, "mc.sock")},
		log: filepath.Join(h.opt.LogDir, name+".log"), exited: make(chan struct{})}
	logf, err := os.Create(d.log)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the daemon holds its own descriptor
	args := []string{"netns", "exec", ns, h.bin,
		"--root", filepath.Join(dir, "root"), "--socket", d.client.Socket, "--socket-group", "",
		"--metrics-addr", "", "--models-dir", filepath.Join(dir, "models.d"),
		"--cluster", "on", "--kubeconfig", h.kubecfg, "--node-name", name, "--lease-namespace", Namespace,
		"--retry-initial", "1s",
		// Watermarks off: the store is bounded by its filesystem alone,
		// which other tests share; this measures fan-out, not eviction.
		"--high-watermark", "0", "--low-watermark", "0"}
	if h.opt.StatusInterval > 0 {
		args = append(args, "--status-interval", h.opt.StatusInterval.String())
	}
	if peers {
		hp := net.JoinHostPort(addr.String(), strconv.Itoa(PeerPort))
		args = append(args, "--peer-addr", hp, "--peer-advertise", "http://"+hp,
			"--peer-token-file", h.token, "--peer-service-account", Namespace+"/"+ServiceAccount)
	}
	args = append(args, h.opt.Flags...)
	d.cmd = exec.Command("ip", args...)
	d.cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir, "HF_ENDPOINT=" + h.hub.URL()}
	d.cmd.Stdout, d.cmd.Stderr = logf, logf
	// ip netns exec execs the daemon in its own process: the signal
	// reaches it, and it dies with the test process.
	d.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := d.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { d.err = d.cmd.Wait(); close(d.exited) }()
	return d, nil
}

// failed is cond's error that ends an await at once.
type failed struct{ err error }

func (f failed) Error() string { return f.err.Error() }

// await polls cond (testenv.Poll) until it holds, the timeout passes,
// ctx ends, the daemon exits or cond returns a failed error; the error
// then carries the daemon's log's tail.
func (d *daemonProc) await(ctx context.Context, what string, timeout time.Duration, cond func() error) error {
	var ended error
	err := testenv.Poll(timeout, func() error {
		select {
		case <-d.exited:
			ended = fmt.Errorf("%s: modelcached exited (%v):\n%s", what, d.err, d.tail())
			return nil
		case <-ctx.Done():
			ended = fmt.Errorf("%s: given up (another daemon failed)", what)
			return nil
		default:
		}
		err := cond()
		var f failed
		if errors.As(err, &f) {
			ended = fmt.Errorf("%s: %v\n%s", what, f.err, d.tail())
			return nil
		}
		return err
	})
	if ended != nil {
		return ended
	}
	if err != nil {
		return fmt.Errorf("%s: not within %v: %v\n%s", what, timeout, err, d.tail())
	}
	return nil
}

// stop sends SIGTERM, then SIGKILL after 20 s.
func (d *daemonProc) stop() {
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(20 * time.Second):
		d.cmd.Process.Kill()
		<-d.exited
	}
}

// tail is the end of the daemon's log.
func (d *daemonProc) tail() string {
	b, err := os.ReadFile(d.log)
	if err != nil {
		return err.Error()
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}
