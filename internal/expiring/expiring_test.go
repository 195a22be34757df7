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

// A full map drops the least recently used entry: one asked for all the
// time stays however many new keys come.
func TestMapKeepsRecentlyUsed(t *testing.T) {
	var m Map[string, int]
	t0 := time.Unix(1000, 0)
	end := t0.Add(time.Hour)
	m.Put("hot", 1, end, t0, 3)
	m.Put("a", 2, end, t0, 3)
	m.Put("b", 3, end, t0, 3)
	for i := range 100 {
		if _, ok := m.Get("hot", t0); !ok {
			t.Fatalf("after %d new keys: the entry used before each was dropped", i)
		}
		m.Put(fmt.Sprint("new", i), i, end, t0, 3)
		if m.Len() > 3 {
			t.Fatalf("%d entries, more than 3", m.Len())
		}
	}
	if _, ok := m.Get("a", t0); ok {
		t.Error("a, never used again, outlived 100 new keys")
	}
	// Replacing a key makes it the most recently used.
	m.Put("x", 1, end, t0, 2)
	m.Put("y", 2, end, t0, 2)
	m.Put("x", 3, end, t0, 2)
	m.Put("z", 4, end, t0, 2)
	if v, ok := m.Get("x", t0); !ok || v != 3 {
		t.Errorf("x = %d %v after a newer key came; want 3, kept", v, ok)
	}
}
