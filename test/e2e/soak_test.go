package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
)

// TestKillSoakHundredPulls pulls 100 multi-file models (3 files each, one
// shared among many) from a loopback hub while SIGKILLing the daemon at
// random instants; after every restart `modelctl verify --fsck` must be
// clean (index ⇔ blobs ⇔ trees) and every Ready model intact; at the end
// every model is Ready, a full re-hash finds nothing, and the totals are
// printed. Bounded: at most 40 kills and 3 minutes.
func TestKillSoakHundredPulls(t *testing.T) {
	if testing.Short() {
		t.Skip("soak")
	}
	hub := hubtest.New()
	defer hub.Close()
	// The hub answers slowly (20–40 ms a request) so that the pulls span
	// many kills, which land inside resolves, downloads and commits.
	hub.Hook = func(w http.ResponseWriter, r *http.Request) bool {
		time.Sleep(time.Duration(20+rand.IntN(20)) * time.Millisecond)
		return false
	}
	const models = 100
	shared := make([][]byte, 5)
	for i := range shared {
		shared[i] = data(256<<10, byte(200+i))
	}
	var content int64
	seen := map[int]bool{}
	for i := 0; i < models; i++ {
		files := map[string][]byte{
			"config.json":           []byte(fmt.Sprintf(`{"model_type":"soak","i":%d}`, i)),
			"model.safetensors":     data(96<<10+i, byte(i)),
			"tokenizer.safetensors": shared[i%len(shared)],
		}
		hub.Commit(fmt.Sprintf("soak/m%03d", i), files, "main")
		content += int64(len(files["config.json"]) + len(files["model.safetensors"]))
		if !seen[i%len(shared)] {
			seen[i%len(shared)] = true
			content += int64(len(shared[i%len(shared)]))
		}
	}
	env := "HF_ENDPOINT=" + hub.URL()
	e := newEnv(t)
	e.start(env)
	// Queued through the API, not 100 runs of modelctl: on a loaded machine
	// those took longer than the pulls, which were all Ready before the
	// first kill.
	c := &api.Client{Socket: e.socket}
	for i := 0; i < models; i++ {
		if _, err := c.Pull(context.Background(), api.PullRequest{Name: fmt.Sprintf("m%03d", i), URI: fmt.Sprintf("hf://soak/m%03d", i)}, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(3 * time.Minute)
	kills, fscks := 0, 0
	readyCount := func() int {
		return strings.Count(e.mustCtl("list"), " Ready ")
	}
	for kills < 40 && time.Now().Before(deadline) {
		time.Sleep(time.Duration(50+rand.IntN(250)) * time.Millisecond)
		if readyCount() == models {
			break
		}
		e.kill()
		kills++
		e.start(env)
		if r := e.ctl(nil, "verify", "--fsck"); r.code != 0 {
			t.Fatalf("fsck after kill %d: %s%s\ndaemon log:\n%s", kills, r.stdout, r.stderr, e.log)
		}
		fscks++
		checkReady(t, e)
	}
	for i := 0; i < models; i++ {
		e.mustCtl("wait", fmt.Sprintf("m%03d", i), "--timeout", "120s")
	}
	fsck(t, e) // full re-hash: 0 corrupt, 0 missing; every tree intact
	if r := e.ctl(nil, "verify", "--fsck"); r.code != 0 {
		t.Fatalf("final fsck: %s", r.stdout)
	}
	t.Logf("pulls %d, kills %d, fscks clean %d, corrupt artifacts 0; bytes sent %d for %d bytes of distinct content (re-fetched after resume or re-resolve: %d)",
		models, kills, fscks, hub.Sent.Load(), content, hub.Sent.Load()-content)
	if kills == 0 {
		t.Fatal("the soak never killed the daemon: it proves nothing")
	}
}
