package capacity

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/modelcache/modelcache/cachestore"
)

// TestReclaimBeforeVersions: under pressure, partial downloads that no
// pull is writing go first; versions are evicted only for what is still
// needed after them, and not at all when they were enough.
func TestReclaimBeforeVersions(t *testing.T) {
	hour := time.Hour
	for _, c := range []struct {
		name    string
		partial int64 // reclaimable bytes among the filesystem's other bytes
		asked   int64 // what Reclaim should be asked for
		want    []string
	}{
		{name: "the partials are enough: no version goes", partial: 150, asked: 100},
		{name: "not enough: the least recently used version goes for the rest", partial: 40, asked: 100, want: []string{"b@r"}},
		{name: "nothing to reclaim", partial: 0, asked: 100, want: []string{"b@r"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			arts := []cachestore.Artifact{
				{Name: "a", Current: "r", Versions: []cachestore.Version{ver("r", "A", 100, 0, 2*hour, false)}},
				{Name: "b", Current: "r", Versions: []cachestore.Version{ver("r", "B", 100, 0, hour, false)}},
			}
			fs := &fakeFS{capacity: 1000, other: 700, blobs: map[string]int64{"A": 100, "B": 100}} // 90%: need 100 to reach 80%
			st := &fakeStore{arts: arts, fs: fs, failing: map[string]bool{}}
			var asked []int64
			e := &Evictor{Policy: Policy{HighPercent: 85, LowPercent: 80, MinAge: time.Minute}, Store: st, FS: fs,
				Now: func() time.Time { return t0.Add(3 * hour) },
				Reclaim: func(_ context.Context, need int64, _ Pass) (int64, error) {
					asked = append(asked, need)
					if len(st.evicted) > 0 {
						t.Error("Reclaim called after a version was evicted")
					}
					fs.other -= c.partial
					return c.partial, nil
				}}
			rep, err := e.Run(context.Background(), Pass{})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(asked, []int64{c.asked}) {
				t.Fatalf("Reclaim asked for %v, want [%d]", asked, c.asked)
			}
			if !reflect.DeepEqual(st.evicted, c.want) && !(len(st.evicted) == 0 && len(c.want) == 0) {
				t.Fatalf("evicted %v, want %v (report %+v)", st.evicted, c.want, rep)
			}
			if rep.IngestBytesFreed != c.partial {
				t.Fatalf("report says %d ingest bytes freed, want %d", rep.IngestBytesFreed, c.partial)
			}
		})
	}

	// Without pressure nothing is reclaimed.
	fs := &fakeFS{capacity: 1000, other: 100, blobs: map[string]int64{}}
	e := &Evictor{Policy: DefaultPolicy(), Store: &fakeStore{fs: fs}, FS: fs, Now: func() time.Time { return t0 },
		Reclaim: func(context.Context, int64, Pass) (int64, error) { t.Fatal("Reclaim without pressure"); return 0, nil }}
	if _, err := e.Run(context.Background(), Pass{}); err != nil {
		t.Fatal(err)
	}
}
