package daemon

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
)

// TestCSIMeasurePublish measures NodePublishVolume → a readable mount for
// a Ready model of MODELCACHE_CSI_MEASURE_MIB MiB (2048 for the issue's
// 2 GiB), once and for 100 pods of one node. It is a measurement, not a
// check: it runs only when asked.
//
//	MODELCACHE_CSI_MEASURE_MIB=2048 go test ./daemon -run TestCSIMeasurePublish -v
func TestCSIMeasurePublish(t *testing.T) {
	mib, _ := strconv.Atoi(os.Getenv("MODELCACHE_CSI_MEASURE_MIB"))
	if mib <= 0 {
		t.Skip("set MODELCACHE_CSI_MEASURE_MIB (e.g. 2048) to measure")
	}
	cfg := csiConfig(t)
	src := filepath.Join(t.TempDir(), "model")
	os.MkdirAll(src, 0o755)
	f, err := os.Create(filepath.Join(src, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	chunk := data(1<<20, 3)
	for i := 0; i < mib; i++ {
		chunk[0], chunk[1] = byte(i), byte(i>>8) // no two MiB alike
		if _, err := f.Write(chunk); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	os.WriteFile(filepath.Join(src, "config.json"), []byte(`{"architectures":["LlamaForCausalLM"]}`), 0o644)
	r := startCSI(t, cfg)
	defer r.stop()
	t0 := time.Now()
	if _, err := r.pull(api.PullRequest{Name: "big", URI: "file://" + src}); err != nil {
		t.Fatal(err)
	}
	t.Logf("pull of %d MiB (for scale): %s", mib, time.Since(t0).Round(time.Millisecond))

	readable := func(target string) {
		f, err := os.Open(filepath.Join(target, "model.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		var b [4096]byte
		if _, err := io.ReadFull(f, b[:]); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	var lat []time.Duration
	var targets []string
	start := time.Now()
	for i := 0; i < 101; i++ {
		target := r.target(fmt.Sprintf("pod-%03d", i), "model")
		t1 := time.Now()
		if err := r.publish(fmt.Sprintf("vol-%03d", i), target, map[string]string{"modelCache": "big"}); err != nil {
			t.Fatal(err)
		}
		readable(target)
		lat = append(lat, time.Since(t1))
		targets = append(targets, target)
		if i == 0 {
			t.Logf("first publish → readable mount of a Ready %d MiB model: %s", mib, lat[0])
			start = time.Now()
		}
	}
	total := time.Since(start)
	rest := append([]time.Duration(nil), lat[1:]...)
	sort.Slice(rest, func(i, j int) bool { return rest[i] < rest[j] })
	t.Logf("100 more pods of the same model, one after another: %s total, p50 %s, p99 %s, max %s", total.Round(time.Microsecond), rest[49], rest[98], rest[99])
	t.Logf("holders of big: %d", len(holders(t, r.harness, "big")))
	u0 := time.Now()
	for i, tg := range targets {
		if err := r.unpublish(fmt.Sprintf("vol-%03d", i), tg); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("101 unpublishes: %s", time.Since(u0).Round(time.Microsecond))
}
