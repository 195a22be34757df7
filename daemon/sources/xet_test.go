package sources

import (
	"testing"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers/hf/xet"
)

// TestHubByXetDecision: desires whose Xet decision differs get different
// hub fetchers, with credentials or without; desires that agree share
// one; the decision is asked per desire.
func TestHubByXetDecision(t *testing.T) {
	asked := map[string]int{}
	cfg := Config{Xet: func(ds api.Desire) (bool, xet.ChunkStore) {
		asked[ds.Name]++
		return ds.Xet == nil || *ds.Xet, nil
	}}
	s, err := New(cfg, nil, func() map[string]api.Desire { return nil })
	if err != nil {
		t.Fatal(err)
	}
	no := false
	on1, on2 := api.Desire{Name: "a", URI: "hf://o/a"}, api.Desire{Name: "b", URI: "hf://o/b"}
	off := api.Desire{Name: "c", URI: "hf://o/c", Xet: &no}
	get := func(ds api.Desire, creds map[string]string) any {
		f, err := s.FetcherWith(ds, "hf", creds)
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	if get(on1, nil) != get(on2, nil) || get(on1, nil) != s.shared["hf"] {
		t.Error("two desires with Xet on do not share the hub fetcher")
	}
	if get(off, nil) == get(on1, nil) || get(off, nil) != get(off, nil) {
		t.Error("a desire with xet: false shares the Xet hub fetcher, or gets a new one each time")
	}
	tok := map[string]string{"HF_TOKEN": "t"}
	if get(off, tok) == get(on1, tok) || get(on1, tok) != get(on2, tok) {
		t.Error("with the same credentials, the Xet decision does not pick the fetcher")
	}
	if asked["c"] == 0 || asked["a"] == 0 {
		t.Errorf("the decision was not asked per desire: %v", asked)
	}
}
