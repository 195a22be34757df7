package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/fetchers"
)

// Blob is one blob to fetch: its digest ("sha256:<hex>", from the
// cluster's resolution) and its size in bytes.
type Blob struct {
	Digest string
	Size   int64
	// Wait, when positive, is how long the first peer a Fetch asks may
	// hold the request of a blob it does not hold yet (HeaderWait, in
	// whole seconds, at most MaxWait): a caller with nothing better to do
	// than wait (the origin is not its to ask yet) asks once and is
	// answered when the peer holds the blob, not once a second. A peer
	// without support answers 404 at once.
	Wait time.Duration
}

// MaxWait bounds Blob.Wait (below the client's 60 s response header
// timeout).
const MaxWait = 30 * time.Second

// Partial is the partial ingest a fetch writes into, at its Offset: the
// store's *cachestore.Writer is one. A caller may wrap its ReadFrom to
// count progress, bound bandwidth or tee the bytes; an error the wrapper
// returns (not one it passes on from the reader) is the sink's, which
// blames no source. Its contract is the Writer's:
// ReadFrom appends, Offset is how many bytes it holds, Commit checks
// size and digest and moves the data into the store (deleting it on a
// mismatch, with an error wrapping cachestore.ErrDigestMismatch or
// ErrSizeMismatch), Close keeps the data for a resume, Abort drops it.
type Partial interface {
	io.ReaderFrom
	Offset() int64
	Commit(ctx context.Context, size int64, expected string) (string, error)
	Close() error
	Abort()
}

// OpenPartial opens, or resumes, the partial ingest of the blob being
// fetched (the daemon: store.Writer with the blob's ref, size and lease).
type OpenPartial func(ctx context.Context) (Partial, error)

// Origin opens the blob at its source from offset (the daemon: its
// fetcher's Open of the file). The fetcher tries it after every usable
// peer failed, and on its own when no peer is usable; its errors come
// back unchanged, for the caller's retry policy. Its body is held to no
// progress floor or idle time of the fetcher's (those are for peers): an
// Origin bounds its own stream, as the daemon's fetchers do.
type Origin func(ctx context.Context, offset int64) (io.ReadCloser, error)

// TokenSource gives the bearer token of each outgoing request (a
// *TokenFile over the projected service-account token).
type TokenSource interface {
	Token() (string, error)
}

// SourceOrigin names the origin in a Span.
const SourceOrigin = "origin"

// Span is a run of bytes of one fetch and where they came from: a peer's
// base URL or SourceOrigin.
type Span struct {
	Source string
	Offset int64
	Bytes  int64
}

// Result says where the bytes of one Fetch (or Ingest) came from.
// Resumed bytes were in the partial ingest before it started: their
// source is not known to this fetch.
type Result struct {
	Resumed int64
	Spans   []Span
}

// Peers lists the peers that gave bytes, once each.
func (r Result) Peers() []string {
	var out []string
	seen := map[string]bool{}
	for _, s := range r.Spans {
		if s.Source != SourceOrigin && s.Bytes > 0 && !seen[s.Source] {
			seen[s.Source] = true
			out = append(out, s.Source)
		}
	}
	return out
}

// Bytes sums the bytes from source.
func (r Result) Bytes(source string) int64 {
	var n int64
	for _, s := range r.Spans {
		if s.Source == source {
			n += s.Bytes
		}
	}
	return n
}

func (r Result) bytes() int64 {
	var n int64
	for _, s := range r.Spans {
		n += s.Bytes
	}
	return n
}

func (r *Result) add(source string, off, n int64) {
	if n > 0 {
		r.Spans = append(r.Spans, Span{Source: source, Offset: off, Bytes: n})
	}
}

// Fetcher gets blobs from peer daemons, falling back to the origin. A
// peer is untrusted: bytes from it go into the same partial ingest as the
// origin's, nothing commits without the store's size and digest check,
// and a peer that fails a transfer in any way (see the Avoid reasons) is
// set aside for a while (exponential per peer, AvoidFor; a busy one for
// its Retry-After only) while the transfer goes on, from the same offset, at the next peer or the origin.
// Use NewFetcher; safe for concurrent use.
type Fetcher struct {
	tokens TokenSource
	client *http.Client
	o      fetcherOptions
	mu     sync.Mutex
	peers  map[string]*peerState
}

type fetcherOptions struct {
	http               fetchers.HTTPOptions
	floor              int64
	window             time.Duration
	avoidMin, avoidMax time.Duration
	maxRetryAfter      time.Duration
	now                func() time.Time
	log                *slog.Logger
	metrics            *Metrics
}

// FetcherOption sets one setting of NewFetcher.
type FetcherOption func(*fetcherOptions)

// WithHTTP sets the HTTP settings (transport, idle timeout, User-Agent)
// from fetchers' Options; redirects are refused whatever they say.
// Default fetchers.DefaultHTTPOptions with a 30s idle timeout.
func WithHTTP(opts ...fetchers.Option) FetcherOption {
	return func(o *fetcherOptions) { o.http.Apply(opts...) }
}

// WithProgressFloor sets the least a peer must send in each window of
// time spent reading it (fetchers.MinRate); less sets it aside (a peer
// is on the cluster's network: one slower than this is worth less than
// the origin). Default 8 MiB per 10s; a floor of 0 turns it off.
func WithProgressFloor(floor int64, window time.Duration) FetcherOption {
	return func(o *fetcherOptions) { o.floor, o.window = floor, window }
}

// AvoidFor sets how long a failing peer is set aside: min after its
// first failure, doubling with each failure in a row up to max; a
// success forgets its failures. A busy peer (429, 503) is no failure: it
// is set aside for its Retry-After only. Default 30s and 10m.
func AvoidFor(min, max time.Duration) FetcherOption {
	return func(o *fetcherOptions) { o.avoidMin, o.avoidMax = min, max }
}

// WithMaxRetryAfter sets the longest a peer's Retry-After sets it aside:
// a longer one (a peer that says "come back tomorrow") counts as d, so
// one peer's word never keeps this node from it longer than the node
// itself would wait (the daemon passes its --peer-wait). Default 10m.
func WithMaxRetryAfter(d time.Duration) FetcherOption {
	return func(o *fetcherOptions) { o.maxRetryAfter = d }
}

// WithClock sets the clock of the avoidance; default time.Now.
func WithClock(now func() time.Time) FetcherOption { return func(o *fetcherOptions) { o.now = now } }

// WithFetcherLogger sets the logger; default none.
func WithFetcherLogger(l *slog.Logger) FetcherOption { return func(o *fetcherOptions) { o.log = l } }

// WithFetcherMetrics counts bytes by source and avoided peers in m;
// default none.
func WithFetcherMetrics(m *Metrics) FetcherOption { return func(o *fetcherOptions) { o.metrics = m } }

// NewFetcher returns a Fetcher whose requests carry tokens' token.
func NewFetcher(tokens TokenSource, opts ...FetcherOption) (*Fetcher, error) {
	o := fetcherOptions{http: fetchers.DefaultHTTPOptions(), floor: 8 << 20, window: 10 * time.Second,
		avoidMin: 30 * time.Second, avoidMax: 10 * time.Minute, maxRetryAfter: 10 * time.Minute, now: time.Now}
	o.http.IdleTimeout = 30 * time.Second
	for _, opt := range opts {
		opt(&o)
	}
	o.http.NoRedirects = true
	switch {
	case tokens == nil:
		return nil, errors.New("peer fetcher: needs a token source (the projected service-account token file)")
	case o.floor < 0 || (o.floor > 0 && o.window <= 0):
		return nil, fmt.Errorf("peer fetcher: progress floor %d per %s: want a floor >= 0 (0 = off) and a window > 0", o.floor, o.window)
	case o.avoidMin <= 0 || o.avoidMax < o.avoidMin:
		return nil, fmt.Errorf("peer fetcher: avoid peers for %s to %s: want 0 < min <= max", o.avoidMin, o.avoidMax)
	case o.maxRetryAfter <= 0:
		return nil, fmt.Errorf("peer fetcher: longest Retry-After %s: want > 0 (the daemon's --peer-wait)", o.maxRetryAfter)
	}
	if o.log == nil {
		o.log = slog.New(slog.DiscardHandler)
	}
	return &Fetcher{tokens: tokens, client: o.http.Client(), o: o, peers: map[string]*peerState{}}, nil
}

// ErrNoSource is returned by Fetch when every peer failed and there is no
// origin to fall back to.
var ErrNoSource = errors.New("no source left")

// Fetch fills dst from its Offset to b.Size: from each usable peer of
// peers in turn (the order is the caller's preference; peers set aside
// are skipped), then from origin (nil: none). A transfer that fails
// midway goes on from dst's new offset at the next source. It does not
// commit dst, nor close it. The error is the origin's, a failure of dst
// itself (a full disk), the context's, or ErrNoSource; a peer's failure
// is never returned while origin is there. A streamed answer
// (HeaderStreamed) cut short ends it (an error Ingest tells apart): dst
// then holds bytes no sender checked, for the caller to drop.
func (f *Fetcher) Fetch(ctx context.Context, b Blob, peers []string, dst Partial, origin Origin) (Result, error) {
	res := Result{Resumed: dst.Offset()}
	if _, err := cachestore.ParseDigest(b.Digest); err != nil || !strings.HasPrefix(b.Digest, cachestore.DigestPrefix) {
		return res, fmt.Errorf("peer fetch: blob digest %q: want sha256:<64 lowercase hex>", b.Digest)
	}
	if b.Size < 0 || dst.Offset() > b.Size {
		return res, fmt.Errorf("peer fetch %s: size %d with %d bytes already held: want a known size no smaller than what is held", b.Digest, b.Size, dst.Offset())
	}
	usable := f.usable(peers)
	var tok string
	if len(usable) > 0 {
		var err error
		if tok, err = f.tokens.Token(); err != nil {
			f.o.log.Warn("peer fetch: no token for peers; fetching from the origin", "digest", b.Digest, "err", err)
			usable = nil
		}
	}
	var last error
	for i, p := range usable {
		if dst.Offset() == b.Size {
			break
		}
		off := dst.Offset()
		ask := b
		if i > 0 {
			ask.Wait = 0 // only the first peer holds the request
		}
		n, err := f.fromPeer(ctx, p, tok, ask, dst)
		res.add(p, off, n)
		f.o.metrics.received("peer", n)
		var se sinkError
		switch {
		case err == nil:
			f.succeeded(p)
			return res, nil
		case errors.As(err, &se):
			return res, se.err
		case ctx.Err() != nil:
			return res, ctx.Err()
		}
		last = err
		var pe *peerError
		if errors.As(err, &pe) && pe.reason == "" { // the peer lacks the blob: not its fault
			f.o.log.Debug("peer fetch: peer does not hold the blob", "peer", p, "digest", b.Digest)
			continue
		}
		f.setAside(p, err)
		if pe != nil && pe.streamed && n > 0 {
			// Bytes its sender had not checked yet: dropped (Ingest).
			return res, fmt.Errorf("%w: %v", errStreamDropped, err)
		}
	}
	if dst.Offset() == b.Size {
		return res, nil
	}
	if origin == nil {
		return res, fmt.Errorf("peer fetch %s: %w (no origin; last peer error: %v)", b.Digest, ErrNoSource, last)
	}
	off := dst.Offset()
	rc, err := origin(ctx, off)
	if err != nil {
		return res, err
	}
	n, err := f.transfer(rc, b, dst, originPace)
	res.add(SourceOrigin, off, n)
	f.o.metrics.received(SourceOrigin, n)
	var se sinkError
	if errors.As(err, &se) {
		return res, se.err
	}
	return res, err
}

// Ingest fetches b into the partial ingest open opens and commits it;
// it returns the committed digest. When the commit fails its size or
// digest check and any byte came from a peer (or from before this call),
// every peer that gave bytes is set aside (AvoidDigest) and the blob is
// fetched once more from byte 0: from the origin alone when there is
// one, else from the peers not set aside, and with none left the error
// is ErrNoSource (never the mismatch: a lying peer costs time, never a
// wrong byte nor a failed pull). A mismatch is returned only when the
// origin's own bytes failed the check. When the origin cannot continue
// the partial blob (fetchers.ErrCannotResume) it is dropped and fetched
// once more from byte 0. On a Permanent failure the partial ingest is
// dropped; on any other it is closed, kept for the caller's next
// attempt to resume. A streamed answer cut short drops the partial
// ingest and fetches the blob again (its sender set aside for a moment,
// not for a failure: its own source failed it).
func (f *Fetcher) Ingest(ctx context.Context, b Blob, peers []string, open OpenPartial, origin Origin) (string, Result, error) {
	d, res, cur, err := f.ingestKept(ctx, b, peers, open, origin)
	if errors.Is(err, fetchers.ErrCannotResume) && cur.Resumed+cur.bytes() > 0 {
		// The origin cannot continue what is held: start the blob over.
		f.o.log.Warn("peer fetch: the origin cannot continue the partial blob; starting it over", "digest", b.Digest, "err", err)
		d, _, again, err := f.ingestKept(ctx, b, peers, open, origin)
		again.Spans = append(res.Spans, again.Spans...)
		return d, again, err
	}
	// Each round sets aside the peers that gave bytes (or starts over
	// without the bytes held before): at most one more than the peers.
	for range len(peers) + 1 {
		if err == nil || !mismatch(err) {
			return d, res, err
		}
		if cur.Resumed == 0 && len(cur.Peers()) == 0 {
			return "", res, err // the origin's own bytes: its error
		}
		f.Distrust(cur, err)
		if origin != nil {
			d, again, err := f.ingestOnce(ctx, b, nil, open, origin)
			again.Spans = append(res.Spans, again.Spans...)
			return d, again, err
		}
		f.o.log.Warn("peer fetch: the peers' bytes failed the check; asking the others", "digest", b.Digest, "err", err)
		b.Wait = 0 // the round that waited is over
		var all Result
		d, all, cur, err = f.ingestKept(ctx, b, peers, open, nil)
		res = Result{Resumed: all.Resumed, Spans: append(res.Spans, all.Spans...)}
	}
	if mismatch(err) {
		err = fmt.Errorf("peer fetch %s: %w (every peer's bytes failed the check: %v)", b.Digest, ErrNoSource, err)
	}
	return d, res, err
}

// mismatch says whether err is a commit's failed size or digest check.
func mismatch(err error) bool {
	return errors.Is(err, cachestore.ErrDigestMismatch) || errors.Is(err, cachestore.ErrSizeMismatch)
}

// errStreamDropped: a streamed answer (HeaderStreamed) ended before the
// blob was whole, so its sender never vouched for the bytes it sent (it
// sends the last byte only once its own commit checked them): Fetch
// stops there, and the partial ingest is dropped and fetched again.
var errStreamDropped = errors.New("a streamed answer ended before the blob was whole: its bytes are dropped")

// ingestKept is ingestOnce, started over while a streamed answer ended
// early (errStreamDropped: its sender is set aside for a moment, so the
// next try asks the others first). all is every try's bytes, cur the
// last try's (the bytes its commit checked); with no try left the error
// is ErrNoSource.
func (f *Fetcher) ingestKept(ctx context.Context, b Blob, peers []string, open OpenPartial, origin Origin) (d string, all, cur Result, err error) {
	d, cur, err = f.ingestOnce(ctx, b, peers, open, origin)
	all = cur
	for range len(peers) {
		if !errors.Is(err, errStreamDropped) {
			break
		}
		f.o.log.Info("peer fetch: a streamed answer ended early; its unchecked bytes are dropped and the blob asked for again", "digest", b.Digest, "err", err)
		d, cur, err = f.ingestOnce(ctx, b, peers, open, origin)
		all = Result{Resumed: all.Resumed, Spans: append(all.Spans, cur.Spans...)}
	}
	if errors.Is(err, errStreamDropped) {
		err = fmt.Errorf("peer fetch %s: %w (%v)", b.Digest, ErrNoSource, err)
	}
	return d, all, cur, err
}

func (f *Fetcher) ingestOnce(ctx context.Context, b Blob, peers []string, open OpenPartial, origin Origin) (string, Result, error) {
	w, err := open(ctx)
	if err != nil {
		return "", Result{}, err
	}
	res, err := f.Fetch(ctx, b, peers, w, origin)
	if err != nil {
		if errors.Is(err, fetchers.ErrCannotResume) || errors.Is(err, errStreamDropped) || (fetchers.IsPermanent(err) && ctx.Err() == nil) {
			w.Abort() // no later attempt can continue these bytes
		} else {
			w.Close() // kept for the next attempt to resume
		}
		return "", res, err
	}
	d, err := w.Commit(ctx, b.Size, b.Digest)
	return d, res, err
}
