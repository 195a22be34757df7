package k8ssync_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelcache/modelcache/k8ssync"
)

// TestVersionStatusAddsUpTheNodes: status.versions has the main artifact
// and each versions entry, with nodes by phase, the revisions and digests
// served (most served first: drift shows), the pods of every node (sorted,
// capped at MaxStatusPods with the count of all) and the latest use and
// download.
func TestVersionStatusAddsUpTheNodes(t *testing.T) {
	mc := &k8ssync.ModelCache{ObjectMeta: metav1.ObjectMeta{Name: "llama"},
		Spec: k8ssync.ModelCacheSpec{Source: "hf://org/llama", Versions: []k8ssync.VersionSpec{{Suffix: "v2", Source: "hf://org/llama@v2"}}}}
	node := func(name string, arts ...k8ssync.ArtifactStatus) k8ssync.ModelCacheNode {
		return k8ssync.ModelCacheNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: k8ssync.ModelCacheNodeStatus{Artifacts: arts}}
	}
	var many []string
	for i := range 30 {
		many = append(many, fmt.Sprintf("ml/server-%02d", i))
	}
	ready := func(name, rev, digest, used, done string, pods ...string) k8ssync.ArtifactStatus {
		return k8ssync.ArtifactStatus{Name: name, ModelCache: "llama", Phase: "Ready", Revision: rev, Digest: digest, LastUsed: used, DownloadCompleted: done, Pods: pods}
	}
	nodes := []k8ssync.ModelCacheNode{
		node("a", ready("llama", "c1", "sha256:1", "2026-11-23T10:00:00Z", "2026-11-20T09:00:00Z", "ml/b", "ml/a"),
			ready("llama-v2", "c2", "sha256:2", "", "2026-11-21T09:00:00Z", many...)),
		node("b", ready("llama", "c1", "sha256:1", "2026-11-23T12:00:00Z", "2026-11-20T08:00:00Z", "ml/a"),
			k8ssync.ArtifactStatus{Name: "llama-v2", ModelCache: "llama", Phase: "Downloading"}),
		node("c", ready("llama", "c0", "sha256:0", "", "2026-11-22T09:00:00Z"),
			k8ssync.ArtifactStatus{Name: "llama-v2", ModelCache: "llama", Phase: "Failed"}),
		node("d", ready("llama", "c9", "sha256:9", "", "", "other/x")), // another ModelCache's artifact of that name

	}
	nodes[3].Status.Artifacts[0].ModelCache = "other"
	st := k8ssync.Aggregate(mc, nodes, time.Now())
	if len(st.Versions) != 2 {
		t.Fatalf("versions %+v", st.Versions)
	}
	main, v2 := st.Versions[0], st.Versions[1]
	if main.Artifact != "llama" || main.Suffix != "" || main.Nodes.ReadyText != "3/3" ||
		!slices.Equal(main.Revisions, []k8ssync.RevisionCount{{Revision: "c1", Digest: "sha256:1", Nodes: 2}, {Revision: "c0", Digest: "sha256:0", Nodes: 1}}) ||
		!slices.Equal(main.Pods, []string{"ml/a", "ml/b"}) || main.PodCount != 2 ||
		main.LastUsed != "2026-11-23T12:00:00Z" || main.LastDownloaded != "2026-11-22T09:00:00Z" {
		t.Errorf("main %+v", main)
	}
	if st.Nodes != main.Nodes || st.Revision != "c1" {
		t.Errorf("status.nodes %+v and revision %q must be the main artifact's (%+v)", st.Nodes, st.Revision, main.Nodes)
	}
	if main.FromOrigin != 0 || main.OriginBytes != 0 {
		t.Errorf("no node said where its bytes came from: %+v", main)
	}
	if v2.Artifact != "llama-v2" || v2.Suffix != "v2" || v2.Nodes.Ready != 1 || v2.Nodes.Downloading != 1 || v2.Nodes.Failed != 1 || v2.Nodes.Total != 3 ||
		len(v2.Revisions) != 1 || v2.PodCount != 30 || !slices.Equal(v2.Pods, many[:k8ssync.MaxStatusPods]) {
		t.Errorf("v2 %+v", v2)
	}
}

// TestVersionStatusCountsNodesThatFetchedFromTheOrigin: fan-out shows in
// the ModelCache status as the nodes whose last download took more than
// OriginShare of its bytes from the source (a node that took only a
// hub's small files from it, the weights from peers, does not count), and
// the bytes from each side.
func TestVersionStatusCountsNodesThatFetchedFromTheOrigin(t *testing.T) {
	mc := &k8ssync.ModelCache{ObjectMeta: metav1.ObjectMeta{Name: "llama"}, Spec: k8ssync.ModelCacheSpec{Source: "hf://org/llama"}}
	node := func(name string, origin, peers int64) k8ssync.ModelCacheNode {
		return k8ssync.ModelCacheNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: k8ssync.ModelCacheNodeStatus{Artifacts: []k8ssync.ArtifactStatus{
			{Name: "llama", ModelCache: "llama", Phase: "Ready", Revision: "c1", OriginBytes: origin, PeerBytes: peers}}}}
	}
	const model = 1 << 30
	nodes := []k8ssync.ModelCacheNode{
		node("a", model/2, model/2), // one of two origin nodes: half its blobs from the other
		node("b", model/2, model/2),
		node("c", 40<<10, model), // the hub's JSON files only
		node("d", 0, model),
		node("e", 0, 0), // a node that never said
	}
	v := k8ssync.Aggregate(mc, nodes, time.Now()).Versions[0]
	if v.FromOrigin != 2 || v.OriginBytes != model+40<<10 || v.PeerBytes != 3*model {
		t.Fatalf("fromOrigin %d, origin bytes %d, peer bytes %d: want 2, %d, %d", v.FromOrigin, v.OriginBytes, v.PeerBytes, model+40<<10, 3*model)
	}
}
