package capacity

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// fakeStore keeps artifacts in memory; GC frees blob bytes in fakeFS.
type fakeStore struct {
	arts    []cachestore.Artifact
	failing map[string]bool // name@rev whose Evict fails
	fs      *fakeFS
	evicted []string
}

func (f *fakeStore) List() ([]cachestore.Artifact, error)          { return f.arts, nil }
func (f *fakeStore) ListSummaries() ([]cachestore.Artifact, error) { return f.arts, nil }

func (f *fakeStore) Evict(_ context.Context, name, rev string, _ bool) ([]string, error) {
	if f.failing[Key(name, rev)] {
		return nil, errors.New("disk I/O error")
	}
	for i, a := range f.arts {
		if a.Name != name {
			continue
		}
		for j, v := range a.Versions {
			if v.Revision == rev {
				f.arts[i].Versions = append(a.Versions[:j:j], a.Versions[j+1:]...)
				if a.Current == rev {
					f.arts[i].Current = ""
				}
				f.evicted = append(f.evicted, Key(name, rev))
				return []string{rev}, nil
			}
		}
	}
	return nil, cachestore.ErrNotFound
}

func (f *fakeStore) used() map[string]int64 {
	u := map[string]int64{}
	for _, a := range f.arts {
		for _, v := range a.Versions {
			for _, e := range v.Manifest {
				u[e.Digest] = e.Size
			}
		}
	}
	return u
}

func (f *fakeStore) StoreBytes() (int64, error) {
	var n int64
	for _, s := range f.fs.blobs {
		n += s
	}
	return n, nil
}

func (f *fakeStore) GC(context.Context) (*cachestore.GCReport, error) {
	u := f.used()
	rep := &cachestore.GCReport{}
	for d, s := range f.fs.blobs {
		if _, ok := u[d]; !ok {
			delete(f.fs.blobs, d)
			rep.BytesFreed += s
			rep.BlobsRemoved++
		}
	}
	return rep, nil
}

// fakeFS: a filesystem of capacity bytes holding other + the blobs.
type fakeFS struct {
	capacity, other int64
	blobs           map[string]int64
}

func (f *fakeFS) FSStat() (int64, int64, error) {
	used := f.other
	for _, s := range f.blobs {
		used += s
	}
	return f.capacity, f.capacity - used, nil
}

// ver builds a version of one blob named after it.
func ver(rev string, blob string, size int64, created, used time.Duration, pinned bool) cachestore.Version {
	return cachestore.Version{
		Revision: rev, Pinned: pinned, Created: t0.Add(created), LastUsed: t0.Add(used),
		Manifest: cachestore.Manifest{{Path: "w", Digest: blob, Size: size}},
	}
}

func TestAssess(t *testing.T) {
	p := Policy{HighPercent: 85, LowPercent: 80}
	for _, tc := range []struct {
		store, capa, free, need int64
		high, quota             bool
		pol                     Policy
	}{
		{store: 50, capa: 1000, free: 200, pol: p},                        // 80% used: below high
		{store: 50, capa: 1000, free: 100, need: 100, high: true, pol: p}, // 90% → free to 80%
		{store: 900, capa: 10000, free: 9000, need: 900 - 752, quota: true, pol: Policy{QuotaBytes: 800, HighPercent: 85, LowPercent: 80}},
		{store: 900, capa: 1000, free: 50, need: 150, high: true, quota: true, pol: Policy{QuotaBytes: 890, HighPercent: 85, LowPercent: 80}},
		{store: 999, capa: 1000, free: 0, pol: Policy{}}, // no marks, no quota: never pressure
	} {
		pr := tc.pol.Assess(tc.store, tc.capa, tc.free)
		if pr.Need != tc.need || pr.AboveHigh != tc.high || pr.OverQuota != tc.quota {
			t.Errorf("Assess(%d,%d,%d) with %+v = %+v; want need %d high %v quota %v", tc.store, tc.capa, tc.free, tc.pol, pr, tc.need, tc.high, tc.quota)
		}
	}
}

func TestValidateAndParse(t *testing.T) {
	for _, p := range []Policy{{HighPercent: 80, LowPercent: 85}, {HighPercent: 101}, {LowPercent: 5}, {QuotaBytes: -1}, {MinAge: -1}, {KeepRevisions: -2}} {
		if p.Validate() == nil {
			t.Errorf("policy %+v accepted", p)
		}
	}
	if err := DefaultPolicy().Validate(); err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]int64{"1024": 1024, "2Ki": 2048, "1.5Gi": 3 << 29, "500G": 500e9, "1TiB": 1 << 40, "3M": 3e6} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "lots", "-1", "5X"} {
		if _, err := ParseBytes(bad); err == nil {
			t.Errorf("ParseBytes(%q) accepted", bad)
		}
	}
}

// TestEvictionPass covers ordering, pins, in-use, min age, hysteresis,
// shared blobs and per-item failure, table-driven.
func TestEvictionPass(t *testing.T) {
	hour := time.Hour
	type tc struct {
		name    string
		arts    []cachestore.Artifact
		inUse   []string
		failing []string
		desired []string
		other   int64 // non-store bytes on a 1000-byte filesystem
		policy  Policy
		want    []string // evicted, in order
		short   bool
		failed  int
	}
	art := func(name, cur string, vs ...cachestore.Version) cachestore.Artifact {
		return cachestore.Artifact{Name: name, Current: cur, Versions: vs}
	}
	base := Policy{HighPercent: 85, LowPercent: 80, MinAge: 10 * time.Minute}
	for _, c := range []tc{
		{
			name:   "below the high mark nothing goes",
			arts:   []cachestore.Artifact{art("a", "r", ver("r", "A", 100, 0, hour, false))},
			other:  600, // 70% used
			policy: base,
		},
		{
			name: "LRU first, down to the low mark (hysteresis), no further",
			arts: []cachestore.Artifact{
				art("a", "r", ver("r", "A", 100, 0, 3*hour, false)),
				art("b", "r", ver("r", "B", 100, 0, 1*hour, false)),
				art("c", "r", ver("r", "C", 100, 0, 2*hour, false)),
			},
			other:  600, // 90% used: need 100 to reach 80%
			policy: base,
			want:   []string{"b@r"},
		},
		{
			name: "ties in last use broken by first seen",
			arts: []cachestore.Artifact{
				art("a", "r", ver("r", "A", 100, 2*time.Minute-hour, hour, false)),
				art("b", "r", ver("r", "B", 100, time.Minute-hour, hour, false)),
			},
			other:  700,
			policy: base,
			want:   []string{"b@r"},
		},
		{
			name: "pinned, in-use and too young versions stay; what could not be freed is reported",
			arts: []cachestore.Artifact{
				art("pinned", "r", ver("r", "P", 100, 0, 0, true)),
				art("busy", "r", ver("r", "U", 100, 0, 0, false)),
				art("young", "r", ver("r", "Y", 100, 2*hour-time.Minute, 0, false)),
				art("old", "r", ver("r", "O", 100, 0, hour, false)),
			},
			inUse:  []string{"busy@r"},
			other:  500, // 90%: need 100... plus more below
			policy: Policy{HighPercent: 85, LowPercent: 60, MinAge: 10 * time.Minute},
			want:   []string{"old@r"},
			short:  true,
		},
		{
			name: "old revisions before current versions, desired current versions last",
			arts: []cachestore.Artifact{
				art("m", "new", ver("new", "N", 100, 0, 3*hour, false), ver("old", "O", 100, 0, 3*hour, false)),
				art("wanted", "r", ver("r", "W", 100, 0, hour, false)),
				art("stray", "r", ver("r", "S", 100, 0, 2*hour, false)),
			},
			desired: []string{"wanted", "m"},
			other:   500, // 90%: need 100; keepRevisions 1 keeps "old" out of the age plan
			policy:  Policy{HighPercent: 85, LowPercent: 80, MinAge: time.Minute, KeepRevisions: 1},
			want:    []string{"m@old"},
		},
		{
			name: "a shared blob frees nothing until its last user goes",
			arts: []cachestore.Artifact{
				art("a", "r", ver("r", "S", 100, 0, hour, false)),
				art("b", "r", ver("r", "S", 100, 0, 2*hour, false)),
				art("c", "r", ver("r", "C", 100, 0, 3*hour, false)),
			},
			other:  700, // 90%: need 100
			policy: base,
			want:   []string{"a@r", "b@r"},
		},
		{
			name: "a failing eviction is reported and the pass goes on",
			arts: []cachestore.Artifact{
				art("a", "r", ver("r", "A", 100, 0, hour, false)),
				art("b", "r", ver("r", "B", 100, 0, 2*hour, false)),
			},
			failing: []string{"a@r"},
			other:   700,
			policy:  base,
			want:    []string{"b@r"},
			failed:  1,
		},
		{
			name: "old revisions go by age when unused, whatever the pressure",
			arts: []cachestore.Artifact{
				art("m", "r3", ver("r3", "3", 10, 2*hour, 2*hour, false), ver("r2", "2", 10, hour, hour, false), ver("r1", "1", 10, 0, 0, false)),
			},
			policy: Policy{MinAge: time.Minute, KeepRevisions: 1},
			want:   []string{"m@r1"},
		},
		{
			name: "quota: over it, free to quota × low/high",
			arts: []cachestore.Artifact{
				art("a", "r", ver("r", "A", 300, 0, hour, false)),
				art("b", "r", ver("r", "B", 300, 0, 2*hour, false)),
				art("c", "r", ver("r", "C", 300, 0, 3*hour, false)),
			},
			policy: Policy{QuotaBytes: 850, HighPercent: 85, LowPercent: 80, MinAge: time.Minute}, // low point 800: evict 1
			want:   []string{"a@r"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			fs := &fakeFS{capacity: 1000, other: c.other, blobs: map[string]int64{}}
			st := &fakeStore{arts: c.arts, fs: fs, failing: map[string]bool{}}
			for _, a := range c.arts {
				for _, v := range a.Versions {
					for _, e := range v.Manifest {
						fs.blobs[e.Digest] = e.Size
					}
				}
			}
			if c.policy.QuotaBytes > 0 && c.other == 0 {
				fs.capacity = 100000
			}
			for _, f := range c.failing {
				st.failing[f] = true
			}
			inUse := map[string][]api.Holder{}
			for _, k := range c.inUse {
				inUse[k] = []api.Holder{{Kind: "process", ID: "pid 1 (test)"}}
			}
			desired := map[string]bool{}
			for _, n := range c.desired {
				desired[n] = true
			}
			e := &Evictor{Policy: c.policy, Store: st, FS: fs, Now: func() time.Time { return t0.Add(2 * hour) },
				InUse: func() map[string][]api.Holder { return inUse }, Desired: func() map[string]bool { return desired }}
			rep, err := e.Run(context.Background(), Pass{})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(st.evicted, c.want) && !(len(st.evicted) == 0 && len(c.want) == 0) {
				t.Fatalf("evicted %v, want %v (report %+v)", st.evicted, c.want, rep)
			}
			if (rep.Short > 0) != c.short {
				t.Fatalf("short %d, want short=%v", rep.Short, c.short)
			}
			if len(rep.Failed) != c.failed {
				t.Fatalf("failed %v, want %d", rep.Failed, c.failed)
			}
			if c.failed > 0 && !strings.Contains(rep.Failed[0], "disk I/O error") {
				t.Fatalf("failure not reported with its cause: %v", rep.Failed)
			}
		})
	}
}

func TestRoom(t *testing.T) {
	p := Policy{HighPercent: 85, LowPercent: 80, QuotaBytes: 500}
	if r := p.Room(400, 1000, 300); r != 100 { // quota headroom 100 < 300-150
		t.Fatalf("room %d, want 100", r)
	}
	if r := p.Room(0, 1000, 100); r != 0 { // already above high
		t.Fatalf("room %d, want 0", r)
	}
}

// TestScanFindsOpenAndMappedFiles runs the scanner over this process:
// files it holds open under a fake root, in a public tree and in a
// private one (under private/), are found and mapped back.
func TestScanFindsOpenAndMappedFiles(t *testing.T) {
	root := t.TempDir()
	for _, p := range []string{filepath.Join(root, "models", "m", "rev1", "w.bin"), filepath.Join(root, "private", "models", "p", "rev2", "w.bin")} {
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, []byte("weights"), 0o644)
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
	}
	s := &Scanner{Root: root}
	uses, st, err := s.Scan()
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, u := range uses {
		if n, r, ok := VersionOf(u.Rel); ok {
			found = append(found, fmt.Sprintf("%s@%s %s", n, r, u.Holder.ID[:4]))
		}
	}
	sort.Strings(found)
	if len(found) != 2 || found[0] != "m@rev1 pid " || found[1] != "p@rev2 pid " || st.Processes == 0 {
		t.Fatalf("scan found %v (%+v)", found, st)
	}
	if d, ok := BlobOf("blobs/sha256/ab/" + strings.Repeat("ab", 32)); !ok || d != "sha256:"+strings.Repeat("ab", 32) {
		t.Fatal("BlobOf")
	}
	if _, _, ok := VersionOf("models/m/current/w.bin"); ok {
		t.Fatal("a path through current must not name a revision")
	}
}

// TestSpareDeclared: admission (SpareDeclared) may take ad-hoc entries,
// least recently used first, never a declared model; pressure may take
// both, declared last.
func TestSpareDeclared(t *testing.T) {
	in := Inputs{
		Now: t0.Add(time.Hour), Policy: Policy{},
		Artifacts: []cachestore.Artifact{
			{Name: "wanted", Current: "r", Versions: []cachestore.Version{ver("r", "W", 100, 0, 0, false)}},
			{Name: "casual", Current: "r", Versions: []cachestore.Version{ver("r", "C", 30, 0, 2*time.Minute, false)}},
			{Name: "older", Current: "r", Versions: []cachestore.Version{ver("r", "O", 20, 0, time.Minute, false)}},
			{Name: "stray", Current: "r", Versions: []cachestore.Version{ver("r", "S", 50, 0, 3*time.Minute, false)}},
		},
		Desired:  map[string]bool{"wanted": true, "casual": true, "older": true},
		Declared: map[string]bool{"wanted": true},
	}
	if n := Evictable(in); n != 200 {
		t.Fatalf("under pressure everything eligible counts: %d", n)
	}
	vs, _ := PlanSpace(in, 200, nil)
	if got := victimNames(vs); got != "stray older casual wanted" {
		t.Fatalf("pressure order %q: the unwanted first, then ad-hoc LRU, declared last", got)
	}
	in.SpareDeclared = true
	if n := Evictable(in); n != 100 {
		t.Fatalf("making room for a pull must spare declared models, not ad-hoc ones: %d", n)
	}
	vs, _ = PlanSpace(in, 60, nil)
	if got := victimNames(vs); got != "stray older" || vs[0].AdHoc || !vs[1].AdHoc {
		t.Fatalf("admission victims %q %+v: the unwanted, then the least recently used ad-hoc entry", got, vs)
	}
	tk := Takers(in, 5)
	if len(tk) != 1 || tk[0].Name != "wanted" || tk[0].Why != "declared" || tk[0].Bytes != 100 {
		t.Fatalf("takers %+v: want the declared model", tk)
	}
}

func victimNames(vs []Victim) string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Name)
	}
	return strings.Join(out, " ")
}
