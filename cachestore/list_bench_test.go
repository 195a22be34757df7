package cachestore_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/modelcache/modelcache/cachestore"
)

// BenchmarkList reads an index of 2,000 artifacts (the list path of the
// API; the goal is 10,000 in under 100 ms end to end).
func BenchmarkList(b *testing.B) {
	s, _, err := cachestore.Open(context.Background(), b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	for i := 0; i < 2000; i++ {
		body := []byte(fmt.Sprintf(`{"artifact":%d}`, i))
		d, err := s.Ingest(context.Background(), "x", bytes.NewReader(body), int64(len(body)), "")
		if err != nil {
			b.Fatal(err)
		}
		m := cachestore.Manifest{{Path: "config.json", Digest: d, Size: int64(len(body))}}
		for j := 0; j < 5; j++ {
			m = append(m, cachestore.Entry{Path: fmt.Sprintf("model-%05d.safetensors", j), Digest: d, Size: int64(len(body))})
		}
		if _, err := s.CommitVersion(context.Background(), cachestore.VersionSpec{Name: fmt.Sprintf("model-%05d", i), Manifest: m}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.List(); err != nil {
			b.Fatal(err)
		}
	}
}
