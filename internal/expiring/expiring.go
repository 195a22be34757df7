// Package expiring is a map whose entries last until a time, bounded in
// size: the caches of what the peer port learns from the API server
// (peer's TokenReview verdicts, k8ssync's Nodes and ModelCaches read for
// the peer authorizer). An entry dropped early costs only a new
// question, so a full map drops the least recently used entry (an
// expired one is dropped when it is next asked for): a flood of new keys
// pushes out what nobody asks for, never what is asked for all the time.
package expiring

import (
	"container/list"
	"sync"
	"time"
)

// Map is the bounded map of K to V, each entry until its end, least
// recently used first out. The zero value is ready; safe for concurrent
// use.
type Map[K comparable, V any] struct {
	mu  sync.Mutex
	m   map[K]*list.Element // of *entry[K, V]
	lru list.List           // front: the most recently used
}

type entry[K comparable, V any] struct {
	k     K
	v     V
	until time.Time
}

// Get is k's value while now is before its end; a hit makes k the most
// recently used, an expired entry is dropped.
func (m *Map[K, V]) Get(k K, now time.Time) (V, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	el, ok := m.m[k]
	if !ok {
		var zero V
		return zero, false
	}
	e := el.Value.(*entry[K, V])
	if !now.Before(e.until) {
		m.lru.Remove(el)
		delete(m.m, k)
		var zero V
		return zero, false
	}
	m.lru.MoveToFront(el)
	return e.v, true
}

// Put stores v for k until until, as the most recently used. When the
// map already holds max entries (max at least 1) and k is new, it first
// drops the least recently used ones, those past their end at now first
// among the few it looks at.
func (m *Map[K, V]) Put(k K, v V, until, now time.Time, max int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = map[K]*list.Element{}
	}
	if el, ok := m.m[k]; ok {
		el.Value = &entry[K, V]{k, v, until}
		m.lru.MoveToFront(el)
		return
	}
	if len(m.m) >= max {
		// Expired entries near the back go first; then the back itself.
		el := m.lru.Back()
		for i := 0; i < 8 && el != nil && len(m.m) >= max; i++ {
			prev := el.Prev()
			if e := el.Value.(*entry[K, V]); !now.Before(e.until) {
				m.lru.Remove(el)
				delete(m.m, e.k)
			}
			el = prev
		}
		for len(m.m) >= max && m.lru.Len() > 0 {
			back := m.lru.Back()
			m.lru.Remove(back)
			delete(m.m, back.Value.(*entry[K, V]).k)
		}
	}
	m.m[k] = m.lru.PushFront(&entry[K, V]{k, v, until})
}

// Len is how many entries the map holds, expired ones included.
func (m *Map[K, V]) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.m)
}
