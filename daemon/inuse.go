package daemon

import (
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/capacity"
)

// apiLease is an explicit in-use hold taken through the API.
type apiLease struct {
	rev     string
	expires time.Time
}

// leaseSet is the explicit in-use holds taken through the API (modelctl
// lease): name → holder → lease, each dropped once it expires.
type leaseSet struct {
	store *cachestore.Store
	// changed wakes the daemon's waiters (it takes the daemon lock).
	changed func()
	// warm reads a leased revision into the page cache while the lease
	// lasts (leaseWarm).
	warm *warming

	mu sync.Mutex // guards m; taken after the daemon lock, nothing under it
	m  map[string]map[string]*apiLease
}

// uses adds the live leases to an in-use map and forgets expired ones.
func (l *leaseSet) uses(out map[string][]api.Holder) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	for name, ls := range l.m {
		for holder, x := range ls {
			if now.After(x.expires) {
				delete(ls, holder)
				continue
			}
			exp := x.expires
			k := capacity.Key(name, x.rev)
			out[k] = append(out[k], api.Holder{Kind: "lease", ID: holder, Revision: x.rev, Expires: &exp})
		}
	}
}

func appendHolder(hs []api.Holder, h api.Holder) []api.Holder {
	for _, x := range hs {
		if x.ID == h.ID && x.Revision == h.Revision {
			return hs
		}
	}
	return append(hs, h)
}

func splitKey(k string) (string, string) {
	for i := len(k) - 1; i >= 0; i-- {
		if k[i] == '@' {
			return k[:i], k[i+1:]
		}
	}
	return k, ""
}

// holdersOf lists what holds any version of name, sorted.
func holdersOf(all map[string][]api.Holder, name string) []api.Holder {
	var out []api.Holder
	for k, hs := range all {
		if n, _ := splitKey(k); n != name {
			continue
		}
		out = append(out, hs...)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Kind+out[i].ID < out[j].Kind+out[j].ID })
	return out
}

// maxLeaseTTL bounds a lease: a holder that dies stops protecting the
// artifact within this long.
const maxLeaseTTL = time.Hour

func (ls *leaseSet) handleLease(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("name")
	var req api.LeaseRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	ttl, err := time.ParseDuration(req.TTL)
	if err != nil || ttl <= 0 || ttl > maxLeaseTTL {
		return api.Errorf(api.CodeInvalid, "lease ttl %q: want a duration between 1s and %s, renewed before it ends", req.TTL, maxLeaseTTL)
	}
	if req.Holder == "" || len(req.Holder) > 253 {
		return api.Errorf(api.CodeInvalid, "lease holder %q: want a non-empty id of at most 253 bytes (a pod, a job, a host:pid)", req.Holder)
	}
	a, err := ls.store.Summary(name)
	if err != nil {
		return err
	}
	if len(a.Versions) == 0 || a.Versions[0].Revision != a.Current || a.Versions[0].State != cachestore.StateReady {
		return api.Errorf(api.CodeConflict, "artifact %s has no Ready version to lease; wait for it first (modelctl wait %s)", name, name)
	}
	ls.mu.Lock()
	byHolder := ls.m[name]
	if byHolder == nil {
		byHolder = map[string]*apiLease{}
		ls.m[name] = byHolder
	}
	l, ok := byHolder[req.Holder]
	if !ok || time.Now().After(l.expires) {
		l = &apiLease{rev: a.Current} // a renewal keeps the revision first leased
		byHolder[req.Holder] = l
	}
	l.expires = time.Now().Add(ttl)
	out := api.Lease{Name: name, Revision: l.rev, Holder: req.Holder, Expires: l.expires}
	ls.mu.Unlock()
	ls.changed()
	ls.store.Touch(name, out.Revision)
	ls.warm.hold(leaseWarm(name, req.Holder), ttl, name, out.Revision, warmCaller(r))
	return writeJSON(w, out)
}

// leaseWarm is the warm hold of holder's lease on name: it ends with the
// lease (released, or its TTL passed without a renewal).
func leaseWarm(name, holder string) string { return "lease:" + name + "/" + holder }

func (ls *leaseSet) handleRelease(w http.ResponseWriter, r *http.Request) error {
	name, holder := r.PathValue("name"), r.URL.Query().Get("holder")
	ls.mu.Lock()
	_, ok := ls.m[name][holder]
	delete(ls.m[name], holder)
	ls.mu.Unlock()
	if !ok {
		return api.Errorf(api.CodeNotFound, "artifact %s: no lease held by %q", name, holder)
	}
	ls.warm.let(leaseWarm(name, holder))
	ls.changed()
	return writeJSON(w, map[string]string{"released": holder})
}
