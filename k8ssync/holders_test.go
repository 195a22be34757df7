package k8ssync_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelcache/modelcache/k8ssync"
	p2p "github.com/modelcache/modelcache/peer"
)

// TestPeerViewFromPublishedStatus: what the elected daemon publishes in
// a ModelCache's status (Aggregate's status.peers) gives every other
// daemon the same answers the planner got from the nodes' own statuses:
// the peers that hold a revision (peer.Pick), who fetches it, who failed
// it, and where each serves, without the nodes that are not live or
// advertise no peer port, and without other ModelCaches' artifacts.
func TestPeerViewFromPublishedStatus(t *testing.T) {
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	node := func(name, addr string, age time.Duration, arts ...k8ssync.ArtifactStatus) k8ssync.ModelCacheNode {
		var n k8ssync.ModelCacheNode
		n.Name = name
		n.Status = k8ssync.ModelCacheNodeStatus{PeerAddress: addr, Heartbeat: metav1.NewTime(now.Add(-age)), Artifacts: arts,
			FreeBytes: 1 << 30, Summary: "1 Ready"}
		return n
	}
	art := func(phase, rev, digest string) k8ssync.ArtifactStatus {
		return k8ssync.ArtifactStatus{Name: "llama", ModelCache: "llama", Phase: phase, Revision: rev, Digest: digest, Bytes: 1 << 30, Message: "progress is not published"}
	}
	withNext := func(a k8ssync.ArtifactStatus, phase, rev string) k8ssync.ArtifactStatus {
		a.Next = &k8ssync.NextStatus{Revision: rev, Phase: phase, Digest: "d-" + rev}
		return a
	}
	other := k8ssync.ArtifactStatus{Name: "bert", ModelCache: "bert", Phase: "Ready", Revision: "b1"}
	nodes := []k8ssync.ModelCacheNode{
		node("a", "http://127.0.0.2:7435", time.Minute, art("Ready", "r1", "d-r1"), other),
		node("b", "http://127.0.0.3:7435", time.Minute, withNext(art("Ready", "r1", "d-r1"), "Ready", "r2")),
		node("c", "http://127.0.0.4:7435", time.Minute, art("Downloading", "r1", "")),
		node("d", "http://127.0.0.5:7435", time.Minute, art("Failed", "r1", "")),
		node("e", "http://127.0.0.6:7435", time.Minute, art("Pending", "", "")),
		node("stale", "http://127.0.0.7:7435", 4*time.Hour, art("Ready", "r1", "d-r1")),
		node("noport", "", time.Minute, art("Ready", "r1", "d-r1")),
		node("self", "http://127.0.0.9:7435", time.Minute, art("Pending", "", "")),
		node("idle", "http://127.0.0.10:7435", time.Minute),
	}
	mc := &k8ssync.ModelCache{}
	mc.Name = "llama"
	// A recorded origin node that lists nothing yet (its daemon may never
	// pull): its address is published, so that it is asked and found
	// gone.
	mc.Status.Resolved = []k8ssync.ResolvedSource{{Artifact: "llama", Source: "hf://org/llama", URI: "hf://org/llama@r1", Revision: "r1", OriginNodes: []string{"idle"}}}
	st := k8ssync.Aggregate(mc, nodes, now)
	if len(st.Peers) == 0 {
		t.Fatal("no status.peers published")
	}
	for _, s := range st.Peers {
		if s.Artifact != "llama" || slices.Contains(s.Nodes, "stale") || slices.Contains(s.Nodes, "noport") {
			t.Errorf("published %+v: only live nodes with a peer port, only this ModelCache's artifacts", s)
		}
	}
	// Through the API server: the status as JSON and back.
	raw, _ := json.Marshal(st)
	var got k8ssync.ModelCacheStatus
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatal(err)
	}
	mc.Status = got
	own := nodes[7].Status
	view := k8ssync.PeerView([]*k8ssync.ModelCache{mc}, "self", own, now)
	byName := map[string]k8ssync.ModelCacheNode{}
	for _, n := range view {
		byName[n.Name] = n
	}
	if n, ok := byName["idle"]; !ok || n.Status.PeerAddress != "http://127.0.0.10:7435" || len(n.Status.Artifacts) != 0 {
		t.Errorf("the recorded origin node in the view: %+v (present %v)", n.Status, ok)
	}
	if _, ok := byName["stale"]; ok {
		t.Error("a stale node is in the view")
	}
	for _, n := range nodes[:5] {
		v, ok := byName[n.Name]
		if !ok {
			t.Errorf("%s missing from the view", n.Name)
			continue
		}
		if v.Status.PeerAddress != n.Status.PeerAddress || now.Sub(v.Status.Heartbeat.Time) > k8ssync.PeerStale {
			t.Errorf("%s: address %q heartbeat %s, want %q and live", n.Name, v.Status.PeerAddress, v.Status.Heartbeat, n.Status.PeerAddress)
		}
		want, have := n.Status.Artifacts[0], v.Status.Artifacts
		if len(have) != 1 || have[0].Phase != want.Phase || have[0].Revision != want.Revision || have[0].Digest != want.Digest ||
			(want.Next == nil) != (have[0].Next == nil) || (want.Next != nil && *want.Next != *have[0].Next) {
			t.Errorf("%s: view %+v, status %+v", n.Name, have, want)
		}
	}
	if s := byName["self"]; len(s.Status.Artifacts) != 1 || s.Status.Artifacts[0].Phase != "Pending" || s.Status.PeerAddress != own.PeerAddress {
		t.Errorf("self in the view: %+v", s.Status)
	}
	// The planner's question, asked of both: the same peers.
	for _, q := range []p2p.PickQuery{
		{Self: "self", Artifact: "llama", Revision: "r1", Digest: "d-r1", Now: now, MaxAge: k8ssync.PeerStale},
		{Self: "self", Artifact: "llama", Revision: "r2", Now: now, MaxAge: k8ssync.PeerStale},
		{Self: "e", Artifact: "llama", Revision: "r1", Now: now, MaxAge: k8ssync.PeerStale, Max: 1},
	} {
		addr := map[string]string{}
		for _, n := range nodes {
			addr[n.Name] = n.Status.PeerAddress
		}
		q.Addr = func(n string) (string, bool) { return addr[n], addr[n] != "" }
		direct := p2p.Pick(nodes, q)
		if published := p2p.Pick(view, q); len(direct) == 0 || !slices.Equal(direct, published) {
			t.Errorf("Pick %+v: from the statuses %v, from the published view %v", q.Revision, direct, published)
		}
	}
}

// TestPeerStatusStaysSmall: a fleet whose names and addresses are long
// still fits status.peers within MaxPeerStatusBytes; the cut list says
// how many there are.
func TestPeerStatusStaysSmall(t *testing.T) {
	now := time.Now()
	var nodes []k8ssync.ModelCacheNode
	for i := range 4000 {
		var n k8ssync.ModelCacheNode
		n.Name = fmt.Sprintf("gpu-node-%s-%05d", strings.Repeat("x", 40), i)
		n.Status = k8ssync.ModelCacheNodeStatus{PeerAddress: fmt.Sprintf("http://10.%d.%d.%d:7435", i>>16, (i>>8)&255, i&255),
			Heartbeat: metav1.NewTime(now), Artifacts: []k8ssync.ArtifactStatus{{Name: "llama", ModelCache: "llama", Phase: "Ready", Revision: "r1"}}}
		nodes = append(nodes, n)
	}
	mc := &k8ssync.ModelCache{}
	mc.Name = "llama"
	st := k8ssync.Aggregate(mc, nodes, now)
	b1, _ := json.Marshal(st.Peers)
	b2, _ := json.Marshal(st.PeerAddresses)
	if len(b1)+len(b2) > k8ssync.MaxPeerStatusBytes {
		t.Errorf("status.peers is %d bytes, over %d", len(b1)+len(b2), k8ssync.MaxPeerStatusBytes)
	}
	if len(st.Peers) != 1 || st.Peers[0].Total != 4000 || len(st.Peers[0].Nodes) < 500 || len(st.PeerAddresses) != len(st.Peers[0].Nodes) {
		t.Errorf("cut to %d nodes of total %d, %d addresses", len(st.Peers[0].Nodes), st.Peers[0].Total, len(st.PeerAddresses))
	}
}
