package fanout

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/fetchers"
	p2p "github.com/modelcache/modelcache/peer"
)

// Transfer is one blob of a pull, as Fetch needs it: what it is, whose
// it is, where its bytes go and the origin's, and how the pull retries
// and waits. The functions are the caller's; nil ones do nothing.
type Transfer struct {
	Blob p2p.Blob
	// Path names the file in messages.
	Path string
	// Desire is the pull's desire as it stands now (the cluster's: its
	// origin nodes may be recorded after the pull started); Revision the
	// pull's resolution; Started when the pull started.
	Desire   func() api.Desire
	Revision string
	Started  time.Time
	// Open opens (or resumes) the blob's partial ingest; Origin opens the
	// blob at its source from an offset.
	Open   p2p.OpenPartial
	Origin p2p.Origin
	// Backoff retries an interrupted attempt; OnRetry is told of each.
	Backoff fetchers.Backoff
	OnRetry func(attempt int, err error, wait time.Duration)
	// Got is told where the bytes of each attempt came from.
	Got func(p2p.Result)
	// Idle runs a wait for a peer (the pull's slot given back meanwhile);
	// nil runs it as is.
	Idle func(ctx context.Context, wait func() error) error
	// Waiting is told, once, why the blob waits for a peer.
	Waiting func(msg string)
}

// Fetch fetches t's blob into its partial ingest and commits it: from
// the peers that hold it, then the origin (p2p.Fetcher.Ingest). A node
// that is not among the first to fetch the artifact from the origin
// asks only its peers, again at each change of the statuses or Poll,
// until Plan lets it go to the origin. It returns the committed digest
// and whether the blob waited for a peer; its error is the origin's (or
// the store's, or the context's), never a peer's.
func (f *Fleet) Fetch(ctx context.Context, t Transfer) (digest string, waited bool, err error) {
	desire := t.Desire
	// The peer port serves the blob's bytes as they land (t.Open's
	// Writer carries its digest), to the nodes the artifact may go to,
	// until the fetch ends.
	defer f.authz.Fetching(t.Blob.Digest, desire().Name)()
	for {
		pl := f.Plan(desire(), t.Revision, t.Blob.Digest, t.Started, time.Now())
		var from p2p.Origin
		if pl.Origin {
			from = t.Origin
		}
		final := errNoPeerYet
		if len(pl.Peers) > 0 || pl.Origin {
			t.Backoff.Do(ctx, func(int) error {
				var res p2p.Result
				digest, res, final = f.fetcher.Ingest(ctx, t.Blob, pl.Peers, t.Open, from)
				if t.Got != nil {
					t.Got(res)
				}
				switch {
				case final == nil:
					return nil
				case errors.Is(final, p2p.ErrNoSource), errors.Is(final, cachestore.ErrDigestMismatch),
					errors.Is(final, cachestore.ErrSizeMismatch), errors.Is(final, syscall.ENOSPC):
					return fetchers.Permanent(final) // no peer has it yet; the origin's own bytes are wrong; a full disk
				}
				return final
			}, t.OnRetry)
		}
		switch {
		case final == nil:
			f.authz.Fetched(digest, desire().Name) // servable to the nodes this artifact may go to before its version commits
			return digest, waited, nil
		case errors.Is(final, p2p.ErrNoSource), errors.Is(final, errNoPeerYet):
			if !waited {
				waited = true
				if t.Waiting != nil {
					t.Waiting(fmt.Sprintf("%s: waiting for a peer to hold it: %s fetch it from the origin first (--origin-concurrency %d); this node goes to the origin itself at %s if no peer has it by then",
						t.Path, strings.Join(pl.First, ", "), f.cfg.OriginConcurrency, pl.Until.UTC().Format(time.RFC3339)))
				}
			}
			if err := f.wait(ctx, t.Idle, pl.Until); err != nil {
				return "", waited, err
			}
		default:
			return "", waited, final
		}
	}
}

// errNoPeerYet: no peer to ask and the origin not yet this node's turn.
var errNoPeerYet = errors.New("no peer holds the blob yet")
