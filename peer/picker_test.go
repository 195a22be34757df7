package peer_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelcache/modelcache/k8ssync"
	"github.com/modelcache/modelcache/peer"
)

func node(name string, beat time.Time, arts ...k8ssync.ArtifactStatus) k8ssync.ModelCacheNode {
	return k8ssync.ModelCacheNode{ObjectMeta: metav1.ObjectMeta{Name: name},
		Status: k8ssync.ModelCacheNodeStatus{Heartbeat: metav1.NewTime(beat), Artifacts: arts}}
}

func TestPickListsTheHoldersOfTheRevision(t *testing.T) {
	now := time.Unix(1e9, 0)
	ready := k8ssync.ArtifactStatus{Name: "llama", Phase: "Ready", Revision: "abc", Digest: "sha256:m1"}
	nodes := []k8ssync.ModelCacheNode{
		node("self", now, ready),
		node("a", now, ready),
		node("b", now, k8ssync.ArtifactStatus{Name: "llama", Phase: "Ready", Revision: "old",
			Next: &k8ssync.NextStatus{Revision: "abc", Phase: "Ready", Digest: "sha256:m1"}}), // prefetched for a rollout
		node("c", now, k8ssync.ArtifactStatus{Name: "llama", Phase: "Downloading", Revision: "abc"}),
		node("d", now, k8ssync.ArtifactStatus{Name: "llama", Phase: "Ready", Revision: "old"}),
		node("e", now, k8ssync.ArtifactStatus{Name: "other", Phase: "Ready", Revision: "abc"}),
		node("f", now.Add(-time.Hour), ready), // stale heartbeat
		node("g", now, ready),                 // no address known
		node("h", now, k8ssync.ArtifactStatus{Name: "llama", Phase: "Ready", Revision: "abc", Digest: "sha256:other"}),
		node("i", now, k8ssync.ArtifactStatus{Name: "llama", Phase: "Ready", Revision: "old",
			Next: &k8ssync.NextStatus{Revision: "abc", Phase: "Downloading"}}),
	}
	addr := func(n string) (string, bool) { return "http://" + n + ":7435", n != "g" }
	q := peer.PickQuery{Self: "self", Artifact: "llama", Revision: "abc", Digest: "sha256:m1", Now: now, MaxAge: 10 * time.Minute, Addr: addr}
	got := peer.Pick(nodes, q)
	slices.Sort(got)
	if fmt.Sprint(got) != "[http://a:7435 http://b:7435]" {
		t.Errorf("Pick = %v, want a and b", got)
	}
	q.Digest = "" // no digest known: h counts too
	if got := peer.Pick(nodes, q); len(got) != 3 {
		t.Errorf("without a digest: %v, want a, b, h", got)
	}
	q.MaxAge = 0 // f counts too
	if got := peer.Pick(nodes, q); len(got) != 4 {
		t.Errorf("without MaxAge: %v, want a, b, f, h", got)
	}
	q.Max = 2
	if got := peer.Pick(nodes, q); len(got) != 2 {
		t.Errorf("Max 2: %v", got)
	}
}

// The order is stable for one requester and spread across requesters:
// 16 requesters over 8 holders do not all start at the same one.
func TestPickSpreadsRequesters(t *testing.T) {
	now := time.Unix(1e9, 0)
	var nodes []k8ssync.ModelCacheNode
	for i := range 8 {
		nodes = append(nodes, node(fmt.Sprintf("holder-%d", i), now, k8ssync.ArtifactStatus{Name: "m", Phase: "Ready", Revision: "r"}))
	}
	addr := func(n string) (string, bool) { return "http://" + n, true }
	first := map[string]int{}
	for i := range 16 {
		q := peer.PickQuery{Self: fmt.Sprintf("node-%d", i), Artifact: "m", Revision: "r", Addr: addr}
		a, b := peer.Pick(nodes, q), peer.Pick(nodes, q)
		if !slices.Equal(a, b) || len(a) != 8 {
			t.Fatalf("%s: %v then %v", q.Self, a, b)
		}
		first[a[0]]++
	}
	if len(first) < 4 {
		t.Errorf("16 requesters start at only %d of 8 holders: %v", len(first), first)
	}
}
