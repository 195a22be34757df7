package daemon

import (
	"context"
	"errors"
	"slices"

	"github.com/modelcache/modelcache/cachestore"
)

// Partial downloads (the store's ingests) are kept only while a pull may
// resume them. Each download records the artifact it was for as the
// ingest's owner. An ingest is:
//   - open while a writer holds it: never touched;
//   - abandoned when its owner has no present desire (evicted, removed
//     from models.d, set absent), or when it is an archive member (those
//     restart with their layer): the store's GC removes it, and the
//     capacity loop runs that sweep every pass and after every pull;
//   - resumable otherwise (a pull that failed for a reason worth retrying,
//     or one that has not restarted since the daemon did): kept, but
//     counted as reclaimable space that eviction and admission free before
//     any artifact version.
// A pull that fails permanently (a full disk, a source that broke its
// word, its budget spent) removes its own partial data at once.

// reclaimIngests frees up to need bytes (need < 0: all) of partial
// downloads that no writer holds open, oldest first, sparing those of the
// artifacts named keep (a pull being admitted resumes its own). It returns
// the bytes freed.
func (s *space) reclaimIngests(ctx context.Context, need int64, keep ...string) (int64, error) {
	list, err := s.store.ListIngests()
	if err != nil {
		return 0, err
	}
	var freed int64
	for _, in := range list {
		if ctx.Err() != nil || (need >= 0 && freed >= need) {
			break
		}
		if in.Open || (in.Owner != "" && slices.Contains(keep, in.Owner)) {
			continue
		}
		if err := s.store.RemoveIngest(in.Ref); err != nil {
			if !errors.Is(err, cachestore.ErrLocked) {
				s.log.Warn("reclaim partial download", "owner", in.Owner, "err", err)
			}
			continue
		}
		s.log.Info("reclaimed a partial download for space", "owner", in.Owner, "bytes", in.Size)
		freed += in.Size
	}
	return freed, ctx.Err()
}

// reclaimable is what reclaimIngests(ctx, -1, keep) would free now.
func (s *space) reclaimable(keep string) int64 {
	list, err := s.store.ListIngests()
	if err != nil {
		return 0
	}
	var n int64
	for _, in := range list {
		if !in.Open && (keep == "" || in.Owner != keep) {
			n += in.Size
		}
	}
	return n
}
