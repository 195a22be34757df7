package xet

import (
	"context"
	"io"
)

// Placed says where, in one file, the uncompressed bytes of chunks
// [First, End) of one xorb sit: from byte Offset of the file, one length
// per chunk in ChunkLens (len(ChunkLens) == End-First).
type Placed struct {
	Xorb      string // the xorb's hash as the spec prints it (hex, each 8-byte group reversed)
	First     uint32 // first chunk index, inclusive
	End       uint32 // last chunk index, exclusive
	Offset    int64
	ChunkLens []uint32
}

// ChunkStore is what this node already holds of the CAS. The daemon
// implements it over the store (cachestore): Remember records, under a
// file's sha256 (the LFS oid, which becomes its blob digest), where that
// file's terms sit once the file is committed; Chunks answers from any
// committed blob that holds every chunk asked for.
type ChunkStore interface {
	// Chunks returns a reader of the uncompressed bytes of chunks
	// [first, end) of xorb, the length of each (end-first of them), and
	// true, when the node holds all of them in committed blobs; nil and
	// false otherwise. The bytes come from blobs whose whole-file digest
	// was checked at commit; the caller still checks the file it
	// assembles. The lengths let the caller remember the chunks under
	// the new file too (Remember), so they outlive the blob they came
	// from.
	Chunks(ctx context.Context, xorb string, first, end uint32) (io.ReadCloser, []uint32, bool)
	// Remember records that the file whose sha256 is oid (hex, no
	// prefix) holds these terms. It is called once the caller committed
	// a blob of that digest from the whole file (Reader.Committed);
	// Chunks must not answer from it until a blob with that digest is
	// committed.
	Remember(ctx context.Context, oid string, terms []Placed) error
}
