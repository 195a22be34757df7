package warm

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"golang.org/x/time/rate"
)

var (
	// ErrEscape: a symlink in the tree leads out of it.
	ErrEscape = errors.New("symlink leads out of the tree")
	// ErrRateLimited: the caller started too many warms lately.
	ErrRateLimited = errors.New("too many warms started by this caller")
	// ErrClosed: the Warmer is closed.
	ErrClosed = errors.New("warmer closed")
)

// Reason says why a warm stopped.
type Reason string

const (
	Done        Reason = "done"      // every byte of the plan is resident
	BudgetSpent Reason = "budget"    // it read its budget's worth
	Cancelled   Reason = "cancelled" // every holder's context ended (unpublished, lease ended), or Close
	Overtaken   Reason = "overtaken" // the consumer's own reads got ahead of it
	Failed      Reason = "failed"    // the tree could not be planned or read: Result.Err
)

// Result is what one warm did.
type Result struct {
	Key      string
	Warmed   int64         // bytes it read into the page cache
	Resident int64         // bytes it found already resident and skipped
	Total    int64         // bytes of the plan
	Budget   int64         // the most it could read (0 until planned)
	Elapsed  time.Duration // from the start to the end (so far, in Progress)
	Yielded  time.Duration // of Elapsed, the time it waited for other I/O
	Reason   Reason        // empty while it runs
	Err      error         // when Reason is Failed
}

// Request names one warm.
type Request struct {
	// Key identifies the revision (e.g. "<name>@<revision>"): one warm
	// per key runs at a time.
	Key string
	// Dir is the committed tree of that revision (models/<name>/<revision>
	// or a path through current); Plan's rules apply.
	Dir string
	// Caller is who asked (e.g. "uid:1000", "csi"), for the rate limit on
	// starts.
	Caller string
	// Unlimited: the rate limit does not apply (root on the node, who may
	// fill the page cache anyway).
	Unlimited bool
}

// config is what the options set; New fills the defaults.
type config struct {
	share     float64
	limit     int64
	chunk     int64
	lookahead int64
	every     time.Duration
	burst     int
	metrics   *Metrics
	log       *slog.Logger
	available func() (int64, error)
	onChunk   func(r *Run, i int) // tests: called before each chunk

	yieldAbove            int64 // bytes/s of others' I/O on the device; 0: never yield
	yieldWindow, yieldMax time.Duration
	device                func(dirfd int) devCounter
}

// Option sets one of a Warmer's settings.
type Option func(*config) error

// WithShare sets the share of MemAvailable (read at each start) that all
// running warms together may read into the page cache. Default
// DefaultShare (0.25); must be in (0, 1].
func WithShare(share float64) Option {
	return func(c *config) error {
		if err := checkShare(share); err != nil {
			return err
		}
		c.share = share
		return nil
	}
}

// WithLimit caps, in bytes, what all running warms together may read,
// whatever MemAvailable says (a node setting). Default 0: no cap beyond
// the share.
func WithLimit(bytes int64) Option {
	return func(c *config) error {
		if bytes < 0 {
			return fmt.Errorf("warm: a limit of %d bytes: give 0 (none) or more", bytes)
		}
		c.limit = bytes
		return nil
	}
}

// WithChunk sets the size of one read. Default 8 MiB; between 64 KiB and
// 256 MiB, a multiple of the page size.
func WithChunk(bytes int64) Option {
	return func(c *config) error {
		if bytes < 64<<10 || bytes > 256<<20 || bytes%pageSize != 0 {
			return fmt.Errorf("warm: a chunk of %d bytes: give a multiple of %d between 64 KiB and 256 MiB", bytes, pageSize)
		}
		c.chunk = bytes
		return nil
	}
}

// WithLookahead sets how far ahead of its cursor a warm watches for the
// consumer's reads. A chunk probed that far ahead of which more than half
// became resident by the time the cursor is half that distance from it,
// or at it, was read by someone else (the warm's own reads have the
// kernel's readahead off): the warm is overtaken. 0 never looks ahead.
// Default 64 MiB.
func WithLookahead(bytes int64) Option {
	return func(c *config) error {
		if bytes < 0 {
			return fmt.Errorf("warm: a lookahead of %d bytes: give 0 or more", bytes)
		}
		c.lookahead = bytes
		return nil
	}
}

// WithStartRate limits new warms per caller: one every every, with
// bursts of burst (a token bucket per caller; joining a running warm is
// free). Default one every 10 s, bursts of 4.
func WithStartRate(every time.Duration, burst int) Option {
	return func(c *config) error {
		if every <= 0 || burst < 1 {
			return fmt.Errorf("warm: a start rate of one every %v, bursts of %d: give a positive interval and a burst of 1 or more", every, burst)
		}
		c.every, c.burst = every, burst
		return nil
	}
}

// WithYield makes a warm wait while other processes read or write more
// than bytesPerSecond on the block device of the tree (a pull, the pod's
// own reads), measured from the device's counters between its reads
// (/sys/dev/block/MAJ:MIN/stat; a filesystem on no single device has
// none and relies on the I/O priority alone). It is what keeps a warm
// out of the way under the none I/O scheduler, which ignores I/O
// priorities. Default 64 MB/s; 0 never yields.
func WithYield(bytesPerSecond int64) Option {
	return func(c *config) error {
		if bytesPerSecond < 0 {
			return fmt.Errorf("warm: a yield threshold of %d bytes/s: give 0 (never yield) or more", bytesPerSecond)
		}
		c.yieldAbove = bytesPerSecond
		return nil
	}
}

// WithMetrics counts into m (NewMetrics). Default none.
func WithMetrics(m *Metrics) Option {
	return func(c *config) error { c.metrics = m; return nil }
}

// WithChunkHook calls fn with the warm's key before each chunk it reads,
// on the warm's own thread: a test's way to hold a warm while it runs
// (the warm sees its context end once fn returns). Default none.
func WithChunkHook(fn func(key string)) Option {
	return func(c *config) error {
		if fn != nil {
			c.onChunk = func(r *Run, _ int) { fn(r.key) }
		}
		return nil
	}
}

// WithLogger logs each warm's end. Default nil: silent.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) error { c.log = l; return nil }
}

// Warmer reads revisions into the page cache ahead of their consumers,
// one warm per key, within a memory budget, at idle I/O priority. Its
// methods are safe for concurrent use; the zero value is not usable
// (New).
type Warmer struct {
	cfg config

	mu       sync.Mutex
	runs     map[string]*Run // running warms by key
	all      sync.WaitGroup  // every warm's goroutine, for Close
	reserved int64           // the budgets of running warms
	callers  map[string]*rate.Limiter
	closed   bool
}

// New makes a Warmer.
func New(opts ...Option) (*Warmer, error) {
	c := config{share: DefaultShare, chunk: 8 << 20, lookahead: 64 << 20, every: 10 * time.Second, burst: 4, available: MemAvailable,
		yieldAbove: 64e6, yieldWindow: 50 * time.Millisecond, yieldMax: time.Second, device: deviceOf}
	for _, o := range opts {
		if err := o(&c); err != nil {
			return nil, err
		}
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	return &Warmer{cfg: c, runs: map[string]*Run{}, callers: map[string]*rate.Limiter{}}, nil
}

// maxCallers bounds the rate limiter table; callers whose bucket is
// full again are forgotten first.
const maxCallers = 4096

// Start warms req.Dir unless a warm of req.Key runs already, in which
// case it joins that one (joined is true, and the rate limit is not
// consulted). The warm runs until it is done, its budget is spent, the
// consumer overtakes it, or every holder's ctx has ended: ctx is this
// caller's hold (the volume's publication, the lease), not the duration
// of the call. A new start beyond req.Caller's rate is ErrRateLimited.
// Start does not wait: see Run.
func (w *Warmer) Start(ctx context.Context, req Request) (run *Run, joined bool, err error) {
	if req.Key == "" || req.Dir == "" {
		return nil, false, fmt.Errorf("warm: a request needs a key (the revision) and a dir (its committed tree); got key %q dir %q", req.Key, req.Dir)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, false, ErrClosed
	}
	if r := w.runs[req.Key]; r != nil {
		r.hold(ctx)
		return r, true, nil
	}
	if !req.Unlimited && !w.limiter(req.Caller).Allow() {
		w.cfg.metrics.refused()
		return nil, false, fmt.Errorf("warm %s for %s: %w (a caller starts at most %d warms in a burst, then one every %v, whether or not the earlier ones still run)", req.Key, req.Caller, ErrRateLimited, w.cfg.burst, w.cfg.every)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	r := &Run{w: w, ctx: runCtx, cancel: cancel, done: make(chan struct{}), start: time.Now(), key: req.Key}
	w.runs[req.Key] = r
	r.hold(ctx)
	w.all.Add(1)
	go func() {
		defer w.all.Done()
		// The thread takes idle priorities and is never unlocked: it
		// exits with this goroutine (idleThread).
		runtime.LockOSThread()
		res := r.run(req)
		w.finish(r, res)
	}()
	return r, false, nil
}

// Warm starts (or joins) the warm of req and waits for its end or ctx's.
func (w *Warmer) Warm(ctx context.Context, req Request) (Result, error) {
	r, _, err := w.Start(ctx, req)
	if err != nil {
		return Result{}, err
	}
	return r.Wait(ctx)
}

// Running is the warm of key, or nil.
func (w *Warmer) Running(key string) *Run {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.runs[key]
}

// Close cancels every warm, waits for them, and refuses new ones.
func (w *Warmer) Close() {
	w.mu.Lock()
	w.closed = true
	for _, r := range w.runs {
		r.cancel()
	}
	w.mu.Unlock()
	w.all.Wait()
}

func (w *Warmer) limiter(caller string) *rate.Limiter {
	l := w.callers[caller]
	if l != nil {
		return l
	}
	if len(w.callers) >= maxCallers {
		for c, l := range w.callers {
			if l.Tokens() >= float64(w.cfg.burst) {
				delete(w.callers, c)
			}
		}
	}
	l = rate.NewLimiter(rate.Every(w.cfg.every), w.cfg.burst)
	w.callers[caller] = l
	return l
}

// reserve takes a budget for a warm of total bytes from what the share
// (and the limit) leave beside the running warms' budgets.
func (w *Warmer) reserve(total int64) (int64, error) {
	avail, err := w.cfg.available()
	if err != nil {
		return 0, err
	}
	pool, err := Budget(w.cfg.share, avail, 1<<62)
	if err != nil {
		return 0, err
	}
	if w.cfg.limit > 0 {
		pool = min(pool, w.cfg.limit)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	b := max(0, min(pool-w.reserved, total))
	w.reserved += b
	return b, nil
}

func (w *Warmer) finish(r *Run, res Result) {
	w.mu.Lock()
	w.reserved -= res.Budget
	if w.runs[r.key] == r {
		delete(w.runs, r.key)
	}
	w.mu.Unlock()
	r.cancel()
	w.cfg.metrics.finish(res)
	w.cfg.log.Debug("warm ended", "key", res.Key, "reason", res.Reason, "warmed_bytes", res.Warmed,
		"resident_bytes", res.Resident, "total_bytes", res.Total, "budget_bytes", res.Budget, "seconds", res.Elapsed.Seconds(), "yielded_seconds", res.Yielded.Seconds(), "error", res.Err)
	r.result = res
	close(r.done)
}

// Run is one warm in progress. Its methods are safe for concurrent use.
type Run struct {
	w       *Warmer
	key     string
	ctx     context.Context // ended when every holder's context has ended
	cancel  context.CancelFunc
	holders int // under w.mu
	start   time.Time
	done    chan struct{}
	result  Result // set before done closes

	warmed, resident, total, budget, yielded atomic.Int64
}

// hold adds ctx as a holder: when every holder's ctx has ended the warm
// stops and its key is free for a new one. Called under w.mu.
func (r *Run) hold(ctx context.Context) {
	r.holders++
	context.AfterFunc(ctx, func() {
		r.w.mu.Lock()
		defer r.w.mu.Unlock()
		r.holders--
		if r.holders == 0 {
			r.cancel()
			if r.w.runs[r.key] == r {
				delete(r.w.runs, r.key)
			}
		}
	})
}

// Key is the warm's key.
func (r *Run) Key() string { return r.key }

// Done is closed when the warm has ended.
func (r *Run) Done() <-chan struct{} { return r.done }

// Wait returns the warm's Result when it ends, or ctx's error first
// (the warm goes on while it has holders).
func (r *Run) Wait(ctx context.Context) (Result, error) {
	select {
	case <-r.done:
		return r.result, nil
	case <-ctx.Done():
		return r.Progress(), ctx.Err()
	}
}

// Progress is the warm's Result so far (the final one once Done).
func (r *Run) Progress() Result {
	select {
	case <-r.done:
		return r.result
	default:
	}
	return Result{Key: r.key, Warmed: r.warmed.Load(), Resident: r.resident.Load(), Total: r.total.Load(),
		Budget: r.budget.Load(), Elapsed: time.Since(r.start), Yielded: time.Duration(r.yielded.Load())}
}

// run plans and warms; it runs on its own locked thread.
func (r *Run) run(req Request) Result {
	res := Result{Key: r.key}
	fail := func(err error) Result {
		res.Reason, res.Err = Failed, err
		res.Elapsed = time.Since(r.start)
		return res
	}
	if err := idleThread(); err != nil {
		return fail(err)
	}
	dirfd, err := openTree(req.Dir)
	if err != nil {
		return fail(err)
	}
	defer unix.Close(dirfd)
	items, err := plan(dirfd, req.Dir)
	if err != nil {
		return fail(err)
	}
	res.Total = Total(items)
	r.total.Store(res.Total)
	if r.ctx.Err() != nil { // no budget taken for a warm already let go
		res.Reason, res.Elapsed = Cancelled, time.Since(r.start)
		return res
	}
	budget, err := r.w.reserve(res.Total)
	if err != nil {
		return fail(err)
	}
	res.Budget = budget
	r.budget.Store(budget)
	reason, err := r.warm(dirfd, req.Dir, items, budget)
	res.Warmed, res.Resident, res.Yielded = r.warmed.Load(), r.resident.Load(), time.Duration(r.yielded.Load())
	res.Elapsed = time.Since(r.start)
	if err != nil {
		return fail(err)
	}
	res.Reason = reason
	return res
}

// yield waits while other processes do I/O on the warm's device: more
// than yieldAbove bytes a second over the window just ended, then over
// each wait (yieldWindow, doubling up to yieldMax). It is false when
// r.ctx ended while it waited.
func (r *Run) yield(o *others, window time.Duration) bool {
	cfg := r.w.cfg
	wait := cfg.yieldWindow
	for float64(o.since()) > float64(cfg.yieldAbove)*window.Seconds() {
		start := time.Now()
		if !r.sleep(wait) {
			return false
		}
		window = time.Since(start)
		r.yielded.Add(int64(window))
		wait = min(2*wait, cfg.yieldMax)
	}
	return true
}

// sleep waits d; it is false when r.ctx ended first.
func (r *Run) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-r.ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
