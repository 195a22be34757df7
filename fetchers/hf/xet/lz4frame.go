package xet

import (
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/pierrec/lz4/v4"
)

// decodeFrame decodes the LZ4 frame comp into out (len(out) the chunk's
// uncompressed size) with the block API, straight from comp into out:
// no copy of each block into the stream reader's buffers and out of
// them again. It takes only the shape xet-core writes (lz4_flex's
// FrameEncoder: independent blocks, no block or content checksums, no
// dictionary) and answers ok false for any other (checksums to verify,
// linked blocks, bytes after the end mark such as a second frame),
// which the stream reader decodes as before. Errors are ErrCorrupt, as
// the stream reader's: a bad header checksum, a block larger than the
// frame's block size or than what is left of out, a frame that ends
// short of out, a content size that is not out's.
//
// Frame format: lz4_Frame_format.md (the LZ4 project): magic, FLG, BD,
// content size if FLG says, HC = (xxh32(descriptor) >> 8) & 0xff, then
// blocks (a 4-byte size, its high bit for "stored uncompressed"), a zero
// size ending them.
func decodeFrame(out, comp []byte) (ok bool, err error) {
	const magic = 0x184D2204
	if len(comp) < 7 || binary.LittleEndian.Uint32(comp) != magic {
		return false, nil
	}
	flg, bd := comp[4], comp[5]
	const (
		version  = 0xc0 // FLG bits 7-6: 01
		indep    = 1 << 5
		blockSum = 1 << 4
		sizeFlag = 1 << 3
		contSum  = 1 << 2
		reserved = 1 << 1
		dictID   = 1 << 0
	)
	if flg&version != 0x40 || flg&indep == 0 || flg&(blockSum|contSum|dictID|reserved) != 0 || bd&0x8f != 0 {
		return false, nil
	}
	idx := bd >> 4
	if idx < 4 {
		return false, nil
	}
	blockMax := 1 << (8 + 2*int(idx)) // 4: 64 KiB, 5: 256 KiB, 6: 1 MiB, 7: 4 MiB
	desc := 2
	if flg&sizeFlag != 0 {
		desc += 8
	}
	if len(comp) < 4+desc+1 {
		return false, nil
	}
	if byte(xxh32(comp[4:4+desc])>>8) != comp[4+desc] {
		return true, fmt.Errorf("%w: LZ4 frame: header checksum", ErrCorrupt)
	}
	at, off := 4+desc+1, 0
	for {
		if len(comp)-at < 4 {
			return true, fmt.Errorf("%w: LZ4 frame: cut short", ErrCorrupt)
		}
		x := binary.LittleEndian.Uint32(comp[at:])
		at += 4
		if x == 0 {
			break
		}
		n := int(x &^ (1 << 31))
		if n > blockMax || n > len(comp)-at {
			return true, fmt.Errorf("%w: LZ4 frame: a block of %d bytes", ErrCorrupt, n)
		}
		blk := comp[at : at+n]
		at += n
		if x&(1<<31) != 0 {
			if n > len(out)-off {
				return true, fmt.Errorf("%w: LZ4 frame longer than %d bytes", ErrCorrupt, len(out))
			}
			off += copy(out[off:], blk)
			continue
		}
		dst := out[off:min(len(out), off+blockMax)]
		if len(dst) == 0 {
			// The block decoder needs room for a byte; a block that
			// gives one here gives more than the header says.
			var one [1]byte
			dst = one[:]
		}
		k, err := lz4.UncompressBlock(blk, dst)
		if err != nil {
			return true, fmt.Errorf("%w: LZ4 frame: %v", ErrCorrupt, err)
		}
		if k > len(out)-off {
			return true, fmt.Errorf("%w: LZ4 frame longer than %d bytes", ErrCorrupt, len(out))
		}
		off += k
	}
	if at != len(comp) {
		return false, nil // more after the end mark: the stream reader's case
	}
	if off != len(out) {
		return true, fmt.Errorf("%w: LZ4 frame of %d bytes, the header says %d", ErrCorrupt, off, len(out))
	}
	if flg&sizeFlag != 0 && binary.LittleEndian.Uint64(comp[6:]) != uint64(off) {
		return true, fmt.Errorf("%w: LZ4 frame of %d bytes says it holds %d", ErrCorrupt, off, binary.LittleEndian.Uint64(comp[6:]))
	}
	return true, nil
}

// xxh32 is XXH32 with seed 0 of b, for inputs under 16 bytes (a frame
// descriptor): xxhash_spec.md, steps 1b, 4 and 5.
func xxh32(b []byte) uint32 {
	const (
		p1 = 2654435761
		p2 = 2246822519
		p3 = 3266489917
		p4 = 668265263
		p5 = 374761393
	)
	h := uint32(p5) + uint32(len(b))
	for ; len(b) >= 4; b = b[4:] {
		h = bits.RotateLeft32(h+binary.LittleEndian.Uint32(b)*p3, 17) * p4
	}
	for _, c := range b {
		h = bits.RotateLeft32(h+uint32(c)*p5, 11) * p1
	}
	h ^= h >> 15
	h *= p2
	h ^= h >> 13
	h *= p3
	h ^= h >> 16
	return h
}
