// Package xet reconstructs a Hugging Face Hub file from the Xet
// content-addressed store (CAS): a read token, the file's reconstruction
// (terms: a xorb and a chunk range each), ranged xorb reads, chunk
// decoding, and assembly in order. Chunks this node already holds come
// from a ChunkStore instead of the CAS, so a new revision fetches only
// what the node lacks. The protocol follows hub-docs docs/xet/ (api.md,
// chunking.md, xorb.md, shard.md, auth.md); each file cites the part it
// follows.
//
// The package knows nothing about the store's layout: the daemon adapts
// the store to ChunkStore (daemon/xetchunks.go).
//
// Where to find what:
//
//	chunkstore.go   ChunkStore (chunks a node holds), Placed (where a file's terms sit)
//	hash.go         Hash and its text form, chunk hashes (keyed BLAKE3), xorb and file hashes (Merkle)
//	chunk.go        the chunk header, the schemes (none, LZ4, ByteGrouping4-LZ4), ChunkReader, EncodeChunk
//	lz4frame.go     an LZ4 frame as xet-core writes it, decoded block by block straight into the chunk
//	ungroup_amd64.go, ungroup_amd64.s
//	                ByteGrouping4's inverse 16 bytes of each group at a time (SSE2)
//	ungroup_other.go the same elsewhere (and with -tags purego): ungroup4's plain loop does it all
//	cdc.go          content-defined chunking (Gear hash, chunking.md), for test servers and benchmarks
//	client.go       read tokens (TokenSource), the reconstruction API (v2, v1 fallback)
//	reconstruct.go  Open and Reader: a file from an offset, window by window; Committed teaches the ChunkStore
//	assemble.go     one window: its terms laid out in one buffer, held ones read from the ChunkStore, the rest fetched
//	transfer.go     ranged and multi-range reads of xorbs from signed URLs, chunks decoded straight into their terms
package xet
