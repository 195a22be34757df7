package daemon

import (
	"context"
	"io"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/fetchers/hf/xet"
)

// xetChunks is the store as the hf fetcher's Xet path sees it
// (xet.ChunkStore): the chunks of files the node holds, answered from
// committed blobs only (cachestore.Store.XetChunks), and the terms of a
// file the fetcher has assembled, recorded under the blob its sha256
// names. Safe for concurrent use; its zero value is not usable.
type xetChunks struct {
	store xetIndex
}

// xetIndex is what xetChunks needs of the store.
type xetIndex interface {
	XetChunks(ctx context.Context, xorb string, first, end uint32) (io.ReadCloser, []uint32, bool)
	RecordXetTerms(blobDigest string, terms []cachestore.XetTerm) error
}

var _ xet.ChunkStore = xetChunks{}

// Chunks answers from committed blobs that hold every chunk of
// [first, end) of xorb.
func (c xetChunks) Chunks(ctx context.Context, xorb string, first, end uint32) (io.ReadCloser, []uint32, bool) {
	return c.store.XetChunks(ctx, xorb, first, end)
}

// Remember records the terms of the file whose sha256 is oid (64 hex, the
// LFS oid, no prefix) under the blob digest the store gives that file,
// "sha256:<oid>". The store answers from them once that blob is
// committed; a bad oid or term is refused (cachestore.ErrInvalidDigest,
// cachestore.ErrInvalidXet) and nothing of the call is recorded.
func (c xetChunks) Remember(ctx context.Context, oid string, terms []xet.Placed) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d, err := cachestore.NormalizeDigest(oid)
	if err != nil {
		return err
	}
	out := make([]cachestore.XetTerm, len(terms))
	for i, t := range terms {
		out[i] = cachestore.XetTerm{Xorb: t.Xorb, First: t.First, End: t.End, Offset: t.Offset, ChunkLens: t.ChunkLens}
	}
	return c.store.RecordXetTerms(d, out)
}

// hfXetOptions is the one decision of how a desire's hf:// files come,
// given the daemon's --xet (node) and its store: rebuilt from the Hub's
// Xet store (enabled, reusing the chunks cs holds) unless --xet is off or
// the desire says xet: false (a models.d file, a ModelCache's spec.xet).
// cs is nil when not enabled, and the node's one store otherwise. The hub
// fetchers get it through sources.Config.Xet (Config.sourcesConfig).
func hfXetOptions(node bool, st xetIndex) func(ds api.Desire) (enabled bool, cs xet.ChunkStore) {
	return func(ds api.Desire) (bool, xet.ChunkStore) {
		if !node || (ds.Xet != nil && !*ds.Xet) {
			return false, nil
		}
		return true, xetChunks{store: st}
	}
}
