package k8ssync

import (
	"context"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"
)

// watchPeers hands the daemon every ModelCacheNode (Node.SetPeerNodes)
// whenever one changes: where the other daemons serve blobs and which
// revisions they hold Ready. It costs one long watch (a request every
// hour or two) and no write: the statuses are the ones the nodes write
// anyway.
func (s *Syncer) watchPeers(ctx context.Context) {
	inf := newInformer(s.dyn.Resource(ModelCacheNodeGVR), &unstructured.Unstructured{}, 0, "")
	kick := make(chan struct{}, 1)
	poke := func() {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(any) { poke() }, UpdateFunc: func(any, any) { poke() }, DeleteFunc: func(any) { poke() }})
	go inf.Run(ctx.Done())
	var last []string // the resource versions last handed over
	for {
		select {
		case <-ctx.Done():
			return
		case <-kick:
		}
		if !inf.HasSynced() {
			continue
		}
		nodes, versions := peerNodes(inf.GetStore().List())
		if slices.Equal(versions, last) {
			continue
		}
		last = versions
		s.node.SetPeerNodes(nodes)
		select { // merge a burst of status writes into one hand-over
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// peerNodes converts watched ModelCacheNode objects (those that do not
// convert are left out), and lists their names and resource versions,
// sorted, to tell a change.
func peerNodes(objs []any) ([]ModelCacheNode, []string) {
	var nodes []ModelCacheNode
	var versions []string
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		var n ModelCacheNode
		if runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &n) == nil {
			nodes = append(nodes, n)
			versions = append(versions, n.Name+"@"+n.ResourceVersion)
		}
	}
	slices.Sort(versions)
	return nodes, versions
}
