package k8ssync

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"
)

// secretWatches are the watches of the Secrets that selected ModelCaches
// name (spec.secretRef), one per Secret: a list and a watch in the
// Secret's namespace with the field selector metadata.name=<name>, so
// the node reads no other Secret, sends no periodic GET, and a changed
// Secret (a rotated HF_TOKEN) reaches the fetchers at the next pass. A
// watch starts when a ModelCache first names its Secret and stops when
// none does any more. RBAC: list and watch of secrets; the requests carry
// the name, so a Role may narrow them with resourceNames.
type secretWatches struct {
	mu sync.Mutex
	w  map[string]*secretWatch // namespace/name →
}

type secretWatch struct {
	store  cache.Store
	synced cache.InformerSynced
	stop   context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	err    error  // the last list/watch error, until the watch works again
	said   string // the problem last logged ("" once it worked)
}

// secretSyncWait bounds how long the pass that first names a Secret waits
// for its watch's first list (the credentials of that pass's pulls).
const secretSyncWait = 10 * time.Second

// secret is the data of the Secret ns/name, from its watch (started on
// the first call). While the watch cannot list it (RBAC, the API server
// away) the last data it had stays; err says why there is none or why it
// may be stale.
func (s *Syncer) secret(ctx context.Context, ns, name string) (map[string]string, error) {
	key := ns + "/" + name
	s.secrets.mu.Lock()
	if s.secrets.w == nil {
		s.secrets.w = map[string]*secretWatch{}
	}
	w, ok := s.secrets.w[key]
	if !ok {
		w = s.watchSecret(ns, name)
		s.secrets.w[key] = w
	}
	s.secrets.mu.Unlock()
	if !ok {
		wctx, cancel := context.WithTimeout(ctx, secretSyncWait)
		cache.WaitForCacheSync(wctx.Done(), w.synced)
		cancel()
	}
	w.mu.Lock()
	err := w.err
	w.mu.Unlock()
	obj, found, _ := w.store.GetByKey(key)
	if !found {
		if err == nil && !w.synced() {
			err = fmt.Errorf("not listed yet")
		} else if err == nil {
			err = fmt.Errorf("secret %q not found in namespace %q", name, ns)
		}
		return nil, err
	}
	sec, ok := obj.(*corev1.Secret)
	if !ok {
		return nil, fmt.Errorf("not a Secret: %T", obj)
	}
	data := make(map[string]string, len(sec.Data))
	for k, v := range sec.Data {
		data[k] = string(v)
	}
	return data, err
}

// watchSecret starts the watch of one Secret; a change pokes the loop.
func (s *Syncer) watchSecret(ns, name string) *secretWatch {
	inf := newInformer(s.core.Secrets(ns), &corev1.Secret{}, 0, fields.OneTermEqualSelector("metadata.name", name).String())
	w := &secretWatch{store: inf.GetStore(), synced: inf.HasSynced, done: make(chan struct{})}
	inf.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
		w.mu.Lock()
		first := w.err == nil
		w.err = err
		w.mu.Unlock()
		if first {
			s.log.Warn("k8s sync: watching a ModelCache's Secret (retrying with backoff; list and watch of secrets, for this name, are needed)", "secret", ns+"/"+name, "err", err)
		}
		cache.DefaultWatchErrorHandler(ctx, r, err)
	})
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { w.ok(); s.poke() },
		UpdateFunc: func(any, any) { w.ok(); s.poke() },
		DeleteFunc: func(any) { s.poke() },
	})
	// The watch lives until keepSecrets stops it (Run does as it ends), not
	// with the pass or the leadership that first named the Secret.
	wctx, cancel := context.WithCancel(context.Background())
	w.stop = cancel
	go func() {
		defer close(w.done)
		inf.Run(wctx.Done())
	}()
	return w
}

func (w *secretWatch) ok() {
	w.mu.Lock()
	w.err = nil
	w.mu.Unlock()
}

// keepSecrets stops the watches of the Secrets that no selected
// ModelCache names any more (used: namespace/name). The elected daemon
// resolves every ModelCache's sources with its Secret, so while it leads
// it keeps the watches of the Secrets that any of all names.
func (s *Syncer) keepSecrets(used map[string]bool, all []*ModelCache) {
	s.mu.Lock()
	leading := s.leading
	s.mu.Unlock()
	if leading {
		for _, mc := range all {
			if u, ok := s.credentialsOf(mc); ok && u.refused == "" {
				used[u.key()] = true
			}
		}
	}
	s.secrets.mu.Lock()
	defer s.secrets.mu.Unlock()
	for key, w := range s.secrets.w {
		if !used[key] {
			w.stop()
			delete(s.secrets.w, key)
		}
	}
}

// changed says whether err (nil: the Secret was read) differs from what
// was last said of the Secret key: its problem is logged once per change,
// not on every pass.
func (sw *secretWatches) changed(key string, err error) bool {
	sw.mu.Lock()
	w, ok := sw.w[key]
	sw.mu.Unlock()
	if !ok {
		return err != nil
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if msg == w.said {
		return false
	}
	w.said = msg
	return true
}
