package deploy

import (
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

func schemaGVR(g, v, r string) schema.GroupVersionResource {
	return schema.GroupVersionResource{Group: g, Version: v, Resource: r}
}

func schemaGK(g, k string) schema.GroupKind { return schema.GroupKind{Group: g, Kind: k} }

func waitABit() { time.Sleep(100 * time.Millisecond) }
