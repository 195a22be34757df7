package k8ssync

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSpecXetReachesDesires: a ModelCache's spec.xet goes into the desire
// of its source and of each versions entry; unset stays unset (Xet on).
func TestSpecXetReachesDesires(t *testing.T) {
	no := false
	off := &ModelCache{ObjectMeta: metav1.ObjectMeta{Name: "whole"}, Spec: ModelCacheSpec{Source: "hf://o/a", State: "Absent", Xet: &no,
		Versions: []VersionSpec{{Suffix: "next", Source: "hf://o/a@refs/pr/1"}}}}
	on := &ModelCache{ObjectMeta: metav1.ObjectMeta{Name: "chunked"}, Spec: ModelCacheSpec{Source: "hf://o/b", State: "Absent"}}
	s := &Syncer{log: discard}
	want, _, _, _ := s.desires(context.Background(), nil, []*ModelCache{off, on}, nil)
	for _, name := range []string{"whole", "whole-next"} {
		if x := want[name].Xet; x == nil || *x {
			t.Errorf("%s: xet %v, want false", name, x)
		}
	}
	if x := want["chunked"].Xet; x != nil {
		t.Errorf("chunked: xet %v, want unset", *x)
	}
}
