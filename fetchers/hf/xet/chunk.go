package xet

import (
	"bytes"
	"encoding/binary"
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
	scratch []byte // a grouped chunk before it is ungrouped
	src     *bytes.Reader
	lz      *lz4.Reader
}

// NewChunkReader reads chunks from r.
func NewChunkReader(r io.Reader) *ChunkReader { return &ChunkReader{r: r} }

// Next decodes the next chunk, appending its uncompressed bytes to dst.
// At the end of r before a header it returns io.EOF; a chunk cut short
// is io.ErrUnexpectedEOF.
func (c *ChunkReader) Next(dst []byte) ([]byte, error) {
	h, err := c.header()
	if err != nil {
		return dst, err
	}
	n := len(dst)
	dst = grow(dst, int(h.Uncompressed))
	if err := c.body(dst[n:], h); err != nil {
		return dst[:n], err
	}
	return dst, nil
}

// NextInto decodes the next chunk straight into dst, which must have
// room for it (a chunk longer than len(dst) is ErrCorrupt: longer than
// the term it belongs to), and returns its uncompressed length. Errors
// as Next's.
func (c *ChunkReader) NextInto(dst []byte) (int, error) {
	h, err := c.header()
	if err != nil {
		return 0, err
	}
	n := int(h.Uncompressed)
	if n > len(dst) {
		return 0, fmt.Errorf("%w: a chunk of %d bytes where %d are left of its term", ErrCorrupt, n, len(dst))
	}
	return n, c.body(dst[:n], h)
}

// Skip passes over the next chunk without decoding it (a chunk of a
// range that no term needs). Errors as Next's.
func (c *ChunkReader) Skip() error {
	h, err := c.header()
	if err != nil {
		return err
	}
	_, err = c.compressed(h)
	return err
}

func (c *ChunkReader) header() (Header, error) {
	if _, err := io.ReadFull(c.r, c.hdr[:]); err != nil {
		return Header{}, err
	}
	return ParseHeader(c.hdr[:])
}

// compressed reads the chunk's stored bytes.
func (c *ChunkReader) compressed(h Header) ([]byte, error) {
	if cap(c.comp) < int(h.Compressed) {
		c.comp = make([]byte, h.Compressed)
	}
	c.comp = c.comp[:h.Compressed]
	_, err := io.ReadFull(c.r, c.comp)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return c.comp, err
}

// body decodes the chunk h heads into out (len(out) == h.Uncompressed):
// a raw chunk is read straight into it, an LZ4 one decompressed into
// it, a grouped one decompressed aside and ungrouped into it. A frame
// as xet-core writes it is decoded block by block (decodeFrame), any
// other by the stream reader.
func (c *ChunkReader) body(out []byte, h Header) error {
	if h.Scheme == None {
		_, err := io.ReadFull(c.r, out)
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	comp, err := c.compressed(h)
	if err != nil {
		return err
	}
	into := out
	if h.Scheme == ByteGrouping4LZ4 {
		if cap(c.scratch) < len(out) {
			c.scratch = make([]byte, len(out))
		}
		into = c.scratch[:len(out)]
	}
	if ok, err := decodeFrame(into, comp); err != nil {
		return err
	} else if !ok {
		if err := c.streamFrame(into, comp, h); err != nil {
			return err
		}
	}
	if h.Scheme == ByteGrouping4LZ4 {
		ungroup4(out, into)
	}
	return nil
}

// streamFrame decodes any LZ4 frame (checksums, linked blocks, several
// frames in a row) with the stream reader, into exactly into.
func (c *ChunkReader) streamFrame(into, comp []byte, h Header) error {
	if c.lz == nil {
		c.lz = lz4.NewReader(nil)
		c.src = bytes.NewReader(nil)
	}
	c.src.Reset(comp)
	c.lz.Reset(c.src)
	if _, err := io.ReadFull(c.lz, into); err != nil {
		return fmt.Errorf("%w: LZ4 frame: %v", ErrCorrupt, err)
	}
	// The frame must end where the header says.
	var one [1]byte
	if k, err := c.lz.Read(one[:]); k != 0 || (err != nil && err != io.EOF) {
		return fmt.Errorf("%w: LZ4 frame longer than %d bytes", ErrCorrupt, h.Uncompressed)
	}
	return nil
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

// ungroup4 undoes group4: src grouped, dst (as long) the bytes in order.
// ungroupBlocks interleaves the groups 16 bytes of each at a time where
// the machine has vector instructions for it (ungroup_amd64.s); the rest
// goes 4 bytes at a time.
func ungroup4(dst, src []byte) {
	n := len(src)
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
	out := dst[:4*q]
	i := 0
	if q >= 16 {
		i = ungroupBlocks(out, s0, s1, s2, s3, q/16) * 16
	}
	s0, s1, s2, s3 = s0[i:], s1[i:len(s0)], s2[i:len(s0)], s3[i:len(s0)]
	out = out[4*i:]
	for j := range s0 {
		binary.LittleEndian.PutUint32(out[4*j:], uint32(s0[j])|uint32(s1[j])<<8|uint32(s2[j])<<16|uint32(s3[j])<<24)
	}
	for g := 0; g < r; g++ {
		dst[4*q+g] = gs[g][q]
	}
}

// EncodeChunk appends data stored with scheme (header and body) to dst;
// when compressing does not make it smaller it is stored with None, as
// xorb.md says it SHOULD be. A scheme this package does not know stores
// the bytes raw under that number (a test's "new encoding"). The LZ4
// frame is the one xet-core writes (lz4_flex's FrameEncoder defaults:
// independent blocks of 64 KiB, 256 KiB for a chunk above that, no
// checksums). For test servers and benchmarks.
func EncodeChunk(dst, data []byte, scheme Scheme) []byte {
	body := data
	if scheme == LZ4 || scheme == ByteGrouping4LZ4 {
		in := data
		if scheme == ByteGrouping4LZ4 {
			in = group4(data)
		}
		var buf bytes.Buffer
		w := lz4.NewWriter(&buf)
		bs := lz4.Block64Kb
		if len(in) > 64<<10 {
			bs = lz4.Block256Kb
		}
		w.Apply(lz4.BlockSizeOption(bs), lz4.ChecksumOption(false))
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
