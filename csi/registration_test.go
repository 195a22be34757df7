package csi

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	regpb "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/modelcache/modelcache/internal/testenv"
)

type noHolds struct{ Backend }

func (noHolds) Holds() ([]Volume, error) { return nil, nil }

// TestRegistration plays kubelet's plugin watcher: the registration
// socket appears in the registry directory, GetInfo names the driver and
// its CSI endpoint, and the socket goes when the driver stops.
func TestRegistration(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{Socket: filepath.Join(dir, "plugins", DriverName, "csi.sock"), RegistrationDir: filepath.Join(dir, "plugins_registry"), PodsDir: dir, NodeID: "n"}
	old := syscall.Umask(0) // the sockets' mode must not depend on it
	defer syscall.Umask(old)
	d, err := New(cfg, noHolds{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Serve(ctx) }()
	sock := filepath.Join(cfg.RegistrationDir, DriverName+"-reg.sock")
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var info *regpb.PluginInfo
	testenv.Eventually(t, "the registration socket answers", 10*time.Second, func() (err error) {
		info, err = regpb.NewRegistrationClient(conn).GetInfo(ctx, &regpb.InfoRequest{})
		return err
	})
	// Only root (kubelet) may reach either socket, whatever the umask.
	for _, p := range []string{cfg.Socket, sock} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: mode %v (%v), want 0600", p, fi.Mode().Perm(), err)
		}
	}
	if info.Type != regpb.CSIPlugin || info.Name != DriverName || info.Endpoint != cfg.Socket || len(info.SupportedVersions) == 0 {
		t.Fatalf("GetInfo: %+v", info)
	}
	if _, err := regpb.NewRegistrationClient(conn).NotifyRegistrationStatus(ctx, &regpb.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if m, _ := filepath.Glob(filepath.Join(cfg.RegistrationDir, "*")); len(m) != 0 {
		t.Fatalf("left in the registry directory: %v", m)
	}
}
