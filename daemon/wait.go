package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/modelcache/modelcache/api"
)

func (vw views) handleWait(w http.ResponseWriter, r *http.Request) error {
	var timeout time.Duration
	if t := r.URL.Query().Get("timeout"); t != "" {
		var err error
		if timeout, err = time.ParseDuration(t); err != nil || timeout < 0 {
			return api.Errorf(api.CodeInvalid, "timeout %q: want a duration such as 10m", t)
		}
	}
	// A process waits for what it is about to load: warm it meanwhile.
	ready := func(a *api.Artifact) {
		if _, _, err := vw.warming.start(context.Background(), a.Name, a.Revision, warmCaller(r)); err != nil && err != errWarmOff {
			vw.log.Debug("not warming after wait", "artifact", a.Name, "revision", a.Revision, "err", err)
		}
	}
	var owed func(*api.Artifact) ([]string, []string)
	switch k := r.URL.Query().Get("kernelCaches"); k {
	case "", "wait":
		owed = func(a *api.Artifact) ([]string, []string) {
			vw.mu.Lock()
			want := vw.desires.merged()
			vw.mu.Unlock()
			return kernelCacheWait(a.Name, want, func(n string) (*api.Artifact, error) { return vw.view(n, false) })
		}
	case "skip":
	default:
		return api.Errorf(api.CodeInvalid, "kernelCaches %q: want wait or skip", k)
	}
	return vw.streamUntil(w, r, r.PathValue("name"), timeout, ready, owed, func(st *artState) (bool, error) { return st == nil || st.cancel == nil, nil })
}

// startStream answers r with a stream of JSON lines: it reads what is
// left of the body (a decoded request leaves at most a newline; the read
// timeout still bounds it), at whose end the server starts watching the
// connection for the client going away, and returns the lines' encoder,
// the flusher and a ticker of streamHeartbeat (the caller stops it).
func startStream(w http.ResponseWriter, r *http.Request) (*json.Encoder, *http.ResponseController, *time.Ticker) {
	io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20))
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	return json.NewEncoder(w), http.NewResponseController(w), time.NewTicker(streamHeartbeat)
}

// streamHeartbeat is the longest a stream goes without a line: a pending
// artifact is written again, so every stream keeps writing.
const streamHeartbeat = time.Second

// streamUntil writes the artifact as JSON lines on every change and every
// streamHeartbeat until it is Ready or Failed and done(state) holds, the
// timeout passes or the client goes. Each line renews the connection's
// write deadline (statusWriter), so a stream lives as long as its peer
// reads it; a peer that closes the connection cancels the request (the
// server watches the read side once the body is read), and a peer that
// stops reading fails a write SocketWriteTimeout after the socket's
// buffers fill. ready, when set, is called with the artifact when the
// stream ends Ready. owed, when set, is asked once the artifact is Ready
// what else it waits for (a model's kernel caches: kernelCacheWait): the
// stream goes on while that is pending, and its last line carries the
// notes.
func (vw views) streamUntil(w http.ResponseWriter, r *http.Request, name string, timeout time.Duration, ready func(*api.Artifact),
	owed func(*api.Artifact) (pending, notes []string), done func(*artState) (bool, error)) error {
	d := vw
	enc, rc, tick := startStream(w, r)
	defer tick.Stop()
	ctx := r.Context()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	for {
		d.mu.Lock()
		changed := d.changed
		fin, pullErr := done(d.arts[name])
		d.mu.Unlock()
		a, err := vw.view(name, false)
		if err != nil {
			var e *api.Error
			if !errors.As(err, &e) || e.Code != api.CodeNotFound {
				enc.Encode(api.Event{Error: toAPIError(err)})
				return nil
			}
			a = &api.Artifact{Name: name, Phase: api.PhasePending, Message: "not desired yet; waiting for a pull or a desire"}
		}
		settled := a.Phase == api.PhaseReady || a.Phase == api.PhaseFailed || a.Phase == api.PhaseIncompatible || a.Phase == api.PhaseEvicted
		if fin && pullErr != nil {
			msg := fmt.Sprintf("pull of %s failed: %v", name, pullErr)
			if a.Path != "" { // an older version is Ready
				msg += fmt.Sprintf(" (revision %s is still served)", a.Revision)
			}
			if a.Reason == "" { // its desire was dropped (dropFailedPull): the remedy still depends on why
				a.Reason = permanentReason(pullErr)
			}
			enc.Encode(api.Event{Artifact: a, Error: api.Errorf(api.CodeFailed, "%s", msg)})
			rc.Flush()
			return nil
		}
		var pending, notes []string
		if fin && settled && a.Phase == api.PhaseReady && owed != nil {
			pending, notes = owed(a)
		}
		if fin && settled && len(pending) == 0 {
			if err := settledErr(a); err != nil {
				enc.Encode(api.Event{Artifact: a, Error: toAPIError(err)})
			} else {
				if ready != nil && a.Phase == api.PhaseReady {
					ready(a)
				}
				enc.Encode(api.Event{Artifact: a, Done: true, Notes: notes})
			}
			rc.Flush()
			return nil
		}
		if len(pending) > 0 {
			notes = []string{"waiting for its kernel caches: " + strings.Join(pending, ", ")}
		}
		if err := enc.Encode(api.Event{Artifact: a, Notes: notes}); err != nil {
			return nil // the client went away
		}
		if err := rc.Flush(); err != nil {
			return nil // the client went away or stopped reading
		}
		select {
		case <-ctx.Done():
			if r.Context().Err() == nil {
				msg := fmt.Sprintf("artifact %s is still %s after %s", name, a.Phase, timeout)
				if len(pending) > 0 {
					msg = fmt.Sprintf("artifact %s is Ready but its kernel caches are not after %s: %s (modelctl wait --skip-kernel-caches does not wait for them)", name, timeout, strings.Join(pending, ", "))
				}
				enc.Encode(api.Event{Artifact: a, Error: api.Errorf(api.CodeTimeout, "%s", msg)})
			}
			return nil
		case <-changed:
		case <-tick.C:
		}
	}
}
