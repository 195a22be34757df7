package k8ssync

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
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

var _ resourcelock.Interface = (*leaseLock)(nil)

func (l *leaseLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
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
	rec := resourcelock.LeaseSpecToLeaderElectionRecord(&l.lease.Spec)
	raw, err := json.Marshal(*rec)
	return rec, raw, err
}

// newerThan compares resource versions (etcd revisions, decimal).
func newerThan(a, b *coordinationv1.Lease) bool {
	x, err1 := strconv.ParseUint(a.ResourceVersion, 10, 64)
	y, err2 := strconv.ParseUint(b.ResourceVersion, 10, 64)
	return err1 == nil && err2 == nil && x > y
}

func (l *leaseLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	lease, err := l.client.Leases(l.ns).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: l.name, Namespace: l.ns},
		Spec:       resourcelock.LeaderElectionRecordToLeaseSpec(&ler),
	}, metav1.CreateOptions{})
	if err == nil {
		l.mu.Lock()
		l.lease = lease
		l.mu.Unlock()
	}
	return err
}

func (l *leaseLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	l.mu.Lock()
	if l.lease == nil {
		l.mu.Unlock()
		return errors.New("lease not read yet")
	}
	lease := l.lease.DeepCopy()
	l.mu.Unlock()
	lease.Spec = resourcelock.LeaderElectionRecordToLeaseSpec(&ler)
	lease, err := l.client.Leases(l.ns).Update(ctx, lease, metav1.UpdateOptions{})
	if err == nil {
		l.mu.Lock()
		l.lease = lease
		l.mu.Unlock()
	}
	return err
}

func (l *leaseLock) RecordEvent(string) {}
func (l *leaseLock) Identity() string   { return l.identity }
func (l *leaseLock) Describe() string   { return l.ns + "/" + l.name }
