package k8ssync

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/cache"
)

// A quiet API footprint: at steady state a node sends only what changes
// (its status, Events) plus, per informer, one watch request every one to
// two hours (longWatch), a status heartbeat an hour (Config.Heartbeat),
// and the leader's Lease renewal once a minute; candidates read the Lease
// from a watch (leaseLock).

// longWatch makes an informer's watch requests last one to two hours
// (client-go asks for five to ten minutes): each renewal is a request,
// and a watch that breaks earlier is re-established at once anyway. The
// jitter spreads the renewals of many nodes.
func longWatch(o *metav1.ListOptions) {
	if o.TimeoutSeconds == nil { // a list, not a watch
		return
	}
	t := int64(3600 + rand.IntN(3600))
	o.TimeoutSeconds = &t
}

// listWatcher is a typed or dynamic client of one resource (a
// PodInterface, a NamespaceableResourceInterface, …).
type listWatcher[L runtime.Object] interface {
	List(context.Context, metav1.ListOptions) (L, error)
	Watch(context.Context, metav1.ListOptions) (watch.Interface, error)
}

// newInformer watches the objects of c (of obj's type) that the field
// selector sel names ("" all), with long watches; Run starts it. It is
// the informer that client-go's informer factories make for one type,
// without a factory: the typed factory (k8s.io/client-go/informers) links
// an informer and a lister for every built-in API group, and the dynamic
// one links the typed one.
func newInformer[L runtime.Object](c listWatcher[L], obj runtime.Object, resync time.Duration, sel string) cache.SharedIndexInformer {
	tweak := func(o *metav1.ListOptions) {
		if sel != "" {
			o.FieldSelector = sel
		}
		longWatch(o)
	}
	return cache.NewSharedIndexInformerWithOptions(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			tweak(&o)
			return c.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			tweak(&o)
			return c.Watch(ctx, o)
		},
	}, obj, cache.SharedIndexInformerOptions{ResyncPeriod: resync, Indexers: cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}})
}

// leaseRecord is a Lease's spec as leader election reads and writes it:
// client-go's resourcelock.LeaderElectionRecord, with the same JSON (that
// package links the clientset of every built-in API group, for
// NewFromKubeconfig).
type leaseRecord struct {
	HolderIdentity       string                                  `json:"holderIdentity"`
	LeaseDurationSeconds int                                     `json:"leaseDurationSeconds"`
	AcquireTime          metav1.Time                             `json:"acquireTime"`
	RenewTime            metav1.Time                             `json:"renewTime"`
	LeaderTransitions    int                                     `json:"leaderTransitions"`
	Strategy             coordinationv1.CoordinatedLeaseStrategy `json:"strategy"`
	PreferredHolder      string                                  `json:"preferredHolder"`
}

func leaseSpecToRecord(spec *coordinationv1.LeaseSpec) *leaseRecord {
	var r leaseRecord
	if spec.HolderIdentity != nil {
		r.HolderIdentity = *spec.HolderIdentity
	}
	if spec.LeaseDurationSeconds != nil {
		r.LeaseDurationSeconds = int(*spec.LeaseDurationSeconds)
	}
	if spec.LeaseTransitions != nil {
		r.LeaderTransitions = int(*spec.LeaseTransitions)
	}
	if spec.AcquireTime != nil {
		r.AcquireTime = metav1.Time{Time: spec.AcquireTime.Time}
	}
	if spec.RenewTime != nil {
		r.RenewTime = metav1.Time{Time: spec.RenewTime.Time}
	}
	if spec.PreferredHolder != nil {
		r.PreferredHolder = *spec.PreferredHolder
	}
	if spec.Strategy != nil {
		r.Strategy = *spec.Strategy
	}
	return &r
}

func recordToLeaseSpec(r *leaseRecord) coordinationv1.LeaseSpec {
	d, n := int32(r.LeaseDurationSeconds), int32(r.LeaderTransitions)
	spec := coordinationv1.LeaseSpec{HolderIdentity: &r.HolderIdentity, LeaseDurationSeconds: &d,
		AcquireTime: &metav1.MicroTime{Time: r.AcquireTime.Time}, RenewTime: &metav1.MicroTime{Time: r.RenewTime.Time}, LeaseTransitions: &n}
	if r.PreferredHolder != "" {
		spec.PreferredHolder = &r.PreferredHolder
	}
	if r.Strategy != "" {
		spec.Strategy = &r.Strategy
	}
	return spec
}

// leaseLocker reads and writes the Lease (resourcelock.Interface, less
// what only client-go's elector used): Get returns the record and its
// JSON, a NotFound error when there is no Lease.
type leaseLocker interface {
	Get(ctx context.Context) (*leaseRecord, []byte, error)
	Create(ctx context.Context, r leaseRecord) error
	Update(ctx context.Context, r leaseRecord) error
	Identity() string
}

// leaseLock is resourcelock's LeaseLock, except that Get reads the Lease
// from an informer's store: candidates that poll it every RetryPeriod
// send nothing; Create and Update go to the API server (a stale read
// there is a conflict, and the next try reads again).
type leaseLock struct {
	client   coordinationv1client.LeasesGetter
	store    cache.Store
	ns, name string
	identity string

	mu    sync.Mutex
	lease *coordinationv1.Lease // the newest this lock has seen
}

var _ leaseLocker = (*leaseLock)(nil)

func (l *leaseLock) Get(ctx context.Context) (*leaseRecord, []byte, error) {
	obj, ok, err := l.store.GetByKey(l.ns + "/" + l.name)
	if err != nil {
		return nil, nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var lease *coordinationv1.Lease
	if ok {
		lease, _ = obj.(*coordinationv1.Lease)
	}
	// The informer may not have brought this lock's own last write yet.
	if l.lease != nil && (lease == nil || newerThan(l.lease, lease)) {
		lease = l.lease
	}
	if lease == nil {
		return nil, nil, apierrors.NewNotFound(coordinationv1.Resource("leases"), l.name)
	}
	l.lease = lease.DeepCopy()
	rec := leaseSpecToRecord(&l.lease.Spec)
	raw, err := json.Marshal(*rec)
	return rec, raw, err
}

// newerThan compares resource versions (etcd revisions, decimal).
func newerThan(a, b *coordinationv1.Lease) bool {
	x, err1 := strconv.ParseUint(a.ResourceVersion, 10, 64)
	y, err2 := strconv.ParseUint(b.ResourceVersion, 10, 64)
	return err1 == nil && err2 == nil && x > y
}

func (l *leaseLock) Create(ctx context.Context, ler leaseRecord) error {
	lease, err := l.client.Leases(l.ns).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: l.name, Namespace: l.ns},
		Spec:       recordToLeaseSpec(&ler),
	}, metav1.CreateOptions{})
	if err == nil {
		l.mu.Lock()
		l.lease = lease
		l.mu.Unlock()
	}
	return err
}

func (l *leaseLock) Update(ctx context.Context, ler leaseRecord) error {
	l.mu.Lock()
	if l.lease == nil {
		l.mu.Unlock()
		return errors.New("lease not read yet")
	}
	lease := l.lease.DeepCopy()
	l.mu.Unlock()
	lease.Spec = recordToLeaseSpec(&ler)
	lease, err := l.client.Leases(l.ns).Update(ctx, lease, metav1.UpdateOptions{})
	if err == nil {
		l.mu.Lock()
		l.lease = lease
		l.mu.Unlock()
	}
	return err
}

func (l *leaseLock) Identity() string { return l.identity }

// elector is client-go's leaderelection.LeaderElector over a
// leaseLocker, trimmed to what aggregate uses: no coordinated
// election, no metrics, no watchdog. That package also holds the
// coordinated election's LeaseCandidate, which links the informer
// factory of every built-in API group.
//
// The Lease is this elector's while the record it last wrote or read
// names it and has not expired by this elector's clock; a candidate takes
// a Lease whose holder has not renewed it within its duration, counted
// from when this candidate last saw the record change.
type elector struct {
	lock                                      leaseLocker
	leaseDuration, renewDeadline, retryPeriod time.Duration

	// Used only by run's goroutine.
	observed     leaseRecord
	observedRaw  []byte
	observedTime time.Time
}

// electJitter spreads the candidates' tries (client-go's JitterFactor).
const electJitter = 1.2

// run waits until this elector holds the Lease, then calls lead with a
// context that ends when a renewal fails for renewDeadline or ctx ends;
// it releases the Lease (a duration of one second) before returning.
// lead runs on its own goroutine; run does not wait for it to return.
func (e *elector) run(ctx context.Context, lead func(context.Context)) {
	if !e.acquire(ctx) {
		return // ctx ended
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go lead(ctx)
	e.renew(ctx)
}

// acquire tries every retryPeriod (jittered) until it holds the Lease or
// ctx ends.
func (e *elector) acquire(ctx context.Context) bool {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ok := false
	wait.JitterUntil(func() {
		if ok = e.tryAcquireOrRenew(ctx); ok {
			cancel()
		}
	}, e.retryPeriod, electJitter, true, ctx.Done())
	return ok
}

// renew renews every retryPeriod until a renewal has failed for
// renewDeadline or ctx ends, then releases the Lease.
func (e *elector) renew(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wait.Until(func() {
		err := wait.PollUntilContextTimeout(ctx, e.retryPeriod, e.renewDeadline, true, func(ctx context.Context) (bool, error) {
			return e.tryAcquireOrRenew(ctx), nil
		})
		if err != nil {
			cancel()
		}
	}, e.retryPeriod, ctx.Done())
	e.release()
}

// release hands the Lease back (an expiry of one second) if this elector
// holds it. A renewal that the end cut short may have landed unseen (the
// API server wrote it, the answer never came): the release's write is
// then a conflict, and is tried again once the newer Lease is read, for
// as long as it still names this elector.
func (e *elector) release() {
	ctx, cancel := context.WithTimeout(context.Background(), e.renewDeadline)
	defer cancel()
	for {
		old, _, err := e.lock.Get(ctx)
		if err != nil || !e.leading() || old.HolderIdentity != e.lock.Identity() {
			return
		}
		now := metav1.Now()
		rec := leaseRecord{LeaderTransitions: old.LeaderTransitions, LeaseDurationSeconds: 1, RenewTime: now, AcquireTime: now}
		err = e.lock.Update(ctx, rec)
		if err == nil {
			e.observe(&rec)
		}
		if !apierrors.IsConflict(err) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (e *elector) leading() bool { return e.observed.HolderIdentity == e.lock.Identity() }

func (e *elector) valid(now time.Time) bool {
	return e.observedTime.Add(time.Duration(e.observed.LeaseDurationSeconds) * time.Second).After(now)
}

func (e *elector) observe(rec *leaseRecord) {
	e.observed, e.observedTime = *rec, time.Now()
}

// tryAcquireOrRenew takes or renews the Lease; false when another holds
// it unexpired or a request failed.
func (e *elector) tryAcquireOrRenew(ctx context.Context) bool {
	now := metav1.Now()
	rec := leaseRecord{HolderIdentity: e.lock.Identity(),
		LeaseDurationSeconds: int(e.leaseDuration / time.Second), RenewTime: now, AcquireTime: now}
	// The holder renews from the record it last wrote, without a read.
	if e.leading() && e.valid(now.Time) {
		rec.AcquireTime, rec.LeaderTransitions = e.observed.AcquireTime, e.observed.LeaderTransitions
		if e.lock.Update(ctx, rec) == nil {
			e.observe(&rec)
			return true
		}
	}
	old, raw, err := e.lock.Get(ctx)
	if err != nil {
		if !apierrors.IsNotFound(err) || e.lock.Create(ctx, rec) != nil {
			return false
		}
		e.observe(&rec)
		return true
	}
	if !bytes.Equal(e.observedRaw, raw) {
		e.observe(old)
		e.observedRaw = raw
	}
	if old.HolderIdentity != "" && e.valid(now.Time) && !e.leading() {
		return false
	}
	if e.leading() {
		rec.AcquireTime, rec.LeaderTransitions = old.AcquireTime, old.LeaderTransitions
	} else {
		rec.LeaderTransitions = old.LeaderTransitions + 1
	}
	if e.lock.Update(ctx, rec) != nil {
		return false
	}
	e.observe(&rec)
	return true
}
