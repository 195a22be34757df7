package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/csi"
	"github.com/modelcache/modelcache/daemon/capacity"
	"github.com/modelcache/modelcache/warm"
)

// warming reads a revision into the page cache ahead of the process
// about to load it (package warm), when a CSI volume is published, a
// lease is taken, modelctl wait returns Ready, or modelctl warm asks.
//
// Every warm runs for holds: a hold is a context the warm keeps running
// for (warm.Warmer.Start), here one of warming's own so that eviction can
// end it, bound to what caused it (a volume until it is unpublished, a
// lease until it ends, the daemon's life for wait and modelctl warm). A
// warm holds no lease and no lock of the store: what protects the
// revision from eviction is the hold that caused it (the volume, the
// lease), and an eviction cancels its warms (evicted).
type warming struct {
	w     *warm.Warmer // nil: --warm=false
	store *cachestore.Store
	log   *slog.Logger

	mu    sync.Mutex // guards holds and named; a leaf: nothing is taken under it
	holds map[*warmHold]bool
	named map[string]*warmHold // holds with an id ("csi:<volume>", "lease:…"), for let
}

// warmHold is one context a warm runs for.
type warmHold struct {
	id, key string
	cancel  context.CancelFunc
	timer   *time.Timer // ends a hold with a lifetime (a lease's TTL); nil: none
}

// newWarming makes the component; with cfg.Warm off it warms nothing and
// says so. Its metrics go to the daemon's (reg).
func newWarming(cfg Config, st *cachestore.Store, log *slog.Logger, reg *metrics) (*warming, error) {
	wm := &warming{store: st, log: log.With("component", "warm"), holds: map[*warmHold]bool{}, named: map[string]*warmHold{}}
	m := warm.NewMetrics()
	reg.register(m.Collectors()...) // the series exist (at zero) with warming off too
	if !cfg.Warm {
		return wm, nil
	}
	opts := []warm.Option{warm.WithShare(cfg.WarmShare), warm.WithLimit(cfg.WarmLimit), warm.WithMetrics(m), warm.WithLogger(wm.log)}
	if cfg.Hook != nil {
		hook := cfg.Hook
		opts = append(opts, warm.WithChunkHook(func(string) { hook("warm.chunk") }))
	}
	w, err := warm.New(opts...)
	if err != nil {
		return nil, err
	}
	wm.w = w
	return wm, nil
}

// close ends every warm and waits for them (Run's shutdown).
func (wm *warming) close() {
	if wm.w != nil {
		wm.w.Close()
	}
}

// errWarmOff answers a warm asked of a node with --warm=false.
var errWarmOff = api.Errorf(api.CodeConflict, "warming is off on this node (modelcached --warm=false)")

// start warms name@rev for caller while ctx lasts (it is the hold: the
// warm goes on after the call returns, until it ends or every hold has),
// or joins the warm of it that runs. A revision that is not Ready is
// refused (CodeConflict); a caller over its rate is CodeRateLimited.
func (wm *warming) start(ctx context.Context, name, rev, caller string) (*warm.Run, bool, error) {
	return wm.begin(ctx, "", 0, name, rev, caller)
}

// hold warms name@rev for the hold id (a volume, a lease) until let(id)
// or, when ttl > 0, ttl from the last call: a second call for an id that
// holds a running warm renews it rather than starting another. Errors
// are logged: a warm is a help to the pod, never a condition of its hold.
func (wm *warming) hold(id string, ttl time.Duration, name, rev, caller string) {
	wm.mu.Lock()
	h := wm.named[id]
	if h != nil && h.timer != nil {
		h.timer.Reset(ttl)
	}
	wm.mu.Unlock()
	if h != nil {
		return
	}
	if _, _, err := wm.begin(context.Background(), id, ttl, name, rev, caller); err != nil && err != errWarmOff {
		wm.log.Info("not warming", "artifact", name, "revision", rev, "for", id, "err", err)
	}
}

// volume warms what a CSI volume just published holds, for as long as
// it is published, unless its attribute warm is "false".
func (wm *warming) volume(v csi.Volume) {
	if v.Warm != "false" {
		wm.hold(csiHoldKey(v.ID), 0, v.Model, v.Revision, "csi:"+v.PodNamespace)
	}
}

// let ends the hold id (the volume unpublished, the lease released).
func (wm *warming) let(id string) {
	wm.mu.Lock()
	h := wm.named[id]
	wm.mu.Unlock()
	if h != nil {
		h.cancel()
	}
}

// evicted ends every hold on the versions of name that an eviction
// removed, and so their warms.
func (wm *warming) evicted(name string, revs ...string) {
	keys := map[string]bool{}
	for _, r := range revs {
		keys[capacity.Key(name, r)] = true
	}
	wm.mu.Lock()
	var ends []context.CancelFunc
	for h := range wm.holds {
		if keys[h.key] {
			ends = append(ends, h.cancel)
		}
	}
	wm.mu.Unlock()
	for _, end := range ends {
		end()
	}
}

// begin is start and hold: the one place a warm starts.
func (wm *warming) begin(parent context.Context, id string, ttl time.Duration, name, rev, caller string) (*warm.Run, bool, error) {
	if wm.w == nil {
		return nil, false, errWarmOff
	}
	v, ok := readyVersion(wm.store, name, rev)
	if !ok {
		return nil, false, api.Errorf(api.CodeConflict, "artifact %s@%s is not Ready on this node: only a Ready revision is warmed (modelctl wait %s)", name, rev, name)
	}
	ctx, cancel := context.WithCancel(parent)
	h := &warmHold{id: id, key: capacity.Key(name, rev), cancel: cancel}
	wm.mu.Lock()
	if ttl > 0 {
		h.timer = time.AfterFunc(ttl, cancel)
	}
	wm.holds[h] = true
	if id != "" {
		if old := wm.named[id]; old != nil {
			old.cancel()
		}
		wm.named[id] = h
	}
	wm.mu.Unlock()
	run, joined, err := wm.w.Start(ctx, warm.Request{Key: h.key, Dir: wm.store.TreePath(v.Kind, name, rev), Caller: caller, Unlimited: caller == "uid:0"})
	if err != nil {
		wm.drop(h)
		if errors.Is(err, warm.ErrRateLimited) {
			return nil, false, api.Errorf(api.CodeRateLimited, "%v; try again later, or join a running warm of the same revision", err)
		}
		if errors.Is(err, warm.ErrClosed) {
			return nil, false, api.Errorf(api.CodeUnavailable, "%v: the daemon is stopping", err)
		}
		return nil, false, err
	}
	go func() { // the hold goes with the warm, or before it
		select {
		case <-run.Done():
		case <-ctx.Done():
		}
		wm.drop(h)
	}()
	return run, joined, nil
}

// drop forgets h and ends its context.
func (wm *warming) drop(h *warmHold) {
	wm.mu.Lock()
	delete(wm.holds, h)
	if wm.named[h.id] == h {
		delete(wm.named, h.id)
	}
	if h.timer != nil {
		h.timer.Stop()
	}
	wm.mu.Unlock()
	h.cancel()
}

// resident is how much of name@rev's tree is in the page cache; nil when
// it cannot be read (logged at debug: inspect shows the rest).
func (wm *warming) resident(kind, name, rev string) *api.Residency {
	n, total, err := warm.Resident(wm.store.TreePath(kind, name, rev))
	if err != nil {
		wm.log.Debug("residency", "artifact", name, "revision", rev, "err", err)
		return nil
	}
	return &api.Residency{Bytes: n, Total: total}
}

// warmCaller is who a socket request warms as, for the rate limit.
func warmCaller(r *http.Request) string {
	if p := peerOf(r); p != nil {
		return "uid:" + strconv.FormatUint(uint64(p.Uid), 10)
	}
	return "uid:unknown"
}

// handleWarm is POST /v1/artifacts/{name}/warm: warm the current
// revision for the daemon's life (until it ends, an eviction, or
// shutdown); with ?wait=true stream its progress, one WarmResult a
// second, until the line with its Reason.
func (wm *warming) handleWarm(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	wait := false
	if q := r.URL.Query().Get("wait"); q != "" {
		var err error
		if wait, err = strconv.ParseBool(q); err != nil {
			return api.Errorf(api.CodeInvalid, "wait=%q: want true or false", q)
		}
	}
	a, err := wm.store.Summary(name)
	if err != nil {
		return err
	}
	if a.Current == "" {
		return api.Errorf(api.CodeConflict, "artifact %s has no Ready revision to warm; wait for it first (modelctl wait %s)", name, name)
	}
	run, joined, err := wm.start(context.Background(), name, a.Current, warmCaller(r))
	if err != nil {
		return err
	}
	if !wait {
		return writeJSON(w, warmResult(name, a.Current, joined, run.Progress()))
	}
	enc, rc, tick := startStream(w, r)
	defer tick.Stop()
	for {
		select {
		case <-run.Done():
			res, _ := run.Wait(r.Context())
			enc.Encode(warmResult(name, a.Current, joined, res))
			rc.Flush()
			return nil
		case <-r.Context().Done():
			return nil // the client went; the warm goes on
		case <-tick.C:
			if enc.Encode(warmResult(name, a.Current, joined, run.Progress())) != nil || rc.Flush() != nil {
				return nil
			}
		}
	}
}

// warmResult is the wire form of a warm's result, saying why it ended.
func warmResult(name, rev string, joined bool, res warm.Result) api.WarmResult {
	out := api.WarmResult{Name: name, Revision: rev, Joined: joined, Reason: string(res.Reason),
		WarmedBytes: res.Warmed, ResidentBytes: res.Resident, TotalBytes: res.Total, BudgetBytes: res.Budget, Seconds: res.Elapsed.Seconds()}
	of := fmt.Sprintf("%s of %s", api.FormatBytes(res.Warmed+res.Resident), api.FormatBytes(res.Total))
	switch res.Reason {
	case warm.Done:
		out.Message = "resident: " + of + " in the page cache"
	case warm.BudgetSpent:
		out.Message = fmt.Sprintf("budget spent: read %s, the memory budget (--warm-share, --warm-limit); %s in the page cache", api.FormatBytes(res.Budget), of)
	case warm.Overtaken:
		out.Message = "overtaken: the consumer's own reads got ahead of the warm; " + of + " in the page cache when it stopped"
	case warm.Cancelled:
		out.Message = "cancelled: every hold that asked for it ended (volume unpublished, lease ended, revision evicted, daemon stopping); " + of + " in the page cache"
	case warm.Failed:
		out.Message = fmt.Sprintf("failed: %v", res.Err)
	}
	return out
}
