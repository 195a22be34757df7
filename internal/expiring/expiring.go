// Package expiring is a map whose entries last until a time, bounded in
// size: the caches of what the peer port learns from the API server
// (peer's TokenReview verdicts, k8ssync's Nodes and ModelCaches read for
// the peer authorizer). An entry dropped early costs only a new
// question, so a full map drops what has expired, then arbitrary
// entries.
package expiring

import (
	"sync"
	"time"
)

// Map is the bounded map of K to V, each entry until its end. The zero
// value is ready; safe for concurrent use.
type Map[K comparable, V any] struct {
	mu sync.Mutex
	m  map[K]entry[V]
}

type entry[V any] struct {
	v     V
	until time.Time
}

// Get is k's value while now is before its end.
func (m *Map[K, V]) Get(k K, now time.Time) (V, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.m[k]
	if !ok || !now.Before(e.until) {
		var zero V
		return zero, false
	}
	return e.v, true
}

// Put stores v for k until until. When the map already holds max entries
// (max at least 1), it first drops those past their end at now, then,
// if still full, arbitrary ones.
func (m *Map[K, V]) Put(k K, v V, until, now time.Time, max int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = map[K]entry[V]{}
	}
	if _, ok := m.m[k]; !ok && len(m.m) >= max {
		for key, e := range m.m {
			if !now.Before(e.until) {
				delete(m.m, key)
			}
		}
		for key := range m.m {
			if len(m.m) < max {
				break
			}
			delete(m.m, key)
		}
	}
	m.m[k] = entry[V]{v, until}
}

// Len is how many entries the map holds, expired ones included.
func (m *Map[K, V]) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.m)
}
