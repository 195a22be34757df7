package xet

import (
	"bytes"
	"testing"
)

// FuzzChunkReader feeds arbitrary bytes to the xorb decoder: it must not
// panic, never return a chunk larger than MaxChunk, and give back what
// EncodeChunk stored.
func FuzzChunkReader(f *testing.F) {
	f.Add(EncodeChunk(nil, []byte("hello hello hello hello"), LZ4))
	f.Add(EncodeChunk(nil, bytes.Repeat([]byte{1, 2, 3, 4}, 100), ByteGrouping4LZ4))
	f.Add(EncodeChunk(nil, []byte("raw"), None))
	f.Add([]byte{0, 255, 255, 255, 1, 255, 255, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := NewChunkReader(bytes.NewReader(b))
		for i := 0; i < 64; i++ {
			c, err := r.Next(nil)
			if err != nil {
				break
			}
			if len(c) > MaxChunk {
				t.Fatalf("chunk of %d bytes", len(c))
			}
			// What decodes re-encodes to the same bytes.
			for _, s := range []Scheme{None, LZ4, ByteGrouping4LZ4} {
				got, err := NewChunkReader(bytes.NewReader(EncodeChunk(nil, c, s))).Next(nil)
				if err != nil || !bytes.Equal(got, c) {
					t.Fatalf("round trip with scheme %d: %v", s, err)
				}
			}
		}
	})
}
