package capacity

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
)

// BenchmarkScan500Processes: the /proc scan with 500 extra processes on
// the machine, 10 files of the store held open by this one.
func BenchmarkScan500Processes(b *testing.B) { benchScan(b, 500) }

// BenchmarkScan10000Processes: the same with 10,000 processes, a busy
// node's count: every eviction decision (pressure, admission, evict) pays
// one scan first (docs/benchmarks.md).
func BenchmarkScan10000Processes(b *testing.B) { benchScan(b, 10000) }

func benchScan(b *testing.B, procs int) {
	root := b.TempDir()
	var cmds []*exec.Cmd
	for i := 0; i < procs; i++ {
		c := exec.Command("sleep", "300")
		if err := c.Start(); err != nil {
			b.Fatal(err)
		}
		cmds = append(cmds, c)
	}
	defer func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
	}()
	for i := 0; i < 10; i++ {
		p := filepath.Join(root, "models", fmt.Sprintf("m%d", i), "r", "w.bin")
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte("w"), 0o644)
		f, _ := os.Open(p)
		defer f.Close()
	}
	s := &Scanner{Root: root}
	b.ResetTimer()
	var st ScanStats
	for i := 0; i < b.N; i++ {
		var err error
		_, st, err = s.Scan()
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(st.Processes), "processes")
	if st.Uses < 10 {
		b.Fatalf("scan found %d uses, want 10", st.Uses)
	}
}

// BenchmarkEvictionPlan10000: planning a pass (old revisions, then space
// down to the low mark, and the evictable total admission asks for) over
// 10,000 artifacts of 6 files each, 500 of them with an old revision.
func BenchmarkEvictionPlan10000(b *testing.B) {
	in := Inputs{Now: t0.Add(100 * time.Hour), Policy: Policy{HighPercent: 85, LowPercent: 80, MinAge: time.Minute}, InUse: map[string][]api.Holder{}, Desired: map[string]bool{}}
	for i := 0; i < 10000; i++ {
		a := cachestore.Artifact{Name: fmt.Sprintf("model-%05d", i), Current: "r2"}
		mk := func(rev string) cachestore.Version {
			v := cachestore.Version{Revision: rev, Created: t0.Add(time.Duration(i) * time.Second), LastUsed: t0.Add(time.Duration(i%997) * time.Minute)}
			for j := 0; j < 6; j++ {
				v.Manifest = append(v.Manifest, cachestore.Entry{Path: fmt.Sprint(j), Digest: fmt.Sprintf("sha256:%s-%d-%d", rev, i, j), Size: 1 << 20})
			}
			return v
		}
		a.Versions = append(a.Versions, mk("r2"))
		if i%20 == 0 {
			a.Versions = append(a.Versions, mk("r1"))
		}
		if i%3 == 0 {
			in.Desired[a.Name] = true
		}
		in.Artifacts = append(in.Artifacts, a)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		old := PlanRevisions(in)
		if len(old) != 500 {
			b.Fatalf("old revisions %d", len(old))
		}
		PlanSpace(in, 20<<30, old)
		Evictable(in)
	}
}
