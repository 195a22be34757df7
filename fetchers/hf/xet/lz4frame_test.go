package xet

import (
	"bytes"
	"math/rand"
	"testing"

	"github.com/pierrec/lz4/v4"
)

// frame writes data as one LZ4 frame with the stream writer's options.
func frame(t testing.TB, data []byte, opts ...lz4.Option) []byte {
	var buf bytes.Buffer
	w := lz4.NewWriter(&buf)
	if err := w.Apply(opts...); err != nil {
		t.Fatal(err)
	}
	w.Write(data)
	w.Close()
	return buf.Bytes()
}

// sameAsStream checks decodeFrame against the stream reader on comp,
// decoded into n bytes: where decodeFrame takes the frame, both fail or
// both give the same bytes. It says whether decodeFrame took it.
func sameAsStream(t *testing.T, comp []byte, n int) bool {
	t.Helper()
	fast, slow := make([]byte, n), make([]byte, n)
	if n == 0 {
		fast = nil // as Next(nil) gives an empty chunk
	}
	ok, ferr := decodeFrame(fast, comp)
	if !ok {
		return false
	}
	serr := (&ChunkReader{}).streamFrame(slow, comp, Header{Uncompressed: uint32(n)})
	if (ferr == nil) != (serr == nil) || (ferr == nil && !bytes.Equal(fast, slow)) {
		t.Fatalf("frame of %d bytes into %d: decodeFrame %v, the stream reader %v", len(comp), n, ferr, serr)
	}
	return true
}

// TestDecodeFrame: frames of xet-core's shape (no checksums) are decoded
// by the block path, to the stream reader's bytes, whatever their block
// size, content size field, or blocks stored raw; frames with checksums
// go to the stream reader; a frame cut, lengthened, or with any one
// byte changed fails, or decodes, as it does in the stream reader.
func TestDecodeFrame(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	random := make([]byte, MaxChunk)
	rng.Read(random)
	text := bytes.Repeat([]byte("tensor weights 0.125 0.25 "), MaxChunk/26+1)[:MaxChunk]
	mixed := append(append([]byte(nil), text[:40<<10]...), random[:90<<10]...)[:MaxChunk]
	// A block that opens with a short literal run: the decoder's fast
	// path, which writes 16 bytes at once, so an empty (nil) chunk must
	// never reach it.
	short := bytes.Repeat([]byte("abc"), MaxChunk/3+1)[:MaxChunk]
	for _, data := range [][]byte{text, random, mixed, short} {
		for _, n := range []int{1, 100, 64<<10 - 1, 64 << 10, 64<<10 + 1, MaxChunk} {
			d := data[:n]
			for _, opts := range [][]lz4.Option{
				{lz4.BlockSizeOption(lz4.Block64Kb), lz4.ChecksumOption(false)},
				{lz4.BlockSizeOption(lz4.Block256Kb), lz4.ChecksumOption(false)},
				{lz4.BlockSizeOption(lz4.Block4Mb), lz4.ChecksumOption(false), lz4.SizeOption(uint64(n))},
				{lz4.BlockSizeOption(lz4.Block64Kb), lz4.ChecksumOption(true)},
				{lz4.BlockSizeOption(lz4.Block64Kb), lz4.ChecksumOption(false), lz4.BlockChecksumOption(true)},
			} {
				comp := frame(t, d, opts...)
				took := sameAsStream(t, comp, n)
				if checksums := comp[4]&(1<<4|1<<2) != 0; took == checksums {
					t.Fatalf("%d bytes, FLG %#x: block path took it: %v", n, comp[4], took)
				}
				// The same frame into a chunk one byte shorter or longer,
				// or empty (no room for even a byte of a block).
				sameAsStream(t, comp, 0)
				sameAsStream(t, comp, n-1)
				sameAsStream(t, comp, n+1)
				sameAsStream(t, comp[:len(comp)-1], n)
				sameAsStream(t, append(comp[:len(comp):len(comp)], 0), n)
				if n > 200 {
					continue
				}
				for i := range comp {
					c := append([]byte(nil), comp...)
					c[i] ^= byte(1 + rng.Intn(255))
					sameAsStream(t, c, n)
				}
			}
		}
	}
}

// TestXXH32 checks xxh32 against XXH32's published values for short
// inputs (seed 0).
func TestXXH32(t *testing.T) {
	for in, want := range map[string]uint32{
		"":               0x02cc5d05,
		"a":              0x550d7456,
		"abc":            0x32d153ff,
		"message digest": 0x7c948494,
	} {
		if got := xxh32([]byte(in)); got != want {
			t.Errorf("xxh32(%q) = %#08x, want %#08x", in, got, want)
		}
	}
}

// FuzzDecodeFrame compares decodeFrame with the stream reader on any
// bytes it takes.
func FuzzDecodeFrame(f *testing.F) {
	f.Add(frame(f, []byte("hello hello hello hello"), lz4.ChecksumOption(false)), 23)
	f.Add(frame(f, bytes.Repeat([]byte{1, 2, 3}, 40000), lz4.ChecksumOption(false), lz4.SizeOption(120000)), 120000)
	f.Fuzz(func(t *testing.T, comp []byte, n int) {
		if n < 0 || n > MaxChunk {
			return
		}
		sameAsStream(t, comp, n)
	})
}
