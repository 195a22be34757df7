package k8ssync

import (
	"context"
	"fmt"
	"strings"
	"time"

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
// Node's labels takes effect within TTL. Use NewNodeSelection; safe for
// concurrent use.
type NodeSelection struct {
	nodes typedcorev1.NodeInterface
	mcs   dynamic.ResourceInterface
	// TTL is how long an object read is used (default a minute);
	// MaxEntries bounds what is remembered (default 4096); Now is the
	// clock. Set before first use.
	TTL        time.Duration
	MaxEntries int
	Now        func() time.Time

	read   expiring.Map[string, any] // a Node's labels or a ModelCache; nil: none of that name
	flight singleflight.Group
}

// NewNodeSelection reads with the daemon's client configuration (its
// service account needs get on nodes and on modelcaches, as the
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
	return &NodeSelection{nodes: core.Nodes(), mcs: dyn.Resource(ModelCacheGVR), TTL: time.Minute, MaxEntries: 4096,
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
	o, err = s.get(ctx, "node\x00"+node, func(ctx context.Context) (any, error) {
		n, err := s.nodes.Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return n.Labels, nil
	})
	if err != nil || o == nil {
		return false, err
	}
	labels, _ := o.(map[string]string)
	sel, err := Selected(mc, labels)
	if err != nil {
		return false, fmt.Errorf("modelcache %s: spec.nodeSelector: %w", modelCache, err)
	}
	return sel, nil
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
