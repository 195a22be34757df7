package cachestore_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/modelcache/modelcache/cachestore"
)

// BenchmarkHoldTree composes the tree of a CSI volume with kernelCaches:
// auto: a model of 10 files and a kernel cache of 1,000 (hardlinks only).
// Recording and deleting the hold are outside the timing.
func BenchmarkHoldTree(b *testing.B) {
	ctx := context.Background()
	s, _, err := cachestore.Open(ctx, b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	commit := func(name, kind string, n int) {
		var m cachestore.Manifest
		for i := 0; i < n; i++ {
			body := []byte(fmt.Sprintf("%s file %d", name, i))
			d, err := s.Ingest(ctx, name, bytes.NewReader(body), int64(len(body)), "")
			if err != nil {
				b.Fatal(err)
			}
			m = append(m, cachestore.Entry{Path: fmt.Sprintf("d%02d/f%04d", i/100, i), Digest: d, Size: int64(len(body))})
		}
		if _, err := s.CommitVersion(ctx, cachestore.VersionSpec{Name: name, Kind: kind, Revision: "r1", Manifest: m}); err != nil {
			b.Fatal(err)
		}
	}
	commit("model", cachestore.KindModel, 10)
	commit("model.kc0", cachestore.KindKernelCache, 1000)
	parts := []cachestore.TreePart{{Name: "model", Revision: "r1"}, {Dir: "kernels/model.kc0", Name: "model.kc0", Revision: "r1"}}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		key := fmt.Sprint("csi:vol-", i)
		b.StopTimer()
		if err := s.Records().PutHold(key, []byte(`{}`)); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if _, err := s.HoldTree(ctx, key, parts); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := s.Records().DeleteHold(key); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
