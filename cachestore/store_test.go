package cachestore_test

import (
	"context"
	"testing"

	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/cachestore/storetest"
)

func opener(direct bool) storetest.Opener {
	return func(t *testing.T, root string) *cachestore.Store {
		s, _, err := cachestore.Open(context.Background(), root, cachestore.WithDirectIO(direct))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
}

func TestConformanceDirectIO(t *testing.T) { storetest.Run(t, opener(true)) }
func TestConformanceBuffered(t *testing.T) { storetest.Run(t, opener(false)) }
