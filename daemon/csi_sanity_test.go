package daemon

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/kubernetes-csi/csi-test/v5/pkg/sanity"
	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/csi"
)

// TestCSISanity runs csi-test's sanity suite (v5, pkg/sanity) against the
// driver over a real daemon with a Ready model: Identity and Node
// services, real bind mounts. The driver has no controller, so the suite
// would skip every publish; a stand-in controller beside it "creates" a
// volume whose context is the inline volume's attributes, as kubelet
// passes them, and the suite's controller specs are skipped.
func TestCSISanity(t *testing.T) {
	w := data(4000, 9)
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	cfg := csiConfig(t)
	h := start(t, cfg) // the daemon serves its own CSI socket too; the suite uses another
	defer h.stop()
	if _, err := h.pull(api.PullRequest{Name: "m", URI: srv.URL + "/w.bin#sha256=" + sha(w)}); err != nil {
		t.Fatal(err)
	}
	drvCfg := *cfg.CSI
	drvCfg.Socket = filepath.Join(t.TempDir(), "sanity.sock")
	drv, err := csi.New(drvCfg, h.d.CSIBackend())
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	csipb.RegisterIdentityServer(gs, sanityIdentity{drv})
	csipb.RegisterNodeServer(gs, drv)
	csipb.RegisterControllerServer(gs, &sanityController{attrs: map[string]string{csi.AttrModelCache: "m"}})
	ln, err := net.Listen("unix", drvCfg.Socket)
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(slowAccept{ln})
	defer gs.Stop()

	sc := sanity.NewTestConfig()
	sc.Address = "unix://" + drvCfg.Socket
	sc.TargetPath = filepath.Join(cfg.CSI.PodsDir, "sanity-pod") // the suite makes it and publishes at <it>/target
	sc.StagingPath = filepath.Join(t.TempDir(), "staging")       // never used: no staging
	sc.IdempotentCount = 3
	sc.TestVolumeSize = 0
	sanity.GinkgoTest(&sc)
	gomega.RegisterFailHandler(ginkgo.Fail)
	suite, reporter := ginkgo.GinkgoConfiguration()
	suite.SkipStrings = append(suite.SkipStrings, `\[Controller Server\]`, `\[GroupController`)
	reporter.Succinct = !testing.Verbose() && !reporter.Verbose && !reporter.VeryVerbose
	ginkgo.RunSpecs(t, "csi-sanity: "+csi.DriverName, suite, reporter)

	if raw, _ := h.d.records.Holds(); len(raw) != 0 {
		t.Errorf("holds left after the suite: %v", raw)
	}
	if ents, _ := os.ReadDir(sc.TargetPath); len(ents) != 0 {
		t.Errorf("left in the target directory: %v", ents)
	}
}

// slowAccept delays each accepted connection: csi-test's utils.Connect
// reads the state after grpc.Dial and waits for it to change, so a
// connection Ready before that read (a fast local socket) leaves it
// waiting its full minute.
type slowAccept struct{ net.Listener }

func (l slowAccept) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	time.Sleep(100 * time.Millisecond)
	return c, err
}

// sanityIdentity is the driver's identity plus a controller capability,
// so the suite runs its publish specs through sanityController.
type sanityIdentity struct{ *csi.Driver }

func (sanityIdentity) GetPluginCapabilities(context.Context, *csipb.GetPluginCapabilitiesRequest) (*csipb.GetPluginCapabilitiesResponse, error) {
	return &csipb.GetPluginCapabilitiesResponse{Capabilities: []*csipb.PluginCapability{{
		Type: &csipb.PluginCapability_Service_{Service: &csipb.PluginCapability_Service{Type: csipb.PluginCapability_Service_CONTROLLER_SERVICE}},
	}}}, nil
}

// sanityController creates "volumes" that are the inline volume's
// attributes under the requested name.
type sanityController struct {
	csipb.UnimplementedControllerServer
	attrs map[string]string
}

func (c *sanityController) ControllerGetCapabilities(context.Context, *csipb.ControllerGetCapabilitiesRequest) (*csipb.ControllerGetCapabilitiesResponse, error) {
	return &csipb.ControllerGetCapabilitiesResponse{Capabilities: []*csipb.ControllerServiceCapability{{
		Type: &csipb.ControllerServiceCapability_Rpc{Rpc: &csipb.ControllerServiceCapability_RPC{Type: csipb.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME}},
	}}}, nil
}

func (c *sanityController) CreateVolume(_ context.Context, req *csipb.CreateVolumeRequest) (*csipb.CreateVolumeResponse, error) {
	if req.GetName() == "" {
		return nil, status.Error(codes.InvalidArgument, "name is empty")
	}
	return &csipb.CreateVolumeResponse{Volume: &csipb.Volume{VolumeId: "sanity-" + req.GetName(), VolumeContext: c.attrs}}, nil
}

func (c *sanityController) DeleteVolume(context.Context, *csipb.DeleteVolumeRequest) (*csipb.DeleteVolumeResponse, error) {
	return &csipb.DeleteVolumeResponse{}, nil
}
