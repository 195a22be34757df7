package modelcache_test

import (
	"testing"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
)

// TestArtifactKindsAgree: the artifact kinds are the one vocabulary of the
// wire (api) and of the index (cachestore). Neither package may import the
// other (api and cachestore are both at the bottom of the design's
// graph), so each names the kinds; the daemon passes one for the other,
// and this test keeps them the same values.
func TestArtifactKindsAgree(t *testing.T) {
	for _, k := range []struct{ api, store string }{
		{api.KindModel, cachestore.KindModel},
		{api.KindKernelCache, cachestore.KindKernelCache},
	} {
		if k.api != k.store {
			t.Errorf("artifact kind: api says %q, cachestore says %q", k.api, k.store)
		}
	}
}
