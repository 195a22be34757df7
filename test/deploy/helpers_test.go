package deploy

import "k8s.io/apimachinery/pkg/runtime/schema"

func schemaGVR(g, v, r string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: g, Version: v, Resource: r}
}

func schemaGK(g, k string) schema.GroupKind { return schema.GroupKind{Group: g, Kind: k} }
