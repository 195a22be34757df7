package k8ssync

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	"github.com/modelcache/modelcache/api"
)

const (
	llama   = "hf://meta-llama/Llama-3-8B@main"
	commit  = "0123456789abcdef0123456789abcdef01234567"
	digest1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111"
)

var discard = slog.New(slog.DiscardHandler)

// forgedURIs are what a node whose token may update a ModelCache's status
// wrote into status.resolved and status.active of a spec naming llama.
var forgedURIs = []string{
	"hf://attacker/backdoored-llama@" + commit,
	"https://attacker.example/steal.bin",
	"file:///var/lib/kubelet/pods",
}

// TestAtRevision: a pinned URI is the spec's source at a revision (same
// scheme, host, repository or bucket and path; only the revision differs,
// and is immutable), or it is refused.
func TestAtRevision(t *testing.T) {
	sha := strings.Repeat("ab", 32)
	for _, c := range []struct {
		source, pinned string
		ok             bool
	}{
		{llama, "hf://meta-llama/Llama-3-8B@" + commit, true},
		{"hf://meta-llama/Llama-3-8B", "hf://meta-llama/Llama-3-8B@" + commit, true},
		{"hf://meta-llama/Llama-3-8B@" + commit, "hf://meta-llama/Llama-3-8B@" + strings.Repeat("f", 40), true}, // a rollback's active
		{llama, llama, true},
		{llama, forgedURIs[0], false},
		{llama, forgedURIs[1], false},
		{llama, forgedURIs[2], false},
		{llama, "hf://meta-llama/Llama-3-8B-evil@" + commit, false},
		{llama, "hf://meta-llama/Llama-3-8B@dev", false}, // a branch is no pinned revision
		{llama, "hf://meta-llama/Llama-3-8B@" + commit + "/x", false},
		{"oci://reg.example:5000/models/m:v1", "oci://reg.example:5000/models/m@sha256:" + sha, true},
		{"oci://reg.example:5000/models/m@sha256:" + sha, "oci://reg.example:5000/models/m@sha256:" + sha, true},
		{"oci://reg.example/models/m:v1", "oci://evil.example/models/m@sha256:" + sha, false},
		{"oci://reg.example/models/m:v1", "oci://reg.example/models/m2@sha256:" + sha, false},
		{"oci://reg.example/models/m:v1", "oci://reg.example/models/m:v2", false},
		{"oci://reg.example/models/m:v1", "oci://reg.example/models/m@sha256:" + sha + "x", false},
		{"ngc://nvidia/team/llama", "ngc://nvidia/team/llama:1.0", true},
		{"ngc://nvidia/team/llama:1.0", "ngc://nvidia/team/llama:1.1", true},
		{"ngc://nvidia/team/llama", "ngc://nvidia/other/llama:1.0", false},
		{"ngc://nvidia/team/llama", "ngc://nvidia/team/llama", true}, // the source itself
		{"s3://bucket/models/m/", "s3://bucket/models/m/", true},
		{"s3://bucket/models/m/", "s3://bucket/models/evil/", false},
		{"s3://bucket/models/m/", "s3://other/models/m/", false},
		{"https://models.example/w.bin", "https://models.example/w.bin", true},
		{"https://models.example/w.bin", "https://attacker.example/w.bin", false},
		{"file:///srv/models/m", "file:///var/lib/kubelet/pods", false},
	} {
		err := atRevision(c.source, c.pinned)
		if (err == nil) != c.ok {
			t.Errorf("atRevision(%s, %s) = %v, want ok %v", c.source, c.pinned, err, c.ok)
		}
	}
}

func forgedMC(field string, uri string) *ModelCache {
	mc := &ModelCache{ObjectMeta: metav1.ObjectMeta{Name: "llama", UID: "u1"}, Spec: ModelCacheSpec{Source: llama}}
	e := ResolvedSource{Artifact: "llama", Source: llama, Revision: commit, URI: uri}
	if field == "status.active" {
		legit := e
		legit.URI = "hf://meta-llama/Llama-3-8B@" + commit
		mc.Status.Resolved = []ResolvedSource{legit}
		mc.Status.Active = []ResolvedSource{e}
	} else {
		mc.Status.Resolved = []ResolvedSource{e}
	}
	return mc
}

// TestNodeRefusesForgedResolution: with a forged status.resolved or
// status.active a node's desire never names the forged URI (it keeps
// what it serves: the desire it had, or it waits), it raises a Warning
// Event naming both URIs, once; a legitimate pinned revision is taken.
func TestNodeRefusesForgedResolution(t *testing.T) {
	base := api.Desire{Name: "llama", URI: llama, State: api.StatePresent}
	before := api.Desire{Name: "llama", URI: "hf://meta-llama/Llama-3-8B@" + strings.Repeat("e", 40), State: api.StatePresent}
	for _, field := range []string{"status.resolved", "status.active"} {
		for _, uri := range forgedURIs {
			mc := forgedMC(field, uri)
			ds, ok, why, _ := modelDesire(mc, base, llama, served{}, time.Now())
			if ok || ds.URI == uri || !strings.Contains(why, "refused the cluster's "+field) {
				t.Errorf("%s %s: desire %s ok %v (%s)", field, uri, ds.URI, ok, why)
			}
			rec := record.NewFakeRecorder(8)
			s := &Syncer{cfg: Config{NodeName: "n1"}, rec: rec, log: discard, lastWant: map[string]api.Desire{"llama": before}}
			want, pending := map[string]api.Desire{}, map[string]string{}
			s.wantOrWait(want, pending, ds, ok, why)
			if want["llama"].URI != before.URI {
				t.Errorf("%s %s: the node no longer keeps what it served: %+v", field, uri, want)
			}
			seen := map[string]bool{}
			s.refuse(mc, forged(mc), seen)
			s.refused = seen
			s.refuse(mc, forged(mc), map[string]bool{}) // the next pass: told already
			if n := len(rec.Events); n != 1 {
				t.Fatalf("%s %s: %d events", field, uri, n)
			}
			ev := <-rec.Events
			if !strings.Contains(ev, "Warning "+EventResolutionRefused) || !strings.Contains(ev, uri) || !strings.Contains(ev, llama) || !strings.Contains(ev, field) {
				t.Errorf("event: %s", ev)
			}
		}
	}
	// A legitimate pinned revision.
	mc := forgedMC("status.resolved", "hf://meta-llama/Llama-3-8B@"+commit)
	ds, ok, why, _ := modelDesire(mc, base, llama, served{}, time.Now())
	if !ok || ds.URI != "hf://meta-llama/Llama-3-8B@"+commit || ds.Ref != "main" {
		t.Fatalf("legitimate resolution: %+v %v %s", ds, ok, why)
	}
	if f := forged(mc); len(f) != 0 {
		t.Fatalf("refused a legitimate one: %+v", f)
	}
	// A kernel cache image the same way.
	kc := &ModelCache{ObjectMeta: metav1.ObjectMeta{Name: "k"}, Spec: ModelCacheSpec{Source: llama, KernelCaches: []KernelCacheSpec{{Name: "sm90", Image: "oci://reg.example/k:sm90"}}}}
	kc.Status.Resolved = []ResolvedSource{{Artifact: "sm90", Source: "oci://reg.example/k:sm90", URI: "oci://evil.example/k@sha256:" + strings.Repeat("0", 64)}}
	if _, ok, why := pinned(kc, api.Desire{Name: "sm90", URI: "oci://reg.example/k:sm90"}, "oci://reg.example/k:sm90"); ok || !strings.Contains(why, "refused") {
		t.Fatalf("forged kernel cache resolution taken: %s", why)
	}
}

// resolvingNode is a Node whose Resolve pins hf sources to commit.
type resolvingNode struct{ Node }

func (resolvingNode) Resolve(_ context.Context, ds api.Desire, _ map[string]string) (string, string, error) {
	repo, _, _ := strings.Cut(strings.TrimPrefix(ds.URI, "hf://"), "@")
	return commit, "hf://" + repo + "@" + commit, nil
}

// TestLeaderDropsForgedEntries: the elected daemon resolves a forged
// status.resolved entry again (its folder checksum goes with it) and
// drops a forged status.active entry.
func TestLeaderDropsForgedEntries(t *testing.T) {
	for _, uri := range forgedURIs {
		mc := forgedMC("status.resolved", uri)
		mc.Status.Resolved[0].Digest = digest1
		s := &Syncer{cfg: Config{NodeName: "n1", Now: time.Now}, node: resolvingNode{}, log: discard, polled: map[string]time.Time{}}
		out, _ := s.resolveAll(context.Background(), mc)
		if len(out) != 1 || out[0].URI != "hf://meta-llama/Llama-3-8B@"+commit || out[0].Digest != "" {
			t.Fatalf("resolved after the leader's pass: %+v", out)
		}
		mc = forgedMC("status.active", uri)
		active, _, _ := rollouts(mc, mc.Status.Resolved, nil, time.Now())
		if len(active) != 1 || active[0].URI != "hf://meta-llama/Llama-3-8B@"+commit {
			t.Fatalf("active after the leader's pass: %+v", active)
		}
	}
	// A legitimate entry stays as it was, folder checksum included.
	mc := forgedMC("status.resolved", "hf://meta-llama/Llama-3-8B@"+commit)
	mc.Status.Resolved[0].Digest = digest1
	s := &Syncer{cfg: Config{NodeName: "n1", Now: time.Now}, node: resolvingNode{}, log: discard, polled: map[string]time.Time{}}
	if out, _ := s.resolveAll(context.Background(), mc); len(out) != 1 || out[0].Digest != digest1 {
		t.Fatalf("%+v", out)
	}
}

// TestFolderChecksumNeedsTwoNodes: one node's report does not set the
// cluster's folder checksum; two nodes that agree do; two that disagree
// do not (until a second one agrees with either).
func TestFolderChecksumNeedsTwoNodes(t *testing.T) {
	uri := "https://models.example/w.bin"
	res := []ResolvedSource{{Artifact: "m", Source: uri, URI: uri}}
	report := func(node, digest string) ModelCacheNode {
		return ModelCacheNode{ObjectMeta: metav1.ObjectMeta{Name: node}, Status: ModelCacheNodeStatus{Artifacts: []ArtifactStatus{
			{Name: "m", ModelCache: "m", Phase: string(api.PhaseReady), Source: uri, Digest: digest}}}}
	}
	digest2 := strings.Replace(digest1, "1", "2", -1)
	for _, c := range []struct {
		nodes []ModelCacheNode
		want  string
	}{
		{[]ModelCacheNode{report("a", digest1)}, ""},
		{[]ModelCacheNode{report("a", digest1), report("a", digest1)}, ""}, // one node twice is one node
		{[]ModelCacheNode{report("a", digest1), report("b", digest2)}, ""},
		{[]ModelCacheNode{report("a", digest1), report("b", digest1)}, digest1},
		{[]ModelCacheNode{report("a", digest2), report("b", digest1), report("c", digest1)}, digest1},
	} {
		if got := recordDigests(res, c.nodes)[0].Digest; got != c.want {
			t.Errorf("%d reports: recorded %q, want %q", len(c.nodes), got, c.want)
		}
	}
}
