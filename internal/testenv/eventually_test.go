package testenv

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestPollReturnsOnceTheConditionHolds(t *testing.T) {
	calls := 0
	err := Poll(10*time.Second, func() error {
		if calls++; calls < 3 {
			return fmt.Errorf("call %d", calls)
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("Poll: %v after %d calls, want nil after 3", err, calls)
	}
}

func TestPollGivesTheLastErrorAtTheDeadline(t *testing.T) {
	calls := 0
	start := time.Now()
	err := Poll(50*time.Millisecond, func() error { calls++; return fmt.Errorf("call %d", calls) })
	if err == nil || err.Error() != fmt.Sprintf("call %d", calls) {
		t.Fatalf("Poll: %v after %d calls, want the last call's error", err, calls)
	}
	if d := time.Since(start); d < 50*time.Millisecond || d > 5*time.Second {
		t.Fatalf("Poll gave up after %v, want just past 50ms", d)
	}
}

func TestAwaitChecksAtEachChange(t *testing.T) {
	var mu sync.Mutex
	ch, n := make(chan struct{}), 0
	changed := func() <-chan struct{} { mu.Lock(); defer mu.Unlock(); return ch }
	go func() {
		for i := 0; i < 3; i++ {
			mu.Lock()
			n++
			close(ch)
			ch = make(chan struct{})
			mu.Unlock()
		}
	}()
	checks := 0
	Await(t, "three changes", 10*time.Second, changed, func() error {
		checks++
		mu.Lock()
		defer mu.Unlock()
		if n < 3 {
			return fmt.Errorf("%d changes", n)
		}
		return nil
	})
	if checks > 4 {
		t.Fatalf("cond checked %d times for 3 changes: Await polls", checks)
	}
}

func TestProgressingWaitsWhileTheCountGrows(t *testing.T) {
	var n int64
	start := time.Now()
	err := pollProgressing(100*time.Millisecond, func() (int64, error) {
		if time.Since(start) < 300*time.Millisecond {
			n++ // grows at every call: no stall, though past the stall time in all
			return n, fmt.Errorf("at %d", n)
		}
		return n, nil
	})
	if err != nil {
		t.Fatalf("a count that grew until the condition held: %v", err)
	}
}

func TestProgressingFailsAtAStall(t *testing.T) {
	err := pollProgressing(50*time.Millisecond, func() (int64, error) { return 7, fmt.Errorf("stuck") })
	if err == nil || !strings.Contains(err.Error(), "no progress") || !strings.Contains(err.Error(), "at 7") || !strings.Contains(err.Error(), "stuck") {
		t.Fatalf("a count that never grows: %v, want a stall at 7 with the last error", err)
	}
}
