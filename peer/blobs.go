package peer

import (
	"context"
	"fmt"
	"os"

	"github.com/modelcache/modelcache/cachestore"
)

// StoreBlobs serves the blobs of a store: what is under blobs/, which
// holds nothing but content whose size and digest were checked on
// commit, and the blobs its Writers opened with WriterOpts.Digest are
// writing now (the bytes written and hashed so far: the receiver checks
// the whole blob). Other partial ingests are never served.
type StoreBlobs struct {
	Store *cachestore.Store
}

// OpenGrowing is the store's OpenGrowing.
func (s StoreBlobs) OpenGrowing(_ context.Context, d string) (GrowingBlob, error) {
	g, err := s.Store.OpenGrowing(d)
	if err != nil {
		return nil, err
	}
	return g, nil
}

// WatchBlob is the store's WatchBlob.
func (s StoreBlobs) WatchBlob(d string) (<-chan struct{}, func()) { return s.Store.WatchBlob(d) }

// OpenBlob holds a lease on d (GC and eviction keep the file until
// release), then opens it.
func (s StoreBlobs) OpenBlob(_ context.Context, d string) (*os.File, int64, func(), error) {
	l := s.Store.NewLease()
	l.Hold(d)
	f, err := s.Store.OpenBlob(d)
	if err != nil {
		l.Release()
		return nil, 0, nil, err
	}
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		f.Close()
		l.Release()
		return nil, 0, nil, fmt.Errorf("blob %s: not a readable regular file: %v", d, err)
	}
	return f, fi.Size(), l.Release, nil
}
