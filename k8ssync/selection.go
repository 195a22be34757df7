package k8ssync

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"golang.org/x/sync/singleflight"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/internal/expiring"
)

// ModelCacheOf is the name of the ModelCache a desire comes from (its
// artifact, a kernel cache of it or one of its versions), false for a
// desire of another origin (the socket, a models.d file).
func ModelCacheOf(ds api.Desire) (string, bool) {
	name, ok := strings.CutPrefix(ds.Origin, originPrefix)
	return name, ok && name != ""
}

// NodeSelection says whether a ModelCache selects a node, any node of
// the cluster: the peer port gives a private artifact's blobs only to
// the nodes its ModelCache selects. It reads the Node's labels and the
// ModelCache with a GET each and uses what it read (a missing object
// too) for TTL: one GET of each requesting Node and one of each private
// ModelCache per TTL, made only while blobs of private artifacts are
// asked for. An error is not remembered. A change of a selector or of a
// Node's labels takes effect within TTL. It also says whether a request
// comes from what its token is bound to (From), reading the Pod (or the
// Node) alike: one GET of each requesting pod per TTL. Use
// NewNodeSelection; safe for concurrent use.
type NodeSelection struct {
	nodes typedcorev1.NodeInterface
	mcs   dynamic.ResourceInterface
	// TTL is how long an object read is used (default a minute);
	// MaxEntries bounds what is remembered (default 4096); Now is the
	// clock. Set before first use.
	TTL        time.Duration
	MaxEntries int
	Now        func() time.Time

	pods   typedcorev1.PodsGetter
	read   expiring.Map[string, any] // a *nodeFacts, *podFacts or *ModelCache; nil: none of that name
	flight singleflight.Group
}

// nodeFacts is what NodeSelection keeps of a Node: its labels (for
// selectors) and its addresses (for Bound.From).
type nodeFacts struct {
	labels map[string]string
	addrs  []netip.Addr
}

// podFacts is what NodeSelection keeps of a Pod: its uid, whether it
// has ended (Succeeded or Failed: its addresses may be another pod's by
// now), and its addresses.
type podFacts struct {
	uid   string
	ended bool
	addrs []netip.Addr
}

// NewNodeSelection reads with the daemon's client configuration (its
// service account needs get on nodes, pods and modelcaches, as the
// DaemonSet's ClusterRole grants).
func NewNodeSelection(kube *rest.Config) (*NodeSelection, error) {
	cfg := rest.CopyConfig(kube)
	if cfg.UserAgent == "" {
		cfg.UserAgent = "modelcached"
	}
	core, err := typedcorev1.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("node selection: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("node selection: %w", err)
	}
	return &NodeSelection{nodes: core.Nodes(), pods: core, mcs: dyn.Resource(ModelCacheGVR), TTL: time.Minute, MaxEntries: 4096,
		Now: time.Now}, nil
}

// Selects says whether ModelCache modelCache, present (spec.state not
// Absent), selects node: its spec.nodeSelector matches the Node's labels
// (Selected). A ModelCache or Node that does not exist selects nothing;
// an error means it could not tell.
func (s *NodeSelection) Selects(ctx context.Context, modelCache, node string) (bool, error) {
	o, err := s.get(ctx, "modelcache\x00"+modelCache, func(ctx context.Context) (any, error) {
		u, err := s.mcs.Get(ctx, modelCache, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		var mc ModelCache
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &mc); err != nil {
			return nil, fmt.Errorf("modelcache %s: %w", modelCache, err)
		}
		return &mc, nil
	})
	mc, _ := o.(*ModelCache)
	if err != nil || mc == nil || mc.Spec.State == StateAbsent || node == "" {
		return false, err
	}
	if mc.Spec.NodeSelector == nil {
		return true, nil // every node: no need to read this one
	}
	n, err := s.node(ctx, node)
	if err != nil || n == nil {
		return false, err
	}
	sel, err := Selected(mc, n.labels)
	if err != nil {
		return false, fmt.Errorf("modelcache %s: spec.nodeSelector: %w", modelCache, err)
	}
	return sel, nil
}

// node is what was read of Node name within TTL; nil when there is none.
func (s *NodeSelection) node(ctx context.Context, name string) (*nodeFacts, error) {
	o, err := s.get(ctx, "node\x00"+name, func(ctx context.Context) (any, error) {
		n, err := s.nodes.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		f := &nodeFacts{labels: n.Labels}
		for _, a := range n.Status.Addresses {
			if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
				f.addrs = appendAddr(f.addrs, a.Address)
			}
		}
		return f, nil
	})
	f, _ := o.(*nodeFacts)
	return f, err
}

// Bound is what a token is bound to, as its TokenReview says: a Pod
// (Namespace, Pod and PodUID) on Node, or a Node alone.
type Bound struct {
	Namespace, Pod, PodUID string
	Node                   string
}

// From says whether src is an address of what b names: one of the
// Pod's status.podIPs when b names a pod (a pod of another uid, one gone,
// or one that has ended is no source; a hostNetwork pod's are its node's
// addresses), else one of the Node's InternalIP or ExternalIP addresses;
// false when b names neither or src is not valid. It reads the Pod or the
// Node with a GET per TTL, as Selects does (a Node read serves both); an
// error means it could not tell.
func (s *NodeSelection) From(ctx context.Context, b Bound, src netip.Addr) (bool, error) {
	if !src.IsValid() {
		return false, nil
	}
	var addrs []netip.Addr
	switch {
	case b.Pod != "":
		if b.Namespace == "" || b.PodUID == "" {
			return false, nil
		}
		p, err := s.pod(ctx, b.Namespace, b.Pod)
		if err != nil || p == nil || p.uid != b.PodUID || p.ended {
			return false, err
		}
		addrs = p.addrs
	case b.Node != "":
		n, err := s.node(ctx, b.Node)
		if err != nil || n == nil {
			return false, err
		}
		addrs = n.addrs
	}
	return slices.Contains(addrs, src.Unmap()), nil
}

// pod is what was read of Pod namespace/name within TTL; nil when there
// is none.
func (s *NodeSelection) pod(ctx context.Context, namespace, name string) (*podFacts, error) {
	o, err := s.get(ctx, "pod\x00"+namespace+"/"+name, func(ctx context.Context) (any, error) {
		p, err := s.pods.Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		f := &podFacts{uid: string(p.UID), ended: p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed}
		f.addrs = appendAddr(f.addrs, p.Status.PodIP)
		for _, ip := range p.Status.PodIPs {
			f.addrs = appendAddr(f.addrs, ip.IP)
		}
		return f, nil
	})
	f, _ := o.(*podFacts)
	return f, err
}

// appendAddr appends the address s to addrs (unmapped), unless it is not
// one or addrs holds it.
func appendAddr(addrs []netip.Addr, s string) []netip.Addr {
	a, err := netip.ParseAddr(s)
	if err != nil || slices.Contains(addrs, a.Unmap()) {
		return addrs
	}
	return append(addrs, a.Unmap())
}

// get is the object of key as read within TTL, else read (one read per
// key at a time); NotFound is remembered as nil.
func (s *NodeSelection) get(ctx context.Context, key string, read func(context.Context) (any, error)) (any, error) {
	now := s.Now()
	if obj, ok := s.read.Get(key, now); ok {
		return obj, nil
	}
	obj, err, _ := s.flight.Do(key, func() (any, error) {
		obj, err := read(ctx)
		if apierrors.IsNotFound(err) {
			obj, err = nil, nil
		}
		if err != nil {
			return nil, err
		}
		s.read.Put(key, obj, now.Add(s.TTL), now, s.MaxEntries)
		return obj, nil
	})
	return obj, err
}
