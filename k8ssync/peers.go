package k8ssync

import (
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

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
