package cachestore

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"

	bolt "go.etcd.io/bbolt"
)

// The chunk index of Hugging Face Xet files (doc.go: xet/, xetblobs/):
// for each (xorb, chunk range) of a file the store holds, which blob
// holds the chunks' uncompressed bytes and where. A new revision of a
// model then reads the chunks it shares with an older one from the blobs
// here instead of the CAS.
//
// Terms are recorded when the fetcher has assembled a file, once its
// blob is committed (RecordXetTerms; a record made before the commit
// waits for it), and answered only from a blob that
// has its index record (written after the verified blob is renamed into
// blobs/; removed with the blob by GC, by verify's quarantine, by repair
// when the file is gone) and whose file has the recorded size. So a term
// never answers from an ingest still being written, from a blob that
// failed its check, or from one that is gone. GC drops the terms of
// blobs that are neither recorded nor held by a lease.

var (
	bucketXet      = []byte("xet")
	bucketXetBlobs = []byte("xetblobs")
)

// Bounds of what the chunk index accepts.
const (
	// XorbHashLen is the length of a xorb hash as the spec prints it:
	// 32 bytes as 64 lowercase hex (hub-docs docs/xet/api.md).
	XorbHashLen = 64
	// MaxXetChunks bounds a chunk index: eight times xet-core's
	// MAX_XORB_CHUNKS (8 Ki chunks a xorb), whose spec sets no limit of
	// its own beyond the 64 MiB serialized size.
	MaxXetChunks = 1 << 16
	// MaxXetChunkLen is the largest uncompressed chunk: 128 KiB
	// (hub-docs docs/xet/upload-protocol.md, Chunk).
	MaxXetChunkLen = 128 << 10
)

// XetTerm says where, in one blob, the uncompressed bytes of chunks
// [First, End) of Xorb sit: from byte Offset, one length per chunk in
// ChunkLens (len(ChunkLens) == End-First).
type XetTerm struct {
	Xorb      string
	First     uint32
	End       uint32
	Offset    int64
	ChunkLens []uint32
}

// xetPlace is the stored value of one term: where in its blob.
type xetPlace struct {
	Offset    int64    `json:"offset"`
	ChunkLens []uint32 `json:"chunkLens"`
}

// xetRef names one xet/ entry of a blob, so GC can drop it with the blob.
type xetRef struct {
	Xorb  string `json:"xorb"`
	First uint32 `json:"first"`
	End   uint32 `json:"end"`
}

// ValidXorb checks that x is a xorb hash as the index keeps them: 64
// lowercase hex characters.
func ValidXorb(x string) error {
	if len(x) != XorbHashLen || !isLowerHex(x) {
		return fmt.Errorf("xorb %q: %w: want %d lowercase hex characters", x, ErrInvalidXet, XorbHashLen)
	}
	return nil
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func validRange(first, end uint32) bool { return first < end && end <= MaxXetChunks }

// check validates one term and returns the bytes it spans.
func (t XetTerm) check() (int64, error) {
	if err := ValidXorb(t.Xorb); err != nil {
		return 0, err
	}
	if !validRange(t.First, t.End) {
		return 0, fmt.Errorf("xorb %s chunks [%d, %d): %w: want first < end <= %d", t.Xorb, t.First, t.End, ErrInvalidXet, MaxXetChunks)
	}
	if len(t.ChunkLens) != int(t.End-t.First) {
		return 0, fmt.Errorf("xorb %s chunks [%d, %d): %w: %d chunk lengths", t.Xorb, t.First, t.End, ErrInvalidXet, len(t.ChunkLens))
	}
	if t.Offset < 0 {
		return 0, fmt.Errorf("xorb %s chunks [%d, %d): %w: offset %d", t.Xorb, t.First, t.End, ErrInvalidXet, t.Offset)
	}
	return spanLen(t.ChunkLens)
}

// spanLen sums chunk lengths, each in [1, MaxXetChunkLen].
func spanLen(lens []uint32) (int64, error) {
	var n int64
	for _, l := range lens {
		if l == 0 || l > MaxXetChunkLen {
			return 0, fmt.Errorf("%w: chunk length %d, want 1..%d", ErrInvalidXet, l, MaxXetChunkLen)
		}
		n += int64(l)
	}
	return n, nil
}

// xetKey is a term's key in xet/<xorb>/: first and end big-endian (so a
// cursor walks terms by first chunk), then the blob digest.
func xetKey(first, end uint32, blob string) []byte {
	k := make([]byte, 8, 8+len(blob))
	binary.BigEndian.PutUint32(k, first)
	binary.BigEndian.PutUint32(k[4:], end)
	return append(k, blob...)
}

// RecordXetTerms records that the blob with digest blobDigest holds
// these terms. The blob need not be committed yet (the fetcher records a
// file's terms before its commit); XetChunks answers from them only once
// it is. Every term is checked first (ErrInvalidXet): a xorb hash of 64
// lowercase hex, a chunk range within MaxXetChunks, one length per chunk
// of at most MaxXetChunkLen, and, when the blob is already recorded, a
// span within its size; one bad term records none. Safe for concurrent
// use.
func (s *Store) RecordXetTerms(blobDigest string, terms []XetTerm) error {
	d, err := NormalizeDigest(blobDigest)
	if err != nil {
		return err
	}
	ends := make([]int64, len(terms))
	for i, t := range terms {
		n, err := t.check()
		if err != nil {
			return fmt.Errorf("blob %s: %w", d, err)
		}
		ends[i] = t.Offset + n
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		if size, ok := blobSize(tx, d); ok {
			for i, t := range terms {
				if ends[i] > size {
					return fmt.Errorf("blob %s: xorb %s chunks [%d, %d) end at byte %d of a %d-byte blob: %w", d, t.Xorb, t.First, t.End, ends[i], size, ErrInvalidXet)
				}
			}
		}
		xb := tx.Bucket(bucketXet)
		bb := tx.Bucket(bucketXetBlobs)
		refs, err := readXetRefs(bb, d)
		if err != nil {
			return err
		}
		have := map[xetRef]bool{}
		for _, r := range refs {
			have[r] = true
		}
		for _, t := range terms {
			b, err := xb.CreateBucketIfNotExists([]byte(t.Xorb))
			if err != nil {
				return err
			}
			raw, _ := json.Marshal(xetPlace{Offset: t.Offset, ChunkLens: t.ChunkLens})
			if err := b.Put(xetKey(t.First, t.End, d), raw); err != nil {
				return err
			}
			if r := (xetRef{t.Xorb, t.First, t.End}); !have[r] {
				have[r] = true
				refs = append(refs, r)
			}
		}
		raw, _ := json.Marshal(refs)
		return bb.Put([]byte(d), raw)
	})
}

// blobSize is the size a blob's index record gives; false when it has none.
func blobSize(tx *bolt.Tx, d string) (int64, bool) {
	raw := tx.Bucket(bucketBlobs).Get([]byte(d))
	if raw == nil {
		return 0, false
	}
	var r blobRecord
	if json.Unmarshal(raw, &r) != nil {
		return 0, false
	}
	return r.Size, true
}

func readXetRefs(bb *bolt.Bucket, d string) ([]xetRef, error) {
	raw := bb.Get([]byte(d))
	if raw == nil {
		return nil, nil
	}
	var refs []xetRef
	if err := json.Unmarshal(raw, &refs); err != nil {
		return nil, fmt.Errorf("index: xet terms of blob %s: %w", d, err)
	}
	return refs, nil
}

// xetHeld is one term the index holds of a xorb, in a recorded blob.
type xetHeld struct {
	first, end uint32
	blob       string
	size       int64 // the blob's recorded size
	place      xetPlace
}

// XetChunks returns a reader of the uncompressed bytes of chunks
// [first, end) of xorb, the length of each (end-first of them, as
// recorded), and true, when committed blobs hold all of them;
// the range may be stitched from several terms, of several blobs. Nil
// and false otherwise: a xorb hash or range out of bounds, chunks no
// committed blob holds, a blob whose file is gone or not its recorded
// size. It reads only inside blobs, within their recorded size. The
// caller closes the reader; it holds the blob files open, so a blob that
// GC removes meanwhile still reads whole. Safe for concurrent use.
func (s *Store) XetChunks(ctx context.Context, xorb string, first, end uint32) (io.ReadCloser, []uint32, bool) {
	if ctx.Err() != nil || ValidXorb(xorb) != nil || !validRange(first, end) {
		return nil, nil, false
	}
	var held []xetHeld
	err := s.db.View(func(tx *bolt.Tx) error {
		held = xetCandidates(tx, xorb, first, end)
		return nil
	})
	if err != nil || len(held) == 0 {
		return nil, nil, false
	}
	segs, lens, ok := xetCover(held, first, end)
	if !ok {
		return nil, nil, false
	}
	r, err := s.openSegments(segs)
	if err != nil {
		s.log.Debug("xet chunks: a blob of the index cannot be read", "xorb", xorb, "err", err)
		return nil, nil, false
	}
	return r, lens, true
}

// xetCandidates are the terms of xorb that overlap [first, end), in
// recorded blobs, each consistent with its blob's recorded size.
func xetCandidates(tx *bolt.Tx, xorb string, first, end uint32) []xetHeld {
	b := tx.Bucket(bucketXet).Bucket([]byte(xorb))
	if b == nil {
		return nil
	}
	var out []xetHeld
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if len(k) <= 8 || v == nil {
			continue
		}
		h := xetHeld{first: binary.BigEndian.Uint32(k), end: binary.BigEndian.Uint32(k[4:]), blob: string(k[8:])}
		if h.first >= end {
			break // keys are ordered by first chunk
		}
		if h.end <= first || !validRange(h.first, h.end) {
			continue
		}
		size, ok := blobSize(tx, h.blob)
		if !ok || json.Unmarshal(v, &h.place) != nil || len(h.place.ChunkLens) != int(h.end-h.first) || h.place.Offset < 0 {
			continue
		}
		n, err := spanLen(h.place.ChunkLens)
		if err != nil || h.place.Offset+n > size {
			continue
		}
		h.size = size
		out = append(out, h)
	}
	return out
}

// xetSegment is a byte range of one blob.
type xetSegment struct {
	blob   string
	size   int64 // the blob's recorded size
	off, n int64
}

// xetCover stitches [first, end) from held terms, greedily: at each
// chunk, the term that covers it and reaches furthest. It returns the
// segments and each chunk's length.
func xetCover(held []xetHeld, first, end uint32) ([]xetSegment, []uint32, bool) {
	var segs []xetSegment
	lens := make([]uint32, 0, end-first)
	for pos := first; pos < end; {
		best := -1
		for i, h := range held {
			if h.first <= pos && pos < h.end && (best < 0 || h.end > held[best].end) {
				best = i
			}
		}
		if best < 0 {
			return nil, nil, false
		}
		h := held[best]
		stop := min(h.end, end)
		var skip, n int64
		for i, l := range h.place.ChunkLens[:stop-h.first] {
			if uint32(i) < pos-h.first {
				skip += int64(l)
			} else {
				n += int64(l)
				lens = append(lens, l)
			}
		}
		seg := xetSegment{blob: h.blob, size: h.size, off: h.place.Offset + skip, n: n}
		if last := len(segs) - 1; last >= 0 && segs[last].blob == seg.blob && segs[last].off+segs[last].n == seg.off {
			segs[last].n += seg.n // contiguous in one blob: one read
		} else {
			segs = append(segs, seg)
		}
		pos = stop
	}
	return segs, lens, true
}

// openSegments opens each segment's blob once and checks that its file
// has the recorded size before any byte is read.
func (s *Store) openSegments(segs []xetSegment) (io.ReadCloser, error) {
	files := map[string]*os.File{}
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	readers := make([]io.Reader, 0, len(segs))
	for _, sg := range segs {
		f, ok := files[sg.blob]
		if !ok {
			var err error
			if f, err = s.OpenBlob(sg.blob); err != nil {
				closeAll()
				return nil, err
			}
			files[sg.blob] = f
			fi, err := f.Stat()
			if err != nil || fi.Size() != sg.size {
				closeAll()
				return nil, fmt.Errorf("blob %s: %w: not its recorded size %d", sg.blob, ErrSizeMismatch, sg.size)
			}
		}
		if sg.off < 0 || sg.n < 0 || sg.off+sg.n > sg.size {
			closeAll()
			return nil, fmt.Errorf("blob %s: %w: bytes [%d, %d) outside its %d", sg.blob, ErrInvalidXet, sg.off, sg.off+sg.n, sg.size)
		}
		readers = append(readers, io.NewSectionReader(f, sg.off, sg.n))
	}
	return &segmentsReader{Reader: io.MultiReader(readers...), close: closeAll}, nil
}

type segmentsReader struct {
	io.Reader
	close func()
}

func (r *segmentsReader) Close() error { r.close(); return nil }

// pruneXet drops the terms of every blob keep refuses, with its entry in
// xetblobs/, in tx; it returns how many blobs' terms it dropped.
func pruneXet(tx *bolt.Tx, keep func(blob string) bool) (int, error) {
	xb, bb := tx.Bucket(bucketXet), tx.Bucket(bucketXetBlobs)
	var gone []string
	bb.ForEach(func(k, _ []byte) error {
		if !keep(string(k)) {
			gone = append(gone, string(k))
		}
		return nil
	})
	for _, d := range gone {
		refs, err := readXetRefs(bb, d)
		if err != nil {
			refs = xetRefsByScan(xb, d) // an unreadable list: find its entries the long way
		}
		for _, r := range refs {
			b := xb.Bucket([]byte(r.Xorb))
			if b == nil {
				continue
			}
			if err := b.Delete(xetKey(r.First, r.End, d)); err != nil {
				return 0, err
			}
			if k, _ := b.Cursor().First(); k == nil {
				if err := xb.DeleteBucket([]byte(r.Xorb)); err != nil {
					return 0, err
				}
			}
		}
		if err := bb.Delete([]byte(d)); err != nil {
			return 0, err
		}
	}
	return len(gone), nil
}

// xetRefsByScan finds every xet/ entry of blob d by walking all of xet/.
func xetRefsByScan(xb *bolt.Bucket, d string) []xetRef {
	var refs []xetRef
	xb.ForEachBucket(func(x []byte) error {
		return xb.Bucket(x).ForEach(func(k, _ []byte) error {
			if len(k) > 8 && bytes.Equal(k[8:], []byte(d)) {
				refs = append(refs, xetRef{Xorb: string(x), First: binary.BigEndian.Uint32(k), End: binary.BigEndian.Uint32(k[4:])})
			}
			return nil
		})
	})
	return refs
}
