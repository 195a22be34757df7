package xet

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"

	"lukechampine.com/blake3"
)

// Hash is a 32-byte Xet hash (a chunk, a xorb or a file), as BLAKE3
// returns it. Its text form (String, ParseHash) is not plain hex: see
// hub-docs docs/xet/api.md, "Converting Hashes to Strings".
type Hash [32]byte

// Keys of the keyed BLAKE3 hashes (hub-docs docs/xet/hashing.md: DATA_KEY,
// INTERNAL_NODE_KEY; the file hash is keyed with 32 zero bytes).
var (
	dataKey         = [32]byte{102, 151, 245, 119, 91, 149, 80, 222, 49, 53, 203, 172, 165, 151, 24, 28, 157, 228, 33, 16, 155, 235, 43, 88, 180, 208, 176, 75, 147, 173, 242, 41}
	internalNodeKey = [32]byte{1, 126, 197, 199, 165, 71, 41, 150, 253, 148, 102, 102, 180, 138, 2, 230, 93, 221, 83, 111, 55, 199, 109, 210, 248, 99, 82, 230, 74, 83, 113, 63}
	zeroKey         [32]byte
)

// String writes h as the spec does (api.md, "Converting Hashes to
// Strings"): each 8-byte group reversed (read as a little-endian uint64
// and printed as 16 hex digits), the four groups in order.
func (h Hash) String() string {
	var b [32]byte
	for g := 0; g < 4; g++ {
		for i := 0; i < 8; i++ {
			b[g*8+i] = h[g*8+7-i]
		}
	}
	return hex.EncodeToString(b[:])
}

// ParseHash reads the text form String writes: 64 lowercase hex digits.
func ParseHash(s string) (Hash, error) {
	var h Hash
	if len(s) != 64 {
		return h, fmt.Errorf("xet hash %q: want 64 hex digits", s)
	}
	for i := 0; i < 64; i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return h, fmt.Errorf("xet hash %q: want lowercase hex", s)
		}
	}
	for g := 0; g < 4; g++ {
		v, err := strconv.ParseUint(s[g*16:g*16+16], 16, 64)
		if err != nil {
			return h, fmt.Errorf("xet hash %q: %v", s, err)
		}
		binary.LittleEndian.PutUint64(h[g*8:], v)
	}
	return h, nil
}

func keyed(key *[32]byte, b []byte) Hash {
	d := blake3.New(32, key[:])
	d.Write(b)
	var h Hash
	d.Sum(h[:0])
	return h
}

// ChunkHash is a chunk's hash: BLAKE3 keyed with DATA_KEY over its
// uncompressed bytes (hashing.md, "Chunk Hashes").
func ChunkHash(data []byte) Hash { return keyed(&dataKey, data) }

// HashLen is a chunk's (or a subtree's) hash and its length in bytes.
type HashLen struct {
	Hash Hash
	Len  uint64
}

// XorbHash is the root of the Merkle tree over chunks (hashing.md, "Xorb
// Hashes"; the grouping follows the reference implementation the spec
// links, xet-core merklehash/aggregated_hashes.rs: groups of at least 2
// and at most 9 nodes, cut after a node whose last 8 bytes, read as a
// little-endian uint64, are 0 modulo 4). The zero Hash for no chunks.
func XorbHash(chunks []HashLen) Hash {
	if len(chunks) == 0 {
		return Hash{}
	}
	hv := append([]HashLen(nil), chunks...)
	for len(hv) > 1 {
		w := 0
		for r := 0; r < len(hv); {
			cut := r + nextMergeCut(hv[r:])
			hv[w] = mergeHashes(hv[r:cut])
			w++
			r = cut
		}
		hv = hv[:w]
	}
	return hv[0].Hash
}

// FileHash is the xorb hash of a file's chunks keyed again with 32 zero
// bytes (hashing.md, "File Hashes"): the file id X-Xet-Hash names.
func FileHash(chunks []HashLen) Hash {
	if len(chunks) == 0 {
		return Hash{}
	}
	root := XorbHash(chunks)
	return keyed(&zeroKey, root[:])
}

const meanBranching = 4

func nextMergeCut(h []HashLen) int {
	if len(h) <= 2 {
		return len(h)
	}
	end := min(2*meanBranching+1, len(h))
	for i := 2; i < end; i++ {
		if binary.LittleEndian.Uint64(h[i].Hash[24:])%meanBranching == 0 {
			return i + 1
		}
	}
	return end
}

// mergeHashes hashes "{hash} : {len}\n" per node with INTERNAL_NODE_KEY.
func mergeHashes(h []HashLen) HashLen {
	buf := make([]byte, 0, len(h)*88)
	var total uint64
	for _, n := range h {
		buf = append(buf, n.Hash.String()...)
		buf = append(buf, " : "...)
		buf = strconv.AppendUint(buf, n.Len, 10)
		buf = append(buf, '\n')
		total += n.Len
	}
	return HashLen{keyed(&internalNodeKey, buf), total}
}
