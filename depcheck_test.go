package modelcache_test

import (
	"os/exec"
	"sort"
	"strings"
	"testing"
)

// The dependency guard, in go-containerregistry's depcheck style: what a
// package links is its transitive closure (go list's Deps), so a ban
// holds however many packages lie between. A rule names a package and,
// with a trailing "/...", its sub-packages.

const mod = "github.com/modelcache/modelcache/"

// banned: no package a rule names may link anything that starts with one
// of its prefixes ("mod:x" is the module's package x and its sub-packages).
var banned = map[string][]string{
	// The CLI talks to the socket: it links the wire types and nothing
	// that watches clusters, fetches, loads NVML or opens the index. Its
	// one exception, modelctl kernelcache, builds, pushes and signs images
	// in the user's process with the user's credentials: the registry
	// client and cosign's signing library (package kernelcache), and the
	// image layout (gpu/mcv), never gpu itself (NVML).
	"cmd/modelctl": {"k8s.io/", "sigs.k8s.io/controller-runtime", "github.com/aws/",
		"github.com/NVIDIA/go-nvml", "go.etcd.io/bbolt", "github.com/prometheus/",
		"mod:daemon", "mod:fetchers", "mod:k8ssync", "mod:cachestore", "=" + mod + "gpu"},
	// kernelcache links no daemon side: no fetchers (their outbound
	// policy is the daemon's), no store, no NVML.
	"kernelcache/...": {"k8s.io/", "github.com/aws/", "github.com/NVIDIA/go-nvml", "go.etcd.io/bbolt", "github.com/prometheus/",
		"mod:daemon", "mod:fetchers", "mod:k8ssync", "mod:cachestore", "=" + mod + "gpu"},
	// The store knows nothing about networks, Kubernetes or GPUs.
	"cachestore/...": {"net", "k8s.io/", "github.com/aws/", "github.com/sigstore/", "github.com/NVIDIA/go-nvml", "github.com/google/go-containerregistry"},
	"gpu":            {"k8s.io/", "github.com/aws/", "github.com/sigstore/", "go.etcd.io/bbolt", "net"},
	// A scheme's SDK stays in its own sub-package.
	"fetchers":      {"k8s.io/", "github.com/aws/", "github.com/sigstore/", "github.com/google/go-containerregistry"},
	"fetchers/file": {"k8s.io/", "github.com/aws/", "github.com/sigstore/", "github.com/google/go-containerregistry"},
	"fetchers/http": {"k8s.io/", "github.com/aws/", "github.com/sigstore/", "github.com/google/go-containerregistry"},
	"fetchers/hf":   {"k8s.io/", "github.com/aws/", "github.com/sigstore/", "github.com/google/go-containerregistry"},
	"fetchers/ngc":  {"k8s.io/", "github.com/aws/", "github.com/sigstore/", "github.com/google/go-containerregistry"},
	"fetchers/s3":   {"k8s.io/", "github.com/sigstore/", "github.com/google/go-containerregistry"},
	"fetchers/oci":  {"k8s.io/", "github.com/aws/"},
	"fetchers/...":  {"mod:cachestore", "mod:daemon", "mod:api", "mod:k8ssync", "mod:gpu"},
	// The daemon's binary: the cluster loop builds its informers without
	// client-go's informer factories (which link an informer and a lister
	// for every built-in API group, as its leader election does through
	// LeaseCandidate and resourcelock through the clientset). Figures in
	// docs/benchmarks.md.
	"cmd/modelcached": {"k8s.io/client-go/informers", "k8s.io/client-go/listers", "k8s.io/client-go/dynamic/dynamicinformer",
		"k8s.io/client-go/tools/leaderelection", "=k8s.io/client-go/kubernetes"},
	"k8ssync/...": {"mod:daemon", "mod:cachestore", "mod:gpu", "github.com/aws/", "github.com/sigstore/", "github.com/NVIDIA/go-nvml", "go.etcd.io/bbolt"},
}

// only: of this module, a package a rule names may link only these.
var only = map[string][]string{
	"api/...":        {},
	"cachestore/...": {"mod:cachestore"},
	// gpu mirrors api's GPU types (the daemon converts) and links
	// nothing else of the module.
	"gpu/...":      {"mod:gpu"},
	"fetchers/...": {"mod:fetchers", "mod:internal/testenv"},
	// peer serves and fetches blobs: the store, the fetchers' HTTP
	// policy, the node status types; never the daemon.
	"peer/...": {"mod:peer", "mod:cachestore", "mod:fetchers", "mod:k8ssync", "mod:api", "mod:internal/expiring"},
	// warm is given a tree and reads it; the daemon wires it.
	"warm/...": {"mod:warm"},
	// The daemon's components in packages of their own are given values
	// and small interfaces by daemon.New; none links the daemon.
	"daemon/sources/...": {"mod:daemon/sources", "mod:api", "mod:fetchers"},
	"daemon/kernels/...": {"mod:daemon/kernels", "mod:daemon/sources", "mod:api", "mod:fetchers", "mod:cachestore", "mod:gpu"},
	// fan-out is driven without a daemon (a fleet simulation): the
	// store, the peer port and fetcher, the cluster's statuses.
	"daemon/fanout/...": {"mod:daemon/fanout", "mod:api", "mod:cachestore", "mod:fetchers", "mod:k8ssync", "mod:peer", "mod:internal/expiring"},
}

func TestDependencyDirection(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Deps " "}}`, "./...").Output()
	if err != nil {
		t.Fatal(err)
	}
	deps := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		deps[strings.TrimPrefix(f[0], mod)] = f[1:]
	}
	for _, rule := range sortedKeys(banned) {
		for _, pkg := range ruled(t, deps, rule) {
			for _, d := range deps[pkg] {
				for _, b := range banned[rule] {
					if matches(d, b) {
						t.Errorf("%s links %s, which %q bans (%s)", pkg, d, rule, b)
					}
				}
			}
		}
	}
	for _, rule := range sortedKeys(only) {
		for _, pkg := range ruled(t, deps, rule) {
		next:
			for _, d := range deps[pkg] {
				if !strings.HasPrefix(d, mod) {
					continue
				}
				for _, ok := range only[rule] {
					if matches(d, ok) {
						continue next
					}
				}
				t.Errorf("%s links %s: of this module, %q may link only %v", pkg, strings.TrimPrefix(d, mod), rule, only[rule])
			}
		}
	}
	// Only cmd/ links the daemon (tests are not in Deps).
	for pkg, ds := range deps {
		if strings.HasPrefix(pkg, "cmd/") || pkg == "daemon" || strings.HasPrefix(pkg, "daemon/") {
			continue
		}
		for _, d := range ds {
			if d == mod+"daemon" {
				t.Errorf("%s links the daemon; only cmd/ may", pkg)
			}
		}
	}
}

// ruled lists the packages a rule names; a rule that names none is an
// error, so a renamed package cannot slip out of its rule.
func ruled(t *testing.T, deps map[string][]string, rule string) []string {
	var out []string
	base, tree := strings.CutSuffix(rule, "/...")
	for pkg := range deps {
		if pkg == base || tree && strings.HasPrefix(pkg, base+"/") {
			out = append(out, pkg)
		}
	}
	if len(out) == 0 {
		t.Errorf("rule %q names no package of the module", rule)
	}
	sort.Strings(out)
	return out
}

// matches reports whether import path d falls under prefix p: "mod:x" is
// the module's x or below; "=x" is x alone; "net" is the standard
// library's net or below; a p ending in "/" is a path prefix; else p or
// below.
func matches(d, p string) bool {
	if x, ok := strings.CutPrefix(p, "="); ok {
		return d == x
	}
	if x, ok := strings.CutPrefix(p, "mod:"); ok {
		p = mod + x
	}
	if strings.HasSuffix(p, "/") {
		return strings.HasPrefix(d, p)
	}
	return d == p || strings.HasPrefix(d, p+"/")
}

func sortedKeys(m map[string][]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
