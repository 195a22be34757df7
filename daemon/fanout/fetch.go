package fanout

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
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
// that is not among the first to fetch the artifact from the origin asks
// only its peers, in rounds, until Plan lets it go to the origin. It
// returns the committed digest and whether the blob waited for a peer;
// its error is the origin's (or the store's, or the context's), never a
// peer's: a mismatch is permanent only when the origin's own bytes fail
// the check.
//
// What a waiting blob costs its peers is bounded: the first peer a round
// asks may hold the request up to p2p.MaxWait (p2p.HeaderWait), and
// answers when it holds the blob; two rounds are at least Poll apart (a
// peer that answers 404 at once is not asked faster), and a change of the
// statuses starts a round sooner only when the last one asked nobody. A
// round asks each peer of its plan at most once (MaxPeersAsked). The
// partial ingest is opened once and kept open between rounds: a round
// that gets no byte opens no writer and hashes nothing.
func (f *Fleet) Fetch(ctx context.Context, t Transfer) (digest string, waited bool, err error) {
	desire := t.Desire
	// The peer port serves the blob's bytes as they land (t.Open's
	// Writer carries its digest), to the nodes the artifact may go to,
	// until the fetch ends.
	defer f.authz.Fetching(t.Blob.Digest, desire().Name)()
	ps := &parking{open: t.Open, ctx: ctx}
	defer ps.close()
	// say tells t.Waiting, once, that the blob waits for a peer: before
	// a round whose ask a peer may hold (up to p2p.MaxWait), or after
	// one that found none, so that the status says so while it waits.
	say := func(pl Plan) {
		if !waited {
			waited = true
			if t.Waiting != nil {
				t.Waiting(waitingMessage(t.Path, pl, f.cfg.OriginConcurrency, f.cluster))
			}
		}
	}
	for {
		changed, start := f.changes(), time.Now()
		pl := f.Plan(desire(), t.Revision, t.Blob.Digest, t.Started, start)
		blob, peers := t.Blob, pl.Peers
		var from p2p.Origin
		if pl.Origin {
			from = t.Origin
		} else {
			blob.Wait = min(p2p.MaxWait, pl.Hold.Sub(start)) // none when the plan may let this node go to the origin sooner
			if blob.Wait > 0 && len(peers) > 0 {
				say(pl) // the first peer may hold the ask: this node waits from now
			}
		}
		final := errNoPeerYet
		if len(peers) > 0 || pl.Origin {
			rctx, endRound := ctx, func() {}
			if from == nil && blob.Wait > 0 {
				// Held at its first peer: moved when the plan moves.
				rctx, endRound = f.moveWhenReplanned(ctx, changed, peers[0], ps, func() Plan {
					return f.Plan(desire(), t.Revision, t.Blob.Digest, t.Started, time.Now())
				})
			}
			t.Backoff.Do(ctx, func(int) error {
				var res p2p.Result
				digest, res, final = f.fetcher.Ingest(rctx, blob, peers, ps.opener, from)
				if t.Got != nil {
					t.Got(res)
				}
				switch {
				case final == nil:
					return nil
				case rctx.Err() != nil && ctx.Err() == nil:
					final = errReplanned
					return fetchers.Permanent(final)
				case mismatch(final) && from == nil:
					// Not the origin's bytes (Ingest says ErrNoSource for the
					// peers'; this is a guard): the peers are set aside.
					final = fmt.Errorf("%w: %v", p2p.ErrNoSource, final)
					return fetchers.Permanent(final)
				case errors.Is(final, p2p.ErrNoSource), mismatch(final), errors.Is(final, syscall.ENOSPC):
					return fetchers.Permanent(final) // no peer has it yet; the origin's own bytes are wrong; a full disk
				}
				return final
			}, t.OnRetry)
			endRound()
		}
		switch {
		case final == nil:
			f.authz.Fetched(digest, desire().Name) // servable to the nodes this artifact may go to before its version commits
			return digest, waited, nil
		case errors.Is(final, errReplanned):
			// A new round at once, at the new plan's first peer.
		case errors.Is(final, p2p.ErrNoSource), errors.Is(final, errNoPeerYet):
			say(pl)
			until := pl.Until
			if pl.Hold.After(start) {
				until = pl.Hold // the plan may change then
			}
			if !until.After(start) {
				until = start.Add(f.cfg.Poll) // past --peer-wait, beyond the cap: the statuses change the plan, not the time
			}
			if err := f.wait(ctx, t.Idle, changed, len(peers) == 0, start.Add(f.cfg.Poll), until); err != nil {
				return "", waited, err
			}
		default:
			return "", waited, final
		}
	}
}

// waitingMessage says why a blob waits for a peer, and until when.
func waitingMessage(path string, pl Plan, cap int, cluster bool) string {
	msg := fmt.Sprintf("%s: waiting for a peer to hold it: %s fetch it from the origin first (--origin-concurrency %d)", path, strings.Join(pl.First, ", "), cap)
	at := pl.Until.UTC().Format(time.RFC3339)
	if !cluster {
		return msg + "; this node goes to the origin itself at " + at + " if no peer has it by then"
	}
	return fmt.Sprintf("%s; from %s (--peer-wait) this node goes to the origin itself only when fewer than %d of the nodes that want it (those above first) rank before it for this blob, else it waits on", msg, at, cap)
}

// mismatch says whether err is a commit's failed size or digest check.
func mismatch(err error) bool {
	return errors.Is(err, cachestore.ErrDigestMismatch) || errors.Is(err, cachestore.ErrSizeMismatch)
}

// moveWhenReplanned is the context of one round whose ask is held at
// first (a parent in the blob's tree, which streams the blob once it
// lands there): it ends when the statuses change so that the plan's
// first peer is another one (or the origin) while no byte has come
// this round: a node whose view did not list its parent yet (a node
// that joined later), or whose parent failed or was passed over, would
// otherwise wait its turn at a peer no longer its parent. end stops the
// watch; call it when the round is over.
func (f *Fleet) moveWhenReplanned(ctx context.Context, changed <-chan struct{}, first string, ps *parking, plan func() Plan) (context.Context, func()) {
	rctx, cancel := context.WithCancel(ctx)
	ps.got.Store(false)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-rctx.Done():
				return
			case <-changed:
				changed = f.changes()
				if ps.got.Load() {
					return // streaming: it stays
				}
				if np := plan(); np.Origin || len(np.Peers) == 0 || np.Peers[0] != first {
					cancel()
					return
				}
			}
		}
	}()
	return rctx, func() { close(done); cancel() }
}

// errReplanned: a round's held ask was given up for a new plan.
var errReplanned = errors.New("the plan moved the held ask to another peer")

// parking keeps a blob's partial ingest open between the rounds of one
// Fetch: Ingest closes a partial it did not commit (to keep its bytes
// for a resume), and reopening it would re-hash what it holds. Its
// opener hands out the parked one when there is one; close closes it
// for good.
type parking struct {
	ctx    context.Context // the fetch's: a parked partial outlives a round's
	open   p2p.OpenPartial
	parked p2p.Partial
	got    atomic.Bool // a byte came this round (moveWhenReplanned)
}

func (ps *parking) opener(context.Context) (p2p.Partial, error) {
	if w := ps.parked; w != nil {
		ps.parked = nil
		return &parkable{Partial: w, ps: ps}, nil
	}
	w, err := ps.open(ps.ctx)
	if err != nil {
		return nil, err
	}
	return &parkable{Partial: w, ps: ps}, nil
}

// ReadFrom notes the first byte of the round (parking.got).
func (w *parkable) ReadFrom(r io.Reader) (int64, error) {
	return w.Partial.ReadFrom(firstByte{r: r, got: &w.ps.got})
}

// firstByte is a reader that notes when a byte came.
type firstByte struct {
	r   io.Reader
	got *atomic.Bool
}

func (f firstByte) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if n > 0 && !f.got.Load() {
		f.got.Store(true)
	}
	return n, err
}

func (ps *parking) close() {
	if ps.parked != nil {
		ps.parked.Close()
		ps.parked = nil
	}
}

// parkable is a partial whose Close parks it (open, its bytes and hash
// kept) for the next round; Abort and Commit end it.
type parkable struct {
	p2p.Partial
	ps *parking
}

func (w *parkable) Close() error {
	w.ps.parked = w.Partial
	return nil
}

// errNoPeerYet: no peer to ask and the origin not yet this node's turn.
var errNoPeerYet = errors.New("no peer holds the blob yet")
