package xettest

import (
	"bytes"
	"context"
	"io"
	"sync"

	"github.com/modelcache/modelcache/fetchers/hf/xet"
)

// MemStore is an in-memory xet.ChunkStore for tests: Commit gives it a
// file's bytes under its oid (the store's blob), Remember where that
// file's terms sit; Chunks answers any sub-range of a remembered term of
// a committed file. Safe for concurrent use.
type MemStore struct {
	mu     sync.Mutex
	blobs  map[string][]byte
	placed map[string][]xet.Placed
	Hits   int // Chunks calls answered
}

// NewMemStore returns an empty store.
func NewMemStore() *MemStore {
	return &MemStore{blobs: map[string][]byte{}, placed: map[string][]xet.Placed{}}
}

// Commit records a file's bytes as a committed blob.
func (m *MemStore) Commit(oid string, b []byte) {
	m.mu.Lock()
	m.blobs[oid] = b
	m.mu.Unlock()
}

// Remember implements xet.ChunkStore.
func (m *MemStore) Remember(_ context.Context, oid string, terms []xet.Placed) error {
	m.mu.Lock()
	m.placed[oid] = append(m.placed[oid], terms...)
	m.mu.Unlock()
	return nil
}

// Placed returns what was remembered under oid.
func (m *MemStore) Placed(oid string) []xet.Placed {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]xet.Placed(nil), m.placed[oid]...)
}

// Chunks implements xet.ChunkStore.
func (m *MemStore) Chunks(_ context.Context, x string, first, end uint32) (io.ReadCloser, []uint32, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for oid, ps := range m.placed {
		b, ok := m.blobs[oid]
		if !ok {
			continue
		}
		for _, p := range ps {
			if p.Xorb != x || first < p.First || end > p.End {
				continue
			}
			off := p.Offset
			for i := p.First; i < first; i++ {
				off += int64(p.ChunkLens[i-p.First])
			}
			var n int64
			for i := first; i < end; i++ {
				n += int64(p.ChunkLens[i-p.First])
			}
			if off+n > int64(len(b)) {
				continue
			}
			m.Hits++
			lens := append([]uint32(nil), p.ChunkLens[first-p.First:end-p.First]...)
			return io.NopCloser(bytes.NewReader(b[off : off+n])), lens, true
		}
	}
	return nil, nil, false
}

// Evict drops a file's blob and what was remembered under it, as the
// store's GC does to a blob no version holds.
func (m *MemStore) Evict(oid string) {
	m.mu.Lock()
	delete(m.blobs, oid)
	delete(m.placed, oid)
	m.mu.Unlock()
}
