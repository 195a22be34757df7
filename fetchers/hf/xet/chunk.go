package xet

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"github.com/pierrec/lz4/v4"
)

// Chunk format (hub-docs docs/xet/xorb.md, "Chunk Format"): an 8-byte
// header (version, compressed size, compression scheme, uncompressed
// size; sizes 3-byte little-endian) and the compressed bytes.
const (
	HeaderSize = 8
	// MaxChunk is the largest uncompressed chunk the chunker emits
	// (chunking.md: MAX_CHUNK_SIZE, 128 KiB). A header that says more is
	// refused.
	MaxChunk = 128 << 10
	// maxStored bounds a chunk's stored bytes: uncompressed at most
	// MaxChunk (xorb.md: "SHOULD be stored uncompressed" when compression
	// does not help), plus what an LZ4 frame adds.
	maxStored = MaxChunk + 1024
)

// Scheme is a chunk's compression scheme (xorb.md, "Chunk Compression
// Schemes").
type Scheme byte

const (
	None             Scheme = 0
	LZ4              Scheme = 1 // an LZ4 frame (xet-core uses lz4_flex::frame)
	ByteGrouping4LZ4 Scheme = 2 // bytes grouped by position in 4, then LZ4
)

// ErrUnsupported says a xorb uses something this client does not know
// (a header version or a compression scheme): the caller falls back to
// another path rather than retrying.
var ErrUnsupported = errors.New("xet: unsupported")

// ErrCorrupt says xorb bytes do not decode as the spec says.
var ErrCorrupt = errors.New("xet: corrupt chunk")

// Header is a chunk header.
type Header struct {
	Version      byte
	Compressed   uint32
	Scheme       Scheme
	Uncompressed uint32
}

// ParseHeader reads an 8-byte chunk header.
func ParseHeader(b []byte) (Header, error) {
	if len(b) < HeaderSize {
		return Header{}, fmt.Errorf("%w: header of %d bytes", ErrCorrupt, len(b))
	}
	h := Header{
		Version:      b[0],
		Compressed:   uint32(b[1]) | uint32(b[2])<<8 | uint32(b[3])<<16,
		Scheme:       Scheme(b[4]),
		Uncompressed: uint32(b[5]) | uint32(b[6])<<8 | uint32(b[7])<<16,
	}
	if h.Version != 0 {
		return h, fmt.Errorf("%w: chunk header version %d", ErrUnsupported, h.Version)
	}
	if h.Scheme > ByteGrouping4LZ4 {
		return h, fmt.Errorf("%w: chunk compression scheme %d", ErrUnsupported, h.Scheme)
	}
	if h.Uncompressed > MaxChunk || h.Compressed > maxStored || (h.Scheme == None && h.Compressed != h.Uncompressed) {
		return h, fmt.Errorf("%w: chunk of %d bytes stored in %d (scheme %d)", ErrCorrupt, h.Uncompressed, h.Compressed, h.Scheme)
	}
	return h, nil
}

// Append appends h's 8 bytes to b.
func (h Header) Append(b []byte) []byte {
	return append(b, h.Version, byte(h.Compressed), byte(h.Compressed>>8), byte(h.Compressed>>16),
		byte(h.Scheme), byte(h.Uncompressed), byte(h.Uncompressed>>8), byte(h.Uncompressed>>16))
}

// ChunkReader reads chunks one after the other from xorb bytes (a whole
// xorb or a range that starts on a chunk header). Not safe for
// concurrent use.
type ChunkReader struct {
	r       io.Reader
	hdr     [HeaderSize]byte
	comp    []byte
	scratch []byte
	lz      *lz4.Reader
}

// NewChunkReader reads chunks from r.
func NewChunkReader(r io.Reader) *ChunkReader { return &ChunkReader{r: r} }

// Next decodes the next chunk, appending its uncompressed bytes to dst.
// At the end of r before a header it returns io.EOF; a chunk cut short
// is io.ErrUnexpectedEOF.
func (c *ChunkReader) Next(dst []byte) ([]byte, error) {
	if _, err := io.ReadFull(c.r, c.hdr[:]); err != nil {
		return dst, err
	}
	h, err := ParseHeader(c.hdr[:])
	if err != nil {
		return dst, err
	}
	if cap(c.comp) < int(h.Compressed) {
		c.comp = make([]byte, h.Compressed)
	}
	c.comp = c.comp[:h.Compressed]
	if _, err := io.ReadFull(c.r, c.comp); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return dst, err
	}
	return c.decode(dst, h, c.comp)
}

func (c *ChunkReader) decode(dst []byte, h Header, comp []byte) ([]byte, error) {
	n := len(dst)
	if h.Scheme == None {
		return append(dst, comp...), nil
	}
	if c.lz == nil {
		c.lz = lz4.NewReader(nil)
	}
	c.lz.Reset(bytes.NewReader(comp))
	dst = grow(dst, int(h.Uncompressed))
	out := dst[n : n+int(h.Uncompressed)]
	if _, err := io.ReadFull(c.lz, out); err != nil {
		return dst[:n], fmt.Errorf("%w: LZ4 frame: %v", ErrCorrupt, err)
	}
	// The frame must end where the header says.
	var one [1]byte
	if k, err := c.lz.Read(one[:]); k != 0 || (err != nil && err != io.EOF) {
		return dst[:n], fmt.Errorf("%w: LZ4 frame longer than %d bytes", ErrCorrupt, h.Uncompressed)
	}
	if h.Scheme == ByteGrouping4LZ4 {
		c.scratch = ungroup4(out, c.scratch)
	}
	return dst, nil
}

func grow(b []byte, n int) []byte {
	if cap(b)-len(b) < n {
		nb := make([]byte, len(b), len(b)+n)
		copy(nb, b)
		b = nb
	}
	return b[:len(b)+n]
}

// group4 reorders b by byte position in groups of 4 (xorb.md, "Byte
// Grouping LZ4 Compression"): all first bytes, all second bytes, and so
// on; the 1-3 bytes left over go one each to the first groups.
func group4(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for g := 0; g < 4; g++ {
		for i := g; i < len(b); i += 4 {
			out = append(out, b[i])
		}
	}
	return out
}

// ungroup4 undoes group4 in place, with scratch as its copy of b; it
// returns scratch, grown if need be, for the next call.
func ungroup4(b, scratch []byte) []byte {
	n := len(b)
	src := append(scratch[:0], b...)
	// Group g holds q bytes, and one more when g < n%4.
	q, r := n/4, n%4
	var gs [4][]byte
	at := 0
	for g := range gs {
		k := q
		if g < r {
			k++
		}
		gs[g] = src[at : at+k]
		at += k
	}
	s0, s1, s2, s3 := gs[0][:q], gs[1][:q], gs[2][:q], gs[3][:q]
	out := b[:4*q]
	for i := range s0 {
		o := out[4*i : 4*i+4 : 4*i+4]
		o[0], o[1], o[2], o[3] = s0[i], s1[i], s2[i], s3[i]
	}
	for g := 0; g < r; g++ {
		b[4*q+g] = gs[g][q]
	}
	return src
}

// EncodeChunk appends data stored with scheme (header and body) to dst;
// when compressing does not make it smaller it is stored with None, as
// xorb.md says it SHOULD be. A scheme this package does not know stores
// the bytes raw under that number (a test's "new encoding"). For test
// servers and benchmarks.
func EncodeChunk(dst, data []byte, scheme Scheme) []byte {
	body := data
	if scheme == LZ4 || scheme == ByteGrouping4LZ4 {
		in := data
		if scheme == ByteGrouping4LZ4 {
			in = group4(data)
		}
		var buf bytes.Buffer
		w := lz4.NewWriter(&buf)
		w.Write(in)
		w.Close()
		if buf.Len() < len(data) {
			body = buf.Bytes()
		} else {
			scheme = None
		}
	}
	h := Header{Compressed: uint32(len(body)), Scheme: scheme, Uncompressed: uint32(len(data))}
	return append(h.Append(dst), body...)
}
