package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/kernels"
	"github.com/modelcache/modelcache/fetchers"
)

// permanentReason is the reason for a failure a retry cannot fix, or "".
func permanentReason(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, fetchers.ErrNotFound):
		return api.ReasonSourceNotFound
	case errors.Is(err, fetchers.ErrUnauthorized):
		return api.ReasonAccessDenied
	case errors.Is(err, fetchers.ErrBadSource), errors.Is(err, fetchers.ErrUnsupported):
		return api.ReasonInvalidSource
	case errors.Is(err, errSourceChanged):
		return api.ReasonSourceChanged
	case errors.Is(err, cachestore.ErrDigestMismatch):
		return api.ReasonDigestMismatch
	case errors.Is(err, fetchers.ErrInconsistent):
		return api.ReasonSourceInconsistent
	}
	return ""
}

// unknownHostAttempts is how many pulls in a row DNS must deny a source's
// host before it counts as a typo (permanent): a resolver that is briefly
// down at boot answers "no such host" too, now and then.
const unknownHostAttempts = 3

// failureReason is permanentReason, plus a host DNS has denied for
// unknownHostAttempts pulls in a row (attempt counts this one).
func failureReason(err error, attempt int) string {
	if r := permanentReason(err); r != "" {
		return r
	}
	if fetchers.UnknownHost(err) && attempt >= unknownHostAttempts {
		return api.ReasonSourceNotFound
	}
	return ""
}

// finish records the pull's outcome in the artifact's state: Ready; back
// to Pending when it was cancelled (the daemon stops, the desire
// changed); Incompatible; Failed for good (failureReason: asking again the
// same way cannot help); or Failed and retried after the daemon's retry
// backoff (RetryInitial doubling to RetryMax, half jitter, a source's
// Retry-After honoured up to RetryMax: fetchers.Backoff.Delay).
func (p *pull) finish(ctx, pctx context.Context, err error) {
	d, ds, st, scheme := p.d, p.ds, p.st, p.src.scheme
	if err != nil {
		err = redactedError{err} // the message is shown (status, waiters, events) and stored
	}
	if err != nil && pctx.Err() == nil && !errors.As(err, new(*kernels.IncompatibleError)) {
		// A version that lost its blobs and cannot be re-fetched says why
		// (an index write: before the daemon lock, never under it).
		if a, gerr := d.store.Summary(ds.Name); gerr == nil && len(a.Versions) > 0 && a.Versions[0].State != cachestore.StateReady {
			d.store.SetState(ds.Name, a.Versions[0].Revision, cachestore.StateFailed, "re-fetch failed: "+err.Error())
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	st.cancel = nil
	close(st.done)
	st.completed++
	st.lastErr = nil // a failure sets it below; a cancelled or incompatible pull leaves the phase to speak
	switch {
	case err == nil:
		st.phase, st.message, st.attempts, st.reason = api.PhaseReady, "", 0, ""
		st.nextRetry = time.Time{}
		el := time.Since(p.prog.started).Seconds()
		st.last = &api.PullStats{Seconds: el, BytesFetched: p.prog.done.Load(), At: time.Now().UTC(),
			Unchanged: p.unchanged, BytesReused: p.prog.skipped.Load(), Evicted: p.evicted}
		p.prog.peerStats(st.last)
		if el > 0 {
			st.last.BytesPerSecond = float64(st.last.BytesFetched) / el
		}
		d.metrics.pulls.WithLabelValues(scheme, "ok").Inc()
		d.log.Info("pulled", "artifact", ds.Name, "uri", ds.URI)
	case pctx.Err() != nil && ctx.Err() != nil:
		st.phase, st.message = api.PhasePending, "daemon stopping; the pull resumes at the next start"
	case pctx.Err() != nil:
		st.phase, st.message = api.PhasePending, "restarting: the desire changed"
		d.kick()
	case errors.Is(err, errSourceChanged) && clusterDigestMoved(d.desires.cluster, ds):
		// The cluster's record moved while this pull ran (a forged
		// checksum dropped): pull again now, against the new record.
		st.attempts++
		st.phase, st.message, st.reason = api.PhaseFailed, err.Error(), api.ReasonSourceChanged
		st.nextRetry, st.lastErr = time.Time{}, err
		d.metrics.pulls.WithLabelValues(scheme, "failed").Inc()
		d.log.Warn("pull failed on a folder checksum the cluster no longer records; pulling again", "artifact", ds.Name, "err", err)
		d.kick()
	case failureReason(err, st.attempts+1) != "":
		st.attempts++
		st.phase, st.message, st.reason = api.PhaseFailed, err.Error(), failureReason(err, st.attempts)
		st.permanent, st.nextRetry, st.lastErr = true, time.Time{}, err
		d.metrics.pulls.WithLabelValues(scheme, "failed").Inc()
		d.log.Error("pull failed; not retried until the desire changes or 'modelctl pull' asks again ('modelctl evict NAME' drops the desire)",
			"artifact", ds.Name, "uri", ds.URI, "reason", st.reason, "err", err)
	case errors.As(err, new(*kernels.IncompatibleError)):
		st.phase, st.message, st.reason, st.attempts = api.PhaseIncompatible, err.Error(), api.ReasonIncompatible, 0
		d.metrics.pulls.WithLabelValues(scheme, "incompatible").Inc()
		d.log.Info("kernel cache incompatible with this node's GPUs; not downloaded", "artifact", ds.Name, "uri", ds.URI, "why", err)
	default:
		st.attempts++
		delay := retryBackoff(&d.cfg).Delay(st.attempts, err)
		st.phase, st.message, st.reason = api.PhaseFailed, err.Error(), retryReason(err)
		st.nextRetry = time.Now().Add(delay)
		st.lastErr = err
		d.metrics.pulls.WithLabelValues(scheme, "failed").Inc()
		d.log.Error("pull failed", "artifact", ds.Name, "uri", ds.URI, "attempt", st.attempts, "retry_in", delay.Round(time.Second), "err", err)
		d.kick()
	}
	d.notify()
	// An old revision may be free to go, or a partial download abandoned.
	d.space.kickPass()
}

// retryBackoff is the backoff between the attempts of one desire's pulls
// (each attempt retries its own requests with d.backoff first), as cfg
// sets it.
func retryBackoff(cfg *Config) fetchers.Backoff {
	return fetchers.Backoff{Initial: cfg.RetryInitial, Max: cfg.RetryMax, MaxRetryAfter: cfg.RetryMax}
}

// retryReason is the reason of a failure that is retried.
func retryReason(err error) string {
	switch {
	case errors.As(err, new(*capacityError)):
		return api.ReasonInsufficientCapacity
	case errors.As(err, new(*kernels.SignatureError)):
		return api.ReasonSignatureFailed
	}
	return api.ReasonPullFailed
}

// errSourceChanged: the files of a cluster desire do not hash to the
// folder checksum the cluster recorded (failure.go: ReasonSourceChanged).
var errSourceChanged = errors.New("source changed since the cluster resolved it")

// clusterDigestError says why a commit of a cluster desire failed its
// folder checksum in the cluster's words; other errors pass unchanged.
func clusterDigestError(ds api.Desire, m cachestore.Manifest, err error) error {
	if err == nil || !ds.ClusterDigest || !errors.Is(err, cachestore.ErrDigestMismatch) {
		return err
	}
	m = append(cachestore.Manifest(nil), m...)
	if m.Validate() != nil { // it sorts and normalizes as the commit did
		return err
	}
	return fmt.Errorf("%w: digest %s, cluster has %s (this node keeps what it serves; it pulls again when the cluster's record changes, "+
		"as the elected modelcached makes it when no two Ready nodes report that checksum)", errSourceChanged, m.Digest(), ds.Digest)
}
