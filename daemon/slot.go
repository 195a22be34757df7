package daemon

import (
	"context"
	"sync"
	"time"

	"github.com/modelcache/modelcache/fetchers"
)

// slot is one pull's share of the node's pull slots (cfg.MaxConcurrentPulls
// tokens in sem). The pull holds a token while any of its goroutines
// transfers and gives it back while all of them wait (for a retry's
// backoff, or for another pull's download of a shared blob): a source
// that stalls and is retried cannot keep a slot from the pulls queued
// behind it. Tokens are granted in the order they are asked for.
type slot struct {
	sem    chan struct{}
	take   sync.Mutex // one goroutine of the pull waits for a token at a time
	mu     sync.Mutex
	active int  // goroutines of the pull that count as transferring
	held   bool // the pull holds a token; held implies active > 0
	// waiting, when set, is called when the pull must wait for a token
	// (every slot is taken), and waited when it got one after waiting.
	waiting, waited func()
}

// enter counts one more goroutine of the pull as transferring and waits
// for a token when the pull holds none. Every enter is paired with one
// leave, also when enter fails because ctx ended (it then holds nothing).
func (s *slot) enter(ctx context.Context) error {
	s.take.Lock()
	defer s.take.Unlock()
	s.mu.Lock()
	s.active++
	held := s.held
	s.mu.Unlock()
	if held {
		return nil
	}
	select {
	case s.sem <- struct{}{}:
	default:
		if s.waiting != nil {
			s.waiting()
		}
		select {
		case s.sem <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		if s.waited != nil {
			s.waited()
		}
	}
	s.mu.Lock()
	s.held = true
	s.mu.Unlock()
	return nil
}

// add counts n more goroutines as transferring under the token the pull
// holds (workers started by a goroutine that has entered).
func (s *slot) add(n int) {
	s.mu.Lock()
	s.active += n
	s.mu.Unlock()
}

// leave ends one enter (or one of add's goroutines); the last to leave
// gives the token back.
func (s *slot) leave() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.active--
	if s.active == 0 && s.held {
		<-s.sem
		s.held = false
	}
}

// wait runs fn, a wait of one goroutine, with that goroutine not counted
// as transferring, and enters again after it.
func (s *slot) wait(ctx context.Context, fn func() error) error {
	s.leave()
	err := fn()
	if eerr := s.enter(ctx); err == nil {
		err = eerr
	}
	return err
}

// sleeper is a backoff Sleep that gives the slot up while it sleeps;
// inner is the sleep to wrap (nil: a timer).
func (s *slot) sleeper(inner func(context.Context, time.Duration) error) func(context.Context, time.Duration) error {
	if inner == nil {
		inner = fetchers.SleepCtx
	}
	return func(ctx context.Context, d time.Duration) error {
		return s.wait(ctx, func() error { return inner(ctx, d) })
	}
}
