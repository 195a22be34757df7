package api

import (
	"context"
	"errors"
	"syscall"
	"time"
)

// Outage is told when the daemon goes away and comes back while a caller
// rides it out (WaitFollow, PullFollow): a restart, a DaemonSet rollout,
// a daemon that is not up yet. Either func may be nil.
type Outage struct {
	// Lost is called once per outage with the error that showed it;
	// answered says whether the daemon had answered this caller before
	// (a restart) or never had (not up yet, or the wrong socket).
	Lost func(err error, answered bool)
	// Back is called when the daemon answers again, with how long it was
	// away.
	Back func(away time.Duration)
}

// Lost reports whether err says the daemon could not be reached or the
// connection to it closed (an *UnavailableError), as opposed to an answer
// or a socket this user may not open (EACCES, EPERM: waiting cannot fix
// that).
func Lost(err error) bool {
	var ue *UnavailableError
	return errors.As(err, &ue) && !errors.Is(ue.Err, syscall.EACCES) && !errors.Is(ue.Err, syscall.EPERM)
}

// reconnectPause is the longest pause between tries to reach a daemon
// that went away.
const reconnectPause = 2 * time.Second

// AwaitDaemon tries the socket until the daemon answers (nil), timeout
// passes (the last *UnavailableError; 0: no limit) or ctx ends (its
// error), with pauses growing to 2 s.
func (c *Client) AwaitDaemon(ctx context.Context, timeout time.Duration) error {
	var deadline time.Time
	if timeout > 0 {
		deadline = time.Now().Add(timeout)
	}
	return c.awaitDaemon(ctx, deadline)
}

// awaitDaemon tries the socket, with pauses growing to reconnectPause,
// until the daemon answers (nil), ctx ends (its error) or deadline passes
// (the last *UnavailableError). A zero deadline waits for ever.
func (c *Client) awaitDaemon(ctx context.Context, deadline time.Time) error {
	pause := 50 * time.Millisecond
	for {
		err := c.Health(ctx)
		var ue *UnavailableError
		if err == nil || !errors.As(err, &ue) {
			return ctx.Err() // an answer, even an error, means it is back
		}
		if !Lost(err) {
			return err // a socket this user may not open
		}
		wait := pause
		if !deadline.IsZero() {
			left := time.Until(deadline)
			if left <= 0 {
				return err
			}
			wait = min(wait, left)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		pause = min(2*pause, reconnectPause)
	}
}

// WaitFollow is Wait that rides out the daemon going away: when the
// socket cannot be reached, or the stream closes before the artifact
// settled, it tells o, tries the socket again until the daemon answers,
// and waits again for what is left of timeout (0: no limit). It fails
// only when the artifact fails (CodeFailed, or the daemon's answer), when
// timeout passes (an *Error with CodeTimeout, saying whether the daemon
// was away) or when ctx ends. w.Timeout is the timeout; w's other
// options go with every wait it sends.
func (c *Client) WaitFollow(ctx context.Context, name string, w WaitOptions, fn func(Event), o Outage) (*Artifact, error) {
	var deadline time.Time
	if w.Timeout > 0 {
		deadline = time.Now().Add(w.Timeout)
	}
	return c.follow(ctx, name, deadline, w, false, fn, o)
}

// PullFollow is Pull with wait that rides out the daemon going away once
// it has taken the desire (the daemon resumes the pull when it is back):
// it follows the pull as WaitFollow does, with no time limit. A daemon
// that cannot be reached before it took the request is an error, as Pull.
func (c *Client) PullFollow(ctx context.Context, req PullRequest, fn func(Event), o Outage) (*Artifact, error) {
	a, err := c.Pull(ctx, req, true, fn)
	return c.rideOut(ctx, req.Name, a, err, fn, o)
}

// RetryFollow is Retry with wait that rides out the daemon going away
// once it took the retry, as PullFollow does.
func (c *Client) RetryFollow(ctx context.Context, name string, fn func(Event), o Outage) (*Artifact, error) {
	a, err := c.Retry(ctx, name, true, fn)
	return c.rideOut(ctx, name, a, err, fn, o)
}

// rideOut follows name once a stream the daemon had accepted was lost.
func (c *Client) rideOut(ctx context.Context, name string, a *Artifact, err error, fn func(Event), o Outage) (*Artifact, error) {
	var ue *UnavailableError
	if !errors.As(err, &ue) || !ue.Accepted {
		return a, err
	}
	if o.Lost != nil {
		o.Lost(err, true)
	}
	b, err := c.follow(ctx, name, time.Time{}, WaitOptions{}, true, fn, o)
	if b == nil {
		b = a
	}
	return b, err
}

func (c *Client) follow(ctx context.Context, name string, deadline time.Time, w WaitOptions, lost bool, fn func(Event), o Outage) (*Artifact, error) {
	timeout := w.Timeout
	var last *Artifact
	answered := lost
	for {
		if lost {
			since := time.Now()
			if err := c.awaitDaemon(ctx, deadline); err != nil {
				if ctx.Err() != nil || !Lost(err) {
					return last, err
				}
				return last, Errorf(CodeTimeout, "%s: not settled after %s: modelcached has not answered for the last %s (%v)",
					name, timeout, time.Since(since).Round(time.Second), err)
			}
			if o.Back != nil {
				o.Back(time.Since(since))
			}
			answered = true
		}
		var left time.Duration
		if !deadline.IsZero() {
			if left = time.Until(deadline); left <= 0 {
				phase := "not settled"
				if last != nil {
					phase = "still " + string(last.Phase)
				}
				return last, Errorf(CodeTimeout, "artifact %s is %s after %s", name, phase, timeout)
			}
		}
		w.Timeout = left
		a, err := c.WaitWith(ctx, name, w, fn)
		if a != nil {
			last = a
		}
		var ue *UnavailableError
		if !Lost(err) || !errors.As(err, &ue) || ctx.Err() != nil {
			if errors.Is(err, ErrTimeout) && last != nil && lost {
				// The daemon counted only the time since it came back.
				err = Errorf(CodeTimeout, "artifact %s is still %s after %s (modelcached restarted meanwhile)", name, last.Phase, timeout)
			}
			return last, err
		}
		if o.Lost != nil {
			o.Lost(err, answered || ue.Accepted)
		}
		lost = true
	}
}
