package k8ssync

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/modelcache/modelcache/internal/kubetest"
	"github.com/modelcache/modelcache/internal/testenv"
)

// failingLock refuses every write while fail is set: a leader that can no
// longer renew (the API server unreachable from its node, RBAC revoked).
type failingLock struct {
	leaseLocker
	fail atomic.Bool
}

var errRefused = errors.New("refused by the test")

func (l *failingLock) Create(ctx context.Context, r leaseRecord) error {
	if l.fail.Load() {
		return errRefused
	}
	return l.leaseLocker.Create(ctx, r)
}

func (l *failingLock) Update(ctx context.Context, r leaseRecord) error {
	if l.fail.Load() {
		return errRefused
	}
	return l.leaseLocker.Update(ctx, r)
}

// TestElectionOverTheLease: against a real API server, two candidates
// over one Lease: one leads and renews while the other waits; a leader
// whose renewals fail for the renew deadline stops its elected work, and
// the other takes the Lease once it has expired (one more transition); a
// leader whose context ends releases the Lease.
func TestElectionOverTheLease(t *testing.T) {
	cl := kubetest.Start(t)
	core, coord, err := typedClients(cl.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const ns = "election"
	if _, err := core.Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	lease := func() (*coordinationv1.Lease, error) {
		return coord.Leases(ns).Get(ctx, leaseName, metav1.GetOptions{})
	}
	type candidate struct {
		lock    *failingLock
		cancel  context.CancelFunc
		leading atomic.Pointer[context.Context] // the elected work's context, once it runs
		done    chan struct{}
	}
	start := func(id string) *candidate {
		inf := newInformer(coord.Leases(ns), &coordinationv1.Lease{}, 0, fields.OneTermEqualSelector("metadata.name", leaseName).String())
		go inf.Run(ctx.Done())
		c := &candidate{lock: &failingLock{leaseLocker: &leaseLock{client: coord, store: inf.GetStore(), ns: ns, name: leaseName, identity: id}},
			done: make(chan struct{})}
		cctx, cancel := context.WithCancel(ctx)
		c.cancel = cancel
		e := &elector{lock: c.lock, leaseDuration: 6 * time.Second, renewDeadline: 4 * time.Second, retryPeriod: 200 * time.Millisecond}
		go func() {
			defer close(c.done)
			e.run(cctx, func(ctx context.Context) { c.leading.Store(&ctx) })
		}()
		return c
	}
	holder := func(want string) func() error {
		return func() error {
			l, err := lease()
			if err != nil {
				return err
			}
			if got := *l.Spec.HolderIdentity; got != want {
				return fmt.Errorf("the Lease is held by %q", got)
			}
			return nil
		}
	}

	a := start("node-a")
	testenv.Eventually(t, "node-a holds the Lease and runs the elected work", 30*time.Second, func() error {
		if a.leading.Load() == nil {
			return errors.New("node-a does not lead")
		}
		return holder("node-a")()
	})
	b := start("node-b")
	// node-a renews: the Lease's renew time moves on, twice, while node-b
	// is a candidate; node-b never runs the elected work meanwhile.
	first, err := lease()
	if err != nil {
		t.Fatal(err)
	}
	seen := first.Spec.RenewTime.Time
	for range 2 {
		testenv.Eventually(t, "node-a renews the Lease", 10*time.Second, func() error {
			l, err := lease()
			if err != nil {
				return err
			}
			if !l.Spec.RenewTime.Time.After(seen) || *l.Spec.HolderIdentity != "node-a" {
				return fmt.Errorf("renewed at %v by %q", l.Spec.RenewTime, *l.Spec.HolderIdentity)
			}
			seen = l.Spec.RenewTime.Time
			return nil
		})
	}
	if b.leading.Load() != nil {
		t.Fatal("node-b runs the elected work while node-a holds the Lease")
	}
	if l, _ := lease(); *l.Spec.LeaseTransitions != *first.Spec.LeaseTransitions || !l.Spec.AcquireTime.Equal(first.Spec.AcquireTime) {
		t.Fatalf("a renewal changed the transitions or the acquire time: %+v, then %+v", first.Spec, l.Spec)
	}

	// node-a can no longer write the Lease: its elected work stops, and
	// node-b takes the Lease once it has expired.
	a.lock.fail.Store(true)
	testenv.Eventually(t, "node-a's elected work is stopped", 20*time.Second, func() error {
		if (*a.leading.Load()).Err() == nil {
			return errors.New("still running")
		}
		return nil
	})
	<-a.done
	testenv.Eventually(t, "node-b holds the Lease and runs the elected work", 30*time.Second, func() error {
		if b.leading.Load() == nil {
			return errors.New("node-b does not lead")
		}
		return holder("node-b")()
	})
	if l, _ := lease(); *l.Spec.LeaseTransitions != *first.Spec.LeaseTransitions+1 {
		t.Fatalf("transitions %d after a change of holder, want %d", *l.Spec.LeaseTransitions, *first.Spec.LeaseTransitions+1)
	}

	// node-b stops: it releases the Lease (no holder, one second left).
	b.cancel()
	<-b.done
	if (*b.leading.Load()).Err() == nil {
		t.Fatal("node-b's elected work runs on after its election ended")
	}
	l, err := lease()
	if err != nil {
		t.Fatal(err)
	}
	if *l.Spec.HolderIdentity != "" || *l.Spec.LeaseDurationSeconds != 1 {
		t.Fatalf("not released: holder %q, duration %d s", *l.Spec.HolderIdentity, *l.Spec.LeaseDurationSeconds)
	}
}
