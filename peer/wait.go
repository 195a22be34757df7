package peer

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// HeaderWait is the header of a GET or HEAD of a blob that asks the server
// to hold the request when it does not hold the blob yet: its value is
// whole seconds (0 or more; the server holds at most its WithMaxWait).
// A held request is answered as soon as the blob is here, committed or
// still being fetched (then its bytes are streamed as they land), and an
// upload slot is free (a node's children in a blob's tree wait their
// turn rather than ask around), and with a 404 when the wait ends
// without it (503 when the blob was there but no slot); 503 with Retry-After when
// the server holds WithMaxWaiting requests already or is shutting down.
// Without it, a blob not held is a 404 at once.
const HeaderWait = "X-Modelcache-Wait"

// find is the blob d for caller, with an upload slot taken (the caller
// of find gives it back): authorized (the Authorizer's answer, asked
// before the store: a blob the caller may not have is answered as one
// not held, so the answer tells nothing of what this node holds for
// others), then opened, committed or growing. When it is not here (or not
// given to the caller), or no upload slot is free, and the request may
// wait, it is held: the answer is looked for again each time the store
// says the blob may have become openable or a slot is given back, until
// the wait ends. A held request takes no upload
// slot and opens nothing while it waits.
func (s *Server) find(r *http.Request, caller Identity, d string, wait time.Duration) (content, *refusal) {
	var changed <-chan struct{}
	var deadline <-chan time.Time
	if wait > 0 {
		var stop func()
		changed, stop = s.blobs.WatchBlob(d) // before the first look: nothing lands unseen in between
		defer func() { stop() }()
		defer func() {
			if deadline != nil {
				<-s.waiting
				s.o.metrics.waited(-1)
			}
		}()
		for {
			freed := s.slotFreed() // before the look: a slot given back in between is seen
			c, no := s.look(r, caller, d)
			busy := no != nil && no.reason == RefusedBusy
			if no == nil || (no.status != http.StatusNotFound && !busy) {
				return c, no
			}
			if !busy {
				freed = nil // a nil channel never fires
			}
			if deadline == nil {
				select {
				case s.waiting <- struct{}{}:
					s.o.metrics.waited(1)
				default:
					return content{}, &refusal{reason: RefusedWaitFull, status: http.StatusServiceUnavailable, retry: true,
						why: fmt.Sprintf("%d requests held already; %s", s.o.maxWaiting, no.why)}
				}
				t := time.NewTimer(wait)
				defer t.Stop()
				deadline = t.C
			}
			select {
			case <-changed:
				stop()
				changed, stop = s.blobs.WatchBlob(d)
			case <-freed:
			case <-deadline:
				no.why += fmt.Sprintf(" (after waiting %s)", wait)
				return content{}, no
			case <-s.stopping:
				return content{}, &refusal{reason: RefusedBusy, status: http.StatusServiceUnavailable, retry: true, why: "shutting down; " + no.why}
			case <-r.Context().Done():
				return content{}, &refusal{reason: no.reason, status: no.status, why: no.why + " (the caller left while held)"}
			}
		}
	}
	return s.look(r, caller, d)
}

// release gives an upload slot back and wakes the requests held for one.
func (s *Server) release() {
	<-s.slots
	s.freedMu.Lock()
	close(s.freed)
	s.freed = make(chan struct{})
	s.freedMu.Unlock()
}

// slotFreed is closed when an upload slot is next given back.
func (s *Server) slotFreed() <-chan struct{} {
	s.freedMu.Lock()
	defer s.freedMu.Unlock()
	return s.freed
}

// waitOf is how long r may be held (HeaderWait, at most WithMaxWait): 0
// without the header.
func (s *Server) waitOf(h http.Header) (time.Duration, error) {
	vs := h.Values(HeaderWait)
	if len(vs) == 0 {
		return 0, nil
	}
	bad := func() (time.Duration, error) {
		return 0, fmt.Errorf("header %s %q: want one value, whole seconds, 0 or more (held at most %s)", HeaderWait, strings.Join(vs, ", "), s.o.maxWait)
	}
	if len(vs) > 1 || vs[0] == "" || strings.Trim(vs[0], "0123456789") != "" {
		return bad()
	}
	secs, err := strconv.ParseInt(vs[0], 10, 64)
	if err != nil || secs > int64(s.o.maxWait/time.Second) {
		return s.o.maxWait, nil // out of int64's range: only digits, so too many
	}
	return time.Duration(secs) * time.Second, nil
}

// Close ends the requests held waiting for a blob (503 with Retry-After:
// the caller asks elsewhere) and holds no more; transfers go on. Give it
// to http.Server.RegisterOnShutdown, so that held requests do not hold
// a shutdown back.
func (s *Server) Close() {
	s.stopOnce.Do(func() { close(s.stopping) })
}
