package xet

import (
	"bytes"
	"errors"
	"io"
	"math/rand"
	"reflect"
	"testing"

	"github.com/pierrec/lz4/v4"
)

// TestHashString checks the text form against api.md's example
// ("Converting Hashes to Strings") and xet-core's
// test_hash_hex_string_endianness.
func TestHashString(t *testing.T) {
	var h Hash
	for i := range h {
		h[i] = byte(i)
	}
	vectors := []struct {
		raw  Hash
		want string
	}{
		// api.md prints "…171615141312111f1e…", 62 digits: the "10" of the
		// third group is missing there; the procedure it states gives this.
		{h, "07060504030201000f0e0d0c0b0a090817161514131211101f1e1d1c1b1a1918"},
		{Hash{22, 175, 58, 132, 4, 75, 131, 214, 190, 153, 138, 66, 226, 3, 153, 242, 204, 86, 80, 234, 249, 153, 80, 99, 159, 80, 65, 138, 236, 231, 149, 78},
			"d6834b04843aaf16f29903e2428a99be635099f9ea5056cc4e95e7ec8a41509f"},
	}
	for _, v := range vectors {
		if got := v.raw.String(); got != v.want {
			t.Errorf("String() = %s, want %s", got, v.want)
		}
		back, err := ParseHash(v.want)
		if err != nil || back != v.raw {
			t.Errorf("ParseHash(%s) = %v, %v", v.want, back, err)
		}
	}
	for _, bad := range []string{"", "00", string(bytes.Repeat([]byte("G"), 64)), string(bytes.Repeat([]byte("A"), 64))} {
		if _, err := ParseHash(bad); err == nil {
			t.Errorf("ParseHash(%q) accepted", bad)
		}
	}
}

// triggeringData is xet-core's get_triggering_base_data(n, padding).
func triggeringData(n, padding int) []byte {
	data := []byte{154, 52, 42, 34, 159, 75, 126, 224, 70, 236, 12, 196, 79, 236, 178, 124, 127, 50, 99, 178, 44, 176, 174,
		126, 250, 235, 205, 174, 252, 122, 35, 10, 20, 101, 214, 69, 193, 8, 115, 105, 158, 228, 120, 111, 136,
		162, 198, 251, 211, 183, 253, 252, 164, 147, 63, 16, 186, 162, 117, 23, 170, 36, 205, 187, 174, 76, 210,
		174, 211, 175, 12, 173, 145, 59, 2, 70, 222, 181, 159, 227, 182, 156, 189, 51, 226, 106, 24, 50, 183, 157,
		140, 10, 8, 23, 212, 70, 10, 234, 23, 33, 219, 254, 39, 236, 70, 49, 191, 116, 9, 115, 15, 101, 26, 159,
		165, 220, 15, 170, 56, 125, 92, 163, 94, 235, 38, 40, 49, 81}
	data = append(data, make([]byte, padding)...)
	for len(data) < n {
		take := min(n-len(data), len(data))
		data = append(data, data[:take]...)
	}
	return data
}

func TestBoundariesVectors(t *testing.T) {
	for i, want := range cdcVectors {
		if got := Boundaries(triggeringData(65536, i)); !reflect.DeepEqual(got, want) {
			t.Errorf("padding %d: boundaries %v, want %v", i, got, want)
		}
	}
	// xet-core test_correctness_1mb_const_data: no match, cuts at MAX_CHUNK_SIZE.
	got := Boundaries(bytes.Repeat([]byte{59}, 1000000))
	if want := []int{131072, 262144, 393216, 524288, 655360, 786432, 917504, 1000000}; !reflect.DeepEqual(got, want) {
		t.Errorf("constant data: %v, want %v", got, want)
	}
	if got := Boundaries(make([]byte, 100)); !reflect.DeepEqual(got, []int{100}) {
		t.Errorf("tiny file: %v", got)
	}
	if got := Boundaries(nil); len(got) != 0 {
		t.Errorf("empty: %v", got)
	}
}

// TestBoundariesSizes checks chunking.md's bounds and mean on random data.
func TestBoundariesSizes(t *testing.T) {
	data := make([]byte, 8<<20)
	rand.New(rand.NewSource(1)).Read(data)
	ends := Boundaries(data)
	prev := 0
	for i, e := range ends {
		if n := e - prev; n > maxChunk || (n < minChunk && i != len(ends)-1) {
			t.Fatalf("chunk %d of %d bytes", i, n)
		}
		prev = e
	}
	if mean := len(data) / len(ends); mean < 32<<10 || mean > 96<<10 {
		t.Errorf("mean chunk %d bytes, want about 64 KiB", mean)
	}
}

func TestChunkRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewSource(2))
	random := make([]byte, 70001)
	rng.Read(random)
	floats := make([]byte, 65537) // compressible when grouped: slowly varying words
	for i := 0; i+4 <= len(floats); i += 4 {
		floats[i], floats[i+1], floats[i+2], floats[i+3] = byte(rng.Intn(256)), byte(i>>10), 0x3f, 0x80
	}
	text := bytes.Repeat([]byte("the xet chunk "), 5000)
	for _, data := range [][]byte{random, floats, text, {}, {1, 2, 3}} {
		for _, s := range []Scheme{None, LZ4, ByteGrouping4LZ4} {
			enc := EncodeChunk(nil, data, s)
			r := NewChunkReader(bytes.NewReader(append(enc, enc...)))
			for k := 0; k < 2; k++ {
				got, err := r.Next(nil)
				if err != nil || !bytes.Equal(got, data) {
					t.Fatalf("scheme %d, %d bytes: got %d bytes, %v", s, len(data), len(got), err)
				}
			}
			if _, err := r.Next(nil); err != io.EOF {
				t.Fatalf("after the last chunk: %v", err)
			}
		}
	}
	if h, _ := ParseHeader(EncodeChunk(nil, floats, ByteGrouping4LZ4)); h.Scheme != ByteGrouping4LZ4 {
		t.Errorf("grouped floats stored with scheme %d", h.Scheme)
	}
	if h, _ := ParseHeader(EncodeChunk(nil, random, LZ4)); h.Scheme != None {
		t.Errorf("random bytes stored with scheme %d, want None (xorb.md: SHOULD be stored uncompressed)", h.Scheme)
	}
}

// TestLZ4FrameChecksum: a frame that carries a content checksum (other
// writers' default) decodes, and one whose checksum does not match is
// refused: EncodeChunk writes none, as xet-core does, so this is where
// the check is tested.
func TestLZ4FrameChecksum(t *testing.T) {
	data := bytes.Repeat([]byte("checksummed frame "), 3000)
	var buf bytes.Buffer
	w := lz4.NewWriter(&buf) // content checksum on, 4 MiB blocks
	w.Write(data)
	w.Close()
	chunk := Header{Compressed: uint32(buf.Len()), Scheme: LZ4, Uncompressed: uint32(len(data))}.Append(nil)
	chunk = append(chunk, buf.Bytes()...)
	got, err := NewChunkReader(bytes.NewReader(chunk)).Next(nil)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("checksummed frame: %v", err)
	}
	chunk[len(chunk)-1] ^= 0xff // the content checksum's last byte
	if _, err := NewChunkReader(bytes.NewReader(chunk)).Next(nil); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("a wrong content checksum: %v", err)
	}
}

func TestGroup4(t *testing.T) {
	// xorb.md's example: A1 A2 A3 A4 B1 B2 B3 B4 C1 … grouped by position; the
	// 1-3 bytes left over go to the first groups.
	in := []byte{0xA1, 0xA2, 0xA3, 0xA4, 0xB1, 0xB2, 0xB3, 0xB4, 0xC1, 0xC2}
	want := []byte{0xA1, 0xB1, 0xC1, 0xA2, 0xB2, 0xC2, 0xA3, 0xB3, 0xA4, 0xB4}
	got := group4(in)
	if !bytes.Equal(got, want) {
		t.Fatalf("group4 = % x, want % x", got, want)
	}
	out := make([]byte, len(got))
	ungroup4(out, got)
	got = out
	if !bytes.Equal(got, in) {
		t.Fatalf("ungroup4 = % x", got)
	}
}

func TestHeaderRefusals(t *testing.T) {
	for name, h := range map[string][]byte{
		"version 1":    {1, 3, 0, 0, 0, 3, 0, 0},
		"scheme 3":     {0, 3, 0, 0, 3, 3, 0, 0},
		"too large":    {0, 0, 0, 4, 1, 0, 0, 4},
		"none, sizes≠": {0, 3, 0, 0, 0, 4, 0, 0},
		"short":        {0, 0},
	} {
		if _, err := ParseHeader(h); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := ParseHeader([]byte{0, 3, 0, 0, 9, 3, 0, 0}); err == nil || !errors.Is(err, ErrUnsupported) {
		t.Errorf("an unknown scheme is not ErrUnsupported: %v", err)
	}
}

func TestMerkle(t *testing.T) {
	a := HashLen{ChunkHash([]byte("a")), 1}
	if XorbHash([]HashLen{a}) != a.Hash {
		t.Error("the xorb hash of one chunk is not its chunk hash")
	}
	if FileHash([]HashLen{a}) == a.Hash || FileHash(nil) != (Hash{}) {
		t.Error("file hash")
	}
	// Deterministic over many chunks, and sensitive to lengths and order.
	var cs []HashLen
	for i := 0; i < 100; i++ {
		cs = append(cs, HashLen{ChunkHash([]byte{byte(i)}), uint64(i + 1)})
	}
	x := XorbHash(cs)
	if XorbHash(cs) != x {
		t.Error("not deterministic")
	}
	cs[50].Len++
	if XorbHash(cs) == x {
		t.Error("lengths ignored")
	}
}
