package expiring

import (
	"fmt"
	"testing"
	"time"
)

func TestMapExpiresAndStaysBounded(t *testing.T) {
	var m Map[string, int]
	t0 := time.Unix(1000, 0)
	m.Put("a", 1, t0.Add(time.Minute), t0, 3)
	if v, ok := m.Get("a", t0.Add(59*time.Second)); !ok || v != 1 {
		t.Errorf("before its end: %d %v", v, ok)
	}
	if _, ok := m.Get("a", t0.Add(time.Minute)); ok {
		t.Error("at its end: still there")
	}
	// Full: the expired entry goes first, the fresh ones stay.
	m.Put("b", 2, t0.Add(time.Hour), t0, 3)
	m.Put("c", 3, t0.Add(time.Hour), t0, 3)
	m.Put("d", 4, t0.Add(time.Hour), t0.Add(2*time.Minute), 3)
	if m.Len() != 3 {
		t.Errorf("%d entries, want 3", m.Len())
	}
	for _, k := range []string{"b", "c", "d"} {
		if _, ok := m.Get(k, t0.Add(2*time.Minute)); !ok {
			t.Errorf("%s dropped while an expired entry was there to drop", k)
		}
	}
	// Replacing a key never drops another.
	m.Put("d", 5, t0.Add(time.Hour), t0, 3)
	if v, _ := m.Get("d", t0); v != 5 || m.Len() != 3 {
		t.Errorf("d = %d with %d entries", v, m.Len())
	}
	for i := range 10 {
		m.Put(fmt.Sprint(i), i, t0.Add(time.Hour), t0, 3)
		if m.Len() > 3 {
			t.Fatalf("%d entries, more than 3", m.Len())
		}
	}
}
