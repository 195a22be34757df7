package testenv

import (
	"fmt"
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
