package cachestore_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/modelcache/modelcache/cachestore"
)

// BenchmarkIngest streams 256 MiB through a Writer (hash + write on their
// own goroutines), with O_DIRECT and buffered. Compare the two in one run.
func BenchmarkIngest(b *testing.B) {
	const size = 256 << 20
	src := make([]byte, 8<<20)
	rand.NewChaCha8([32]byte{9}).Read(src)
	for _, direct := range []bool{true, false} {
		b.Run(fmt.Sprintf("direct=%v", direct), func(b *testing.B) {
			dir, _ := os.MkdirTemp("/var/tmp", "ingest-bench-")
			defer os.RemoveAll(dir)
			s, _, err := cachestore.Open(context.Background(), dir, cachestore.WithDirectIO(direct))
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			b.SetBytes(size)
			for i := 0; i < b.N; i++ {
				r := &repeat{src: src, left: size, salt: byte(i)}
				if _, err := s.Ingest(context.Background(), fmt.Sprint(i), r, size, ""); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// repeat yields left bytes of src over and over, salted so blobs differ.
type repeat struct {
	src  []byte
	left int
	off  int
	salt byte
	once bool
}

func (r *repeat) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	n := copy(p[:min(len(p), r.left)], r.src[r.off:])
	if !r.once && n > 0 {
		p[0] ^= r.salt
		r.once = true
	}
	r.off = (r.off + n) % len(r.src)
	r.left -= n
	return n, nil
}
