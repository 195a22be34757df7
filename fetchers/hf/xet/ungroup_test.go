package xet

import (
	"bytes"
	"math/rand"
	"testing"
)

// ungroupRef is ungroup4 written plainly, byte by byte, from xorb.md's
// description: byte i of the chunk is byte i/4 of group i%4, groups laid
// out one after the other, the first n%4 of them one byte longer.
func ungroupRef(src []byte) []byte {
	n := len(src)
	q, r := n/4, n%4
	var start [4]int
	for g := 1; g < 4; g++ {
		start[g] = start[g-1] + q
		if g-1 < r {
			start[g]++
		}
	}
	out := make([]byte, n)
	for i := range out {
		out[i] = src[start[i%4]+i/4]
	}
	return out
}

// TestUngroup4Lengths checks ungroup4 (vector blocks, then the loop,
// then the bytes left over) against the plain version at every length
// up to a few blocks, around a chunk's largest, and on a dst with bytes
// past the chunk, which must stay as they were.
func TestUngroup4Lengths(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	lengths := []int{MaxChunk, MaxChunk - 1, MaxChunk - 2, MaxChunk - 3, 64 << 10, 1000003}
	for n := 0; n <= 700; n++ {
		lengths = append(lengths, n)
	}
	for _, n := range lengths {
		src := make([]byte, n)
		rng.Read(src)
		dst := bytes.Repeat([]byte{0xee}, n+7)
		ungroup4(dst, src)
		if want := ungroupRef(src); !bytes.Equal(dst[:n], want) {
			t.Fatalf("length %d: ungroup4 differs from the plain version", n)
		}
		if !bytes.Equal(dst[n:], bytes.Repeat([]byte{0xee}, 7)) {
			t.Fatalf("length %d: ungroup4 wrote past the chunk", n)
		}
		if got := group4(dst[:n]); !bytes.Equal(got, src) {
			t.Fatalf("length %d: group4 does not undo ungroup4", n)
		}
	}
}

// FuzzUngroup4 compares ungroup4 with the plain version on any bytes.
func FuzzUngroup4(f *testing.F) {
	f.Add([]byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdefXYZ"))
	f.Fuzz(func(t *testing.T, src []byte) {
		dst := make([]byte, len(src))
		ungroup4(dst, src)
		if !bytes.Equal(dst, ungroupRef(src)) {
			t.Fatalf("ungroup4 differs from the plain version on %d bytes", len(src))
		}
	})
}
