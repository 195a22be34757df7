package k8ssync

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/internal/kubetest"
)

// apiServerLimit is about the largest object the API server stores
// (etcd's request limit, 1.5 MiB).
const apiServerLimit = 3 << 19

// hugeNode is a daemon whose artifacts carry the largest inputs: a name of
// cachestore.MaxNameLen bytes, a source of api.MaxURIBytes, a message that
// repeats it (as a pull's message did, 3.6 MB), a rollout's next with the
// same, 200 leases with holder names of 1 KiB, 300 pods; half of them
// belong to ModelCaches.
type hugeNode struct {
	Node
	n int
}

func (h hugeNode) Artifacts() ([]api.Artifact, error) {
	uri := "https://example.com/w.bin?pad=" + strings.Repeat("u", api.MaxURIBytes-30)
	msg := strings.Repeat("resolve "+uri+": ", 3) + strings.Repeat("x", 3<<20)
	var holders []api.Holder
	for i := range 200 {
		holders = append(holders, api.Holder{Kind: "lease", ID: fmt.Sprintf("%04d", i) + strings.Repeat("h", 1<<10)})
	}
	for i := range 300 {
		holders = append(holders, api.Holder{Kind: "pod", ID: fmt.Sprintf("ns-%s/pod-%03d-%s", strings.Repeat("n", 60), i, strings.Repeat("p", 250))})
	}
	var out []api.Artifact
	for i := range h.n {
		name := fmt.Sprintf("%05d", i) + strings.Repeat("a", cachestore.MaxNameLen-5)
		out = append(out, api.Artifact{Name: name, Kind: api.KindModel, Phase: api.PhaseFailed, Revision: strings.Repeat("r", 255),
			ManifestDigest: "sha256:" + strings.Repeat("d", 64), Source: uri, Message: msg, Reason: strings.Repeat("R", 300), InUse: holders,
			Next: &api.NextRevision{URI: uri, Revision: strings.Repeat("r", 255), Phase: api.PhaseFailed, Message: msg}})
	}
	return out, nil
}

func (hugeNode) GPUs() api.GPUInventory          { return api.GPUInventory{Source: "none"} }
func (hugeNode) StatusNow() (*api.Status, error) { return &api.Status{}, nil }

func hugeOwners(arts []api.Artifact) map[string]string {
	owners := map[string]string{}
	for i, a := range arts {
		if i%2 == 0 {
			owners[a.Name] = strings.Repeat("m", 253)
		}
	}
	return owners
}

// TestNodeStatusStaysSmall: with the largest inputs the socket accepts, a
// node's status stays within MaxNodeStatusBytes, a third of what the API
// server stores, for 1 to 1,000 artifacts; each message is clipped with a
// marker; artifacts left out are those of no ModelCache first, and the
// status says how many. On the real API server the status is written.
func TestNodeStatusStaysSmall(t *testing.T) {
	for _, n := range []int{1, 10, 100, 1000} {
		node := hugeNode{n: n}
		arts, _ := node.Artifacts()
		owners := hugeOwners(arts)
		s := &Syncer{node: node}
		st := s.nodeStatus(arts, owners, nil, map[string]string{"pending": strings.Repeat("w", 1<<20)})
		size := jsonSize(st)
		t.Logf("%d artifacts: status of %d bytes listing %d", n, size, len(st.Artifacts))
		if size > MaxNodeStatusBytes {
			t.Fatalf("%d artifacts: status of %d bytes, over %d", n, size, MaxNodeStatusBytes)
		}
		a := st.Artifacts[0]
		if len(a.Message) > MaxStatusMessage || !strings.Contains(a.Message, "[clipped: ") || len(a.Next.Message) > MaxStatusMessage ||
			len(a.InUseBy) != MaxStatusHolders || !strings.HasPrefix(a.InUseBy[MaxStatusHolders-1], "… and ") || len(a.Source) > MaxStatusURI {
			t.Fatalf("not clipped: message %d bytes, next %d, %d holders, source %d", len(a.Message), len(a.Next.Message), len(a.InUseBy), len(a.Source))
		}
		if len(st.Artifacts) < n+1 {
			left := 0
			for _, x := range st.Artifacts {
				if x.ModelCache == "" && x.Name != "pending" {
					left++
				}
			}
			owned := 0
			for _, x := range st.Artifacts {
				if x.ModelCache != "" {
					owned++
				}
			}
			if left > 0 && owned < (n+1)/2 {
				t.Fatalf("an artifact of no ModelCache is listed while %d of %d of ModelCaches are", owned, (n+1)/2)
			}
			if len(st.Problems) != 1 || !strings.Contains(st.Problems[0], "artifacts are not listed here") {
				t.Fatalf("problems: %q", st.Problems)
			}
		}
	}

	// The real API server stores it, managed fields and all.
	cl := kubetest.Start(t)
	node := hugeNode{n: 1000}
	s, err := New(Config{NodeName: "huge", Kube: cl.Config}, node)
	if err != nil {
		t.Fatal(err)
	}
	arts, _ := node.Artifacts()
	s.writeStatus(context.Background(), arts, hugeOwners(arts), nil, nil)
	u, err := s.dyn.Resource(ModelCacheNodeGVR).Get(context.Background(), "huge", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the status was not written: %v", err)
	}
	raw, _ := json.Marshal(u.Object)
	var back ModelCacheNode
	json.Unmarshal(raw, &back)
	if len(back.Status.Artifacts) == 0 || back.Status.Heartbeat.Time.Before(time.Now().Add(-time.Minute)) {
		t.Fatalf("status as stored: %d artifacts, heartbeat %v", len(back.Status.Artifacts), back.Status.Heartbeat)
	}
	if len(raw) > apiServerLimit/2 {
		t.Fatalf("the stored object is %d bytes", len(raw))
	}
	t.Logf("stored: %d bytes with %d artifacts", len(raw), len(back.Status.Artifacts))
}

// TestModelCacheStatusStaysSmall: what the elected daemon copies from the
// nodes' reports into a ModelCache's status (revisions, digests, pods,
// times, the messages of nodes that could not get a rollout's target) is
// clipped, however large a node (one that lies included) made its report.
func TestModelCacheStatusStaysSmall(t *testing.T) {
	const src = "hf://org/m"
	big := strings.Repeat("z", 100<<10)
	c2 := strings.Repeat("2", 40)
	mc := &ModelCache{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Spec: ModelCacheSpec{Source: src}}
	mc.Status.Resolved = []ResolvedSource{{Artifact: "m", Source: src, Revision: c2, URI: src + "@" + c2}}
	mc.Status.Active = []ResolvedSource{{Artifact: "m", Source: src, Revision: commit, URI: src + "@" + commit}}
	var nodes []ModelCacheNode
	for i := range 50 {
		as := ArtifactStatus{Name: "m", ModelCache: "m", Phase: string(api.PhaseReady), Revision: fmt.Sprint(i) + big, Digest: big, Source: src + "@" + commit,
			LastUsed: big, DownloadCompleted: big, Next: &NextStatus{Source: src + "@" + c2, Phase: string(api.PhaseFailed), Message: big}}
		for p := range 30 {
			as.Pods = append(as.Pods, fmt.Sprintf("%d/%d", i, p)+big)
		}
		nodes = append(nodes, ModelCacheNode{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint("node-", i)}, Status: ModelCacheNodeStatus{Artifacts: []ArtifactStatus{as}}})
	}
	st := Aggregate(mc, nodes, time.Now())
	if size := jsonSize(st); size > 64<<10 {
		t.Fatalf("ModelCache status of %d bytes", size)
	}
	if st.Rollout == nil || len(st.Rollout.Message) > MaxStatusMessage || !strings.Contains(st.Rollout.Message, "node-") {
		t.Fatalf("rollout: %+v", st.Rollout)
	}
}

// longRevisionNode resolves every source to a revision of 100 KB.
type longRevisionNode struct{ Node }

func (longRevisionNode) Resolve(_ context.Context, ds api.Desire, _ map[string]string) (string, string, error) {
	return strings.Repeat("v", 100<<10), ds.URI, nil
}

// TestLongRevisionIsAnError: a revision longer than MaxStatusField (an
// origin's validator, say) is not copied into status.resolved: the
// resolution is recorded as an error, retried.
func TestLongRevisionIsAnError(t *testing.T) {
	mc := &ModelCache{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Spec: ModelCacheSpec{Source: "https://example.com/w.bin"}}
	s := &Syncer{cfg: Config{Now: time.Now}, node: longRevisionNode{}, log: discard, polled: map[string]time.Time{}}
	out, again := s.resolveAll(context.Background(), mc)
	if len(out) != 1 || out[0].URI != "" || out[0].Revision != "" || !strings.Contains(out[0].Error, "a revision of 102400 bytes") || !again {
		t.Fatalf("%+v again %v", out, again)
	}
}
