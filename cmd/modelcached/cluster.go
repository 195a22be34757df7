package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/urfave/cli/v2"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/modelcache/modelcache/daemon"
	"github.com/modelcache/modelcache/k8ssync"
)

// clusterConfig decides whether to sync with Kubernetes and how.
func clusterConfig(c *cli.Context) (*k8ssync.Config, error) {
	mode, node, kubeconfig := c.String("cluster"), c.String("node-name"), c.String("kubeconfig")
	inCluster := os.Getenv("KUBERNETES_SERVICE_HOST") != ""
	switch mode {
	case "off":
		return nil, nil
	case "auto":
		if node == "" || (kubeconfig == "" && !inCluster) {
			return nil, nil
		}
	case "on":
		if node == "" {
			return nil, errors.New("--cluster on: no node name; set NODE_NAME from the downward API (fieldRef spec.nodeName) or --node-name")
		}
	default:
		return nil, fmt.Errorf("--cluster %q: want auto, on or off", mode)
	}
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("--cluster: %w (give --kubeconfig, or run in a pod with a service account)", err)
	}
	return &k8ssync.Config{NodeName: node, Kube: rc, Namespace: c.String("lease-namespace"), LocalPVs: c.Bool("local-pvs"),
		StorageClass: c.String("pv-storage-class"), PVQPS: float32(c.Float64("pv-qps")), PVBurst: c.Int("pv-burst"),
		StatusInterval: c.Duration("status-interval"), Aggregate: true, Self: self(c)}, nil
}

// self names the daemon's own pod, "namespace/name", from POD_NAMESPACE and
// POD_NAME (--lease-namespace's environment variable and --pod-name); empty
// when either is missing.
func self(c *cli.Context) string {
	ns, name := os.Getenv("POD_NAMESPACE"), c.String("pod-name")
	if ns == "" || name == "" {
		return ""
	}
	return ns + "/" + name
}

// peerConfig reads the --peer-* flags and --origin-concurrency; nil when
// --peer-addr is off. The advertised address defaults to --peer-addr's
// host where it names one, else POD_IP (downward API status.podIP); the
// service account to POD_NAMESPACE/SERVICE_ACCOUNT_NAME.
func peerConfig(c *cli.Context) (*daemon.PeerConfig, error) {
	addr := c.String("peer-addr")
	if addr == "" {
		for _, f := range []string{"peer-advertise", "peer-static-token-file", "peers"} {
			if c.IsSet(f) {
				return nil, fmt.Errorf("--%s needs --peer-addr (fan-out between nodes is off without it)", f)
			}
		}
		return nil, nil
	}
	p := daemon.DefaultPeerConfig()
	p.Addr = addr
	p.Advertise = c.String("peer-advertise")
	if p.Advertise == "" {
		host, port, err := net.SplitHostPort(addr)
		if err == nil {
			if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
				p.Advertise = "http://" + net.JoinHostPort(host, port)
			} else if pod := os.Getenv("POD_IP"); pod != "" {
				p.Advertise = "http://" + net.JoinHostPort(pod, port)
			}
		}
	}
	p.TokenFile = c.String("peer-token-file")
	p.StaticTokenFile = c.String("peer-static-token-file")
	for _, s := range c.StringSlice("peers") {
		for _, x := range strings.Split(s, ",") {
			if x = strings.TrimSpace(x); x != "" {
				p.Peers = append(p.Peers, x)
			}
		}
	}
	p.ServiceAccount = c.String("peer-service-account")
	if ns, sa := os.Getenv("POD_NAMESPACE"), os.Getenv("SERVICE_ACCOUNT_NAME"); p.ServiceAccount == "" && ns != "" && sa != "" {
		p.ServiceAccount = ns + "/" + sa
	}
	p.MaxUploads = c.Int("peer-max-uploads")
	p.UploadRate = size(c, "peer-upload-rate")
	p.OriginConcurrency = c.Int("origin-concurrency")
	p.Wait = c.Duration("peer-wait")
	return &p, nil
}
