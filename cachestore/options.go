package cachestore

import (
	"log/slog"
	"time"
)

type options struct {
	log          *slog.Logger
	hook         func(string)
	directIO     bool
	writeBuffer  int
	lockTimeout  time.Duration
	now          func() time.Time
	ingestMaxAge time.Duration
	abandoned    func(IngestInfo) bool
}

// Option configures Open.
type Option func(*options)

// WithLogger sets the logger; default: none (silent).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// WithDirectIO sets whether blobs are written with O_DIRECT where the
// filesystem allows it; default true. O_DIRECT bypasses the page cache: it
// is faster on page-cache-bound nodes and does not evict the pages of the
// inference processes on the same node. Filesystems that refuse it (tmpfs)
// get buffered writes either way.
func WithDirectIO(on bool) Option { return func(o *options) { o.directIO = on } }

// WithWriteBuffer sets the size of each of a Writer's two pipeline
// buffers, which is the size of its writes to disk; default
// DefaultWriteBuffer (2 MiB). Open refuses a size ValidWriteBuffer
// refuses. Smaller buffers hold less memory per pull and lose less of
// what was read to a crash; larger ones cost less CPU per byte.
func WithWriteBuffer(n int) Option { return func(o *options) { o.writeBuffer = n } }

// WithLockTimeout bounds how long Open waits for another process to release
// the index; default 1s.
func WithLockTimeout(d time.Duration) Option { return func(o *options) { o.lockTimeout = d } }

// WithClock sets the time source; default time.Now.
func WithClock(now func() time.Time) Option { return func(o *options) { o.now = now } }

// WithIngestMaxAge sets how old a partial ingest may be before Open deletes
// it instead of keeping it for a resume; default 7 days.
func WithIngestMaxAge(d time.Duration) Option { return func(o *options) { o.ingestMaxAge = d } }

// WithAbandoned tells GC which partial ingests no pull will resume: GC
// removes those for which abandoned returns true, unless a Writer holds
// them open. It is called without any lock of the store held (it may take
// the caller's own locks) and only after Open returns. Default: none is
// abandoned; Open still removes ingests older than the ingest max age.
func WithAbandoned(abandoned func(IngestInfo) bool) Option {
	return func(o *options) { o.abandoned = abandoned }
}

// WithHook calls fn at named points of the commit protocols ("ingest.write",
// "blob.after-rename", "tree.after-rename", "commit.after-index"), and
// before HoldTree links a composed tree ("holdtree.link"). It exists for
// crash and concurrency tests; default none.
func WithHook(fn func(point string)) Option { return func(o *options) { o.hook = fn } }
