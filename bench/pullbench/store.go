package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/capacity"
)

// materializeVsCp times building a tree of hardlinks for the model against
// cp -r of the same files, alternating.
func materializeVsCp(dir, src string, files []file) {
	root := filepath.Join(dir, "mroot")
	st, _, err := cachestore.Open(context.Background(), root)
	must(err)
	defer func() { st.Close(); os.RemoveAll(root) }()
	var m cachestore.Manifest
	for _, f := range files {
		fh, err := os.Open(filepath.Join(src, f.name))
		must(err)
		d, err := st.Ingest(context.Background(), f.name, fh, f.size, "sha256:"+f.sha)
		fh.Close()
		must(err)
		m = append(m, cachestore.Entry{Path: f.name, Digest: d, Size: f.size})
	}
	var mat, cp []float64
	for i := 0; i < 5; i++ {
		t0 := time.Now()
		_, err := st.CommitVersion(context.Background(), cachestore.VersionSpec{Name: fmt.Sprintf("tree-%d", i), Revision: "r", Manifest: m})
		must(err)
		mat = append(mat, time.Since(t0).Seconds())
		dst := filepath.Join(dir, fmt.Sprintf("cp-%d", i))
		t0 = time.Now()
		must(exec.Command("cp", "-r", src, dst).Run())
		syscall.Sync()
		cp = append(cp, time.Since(t0).Seconds())
		os.RemoveAll(dst)
	}
	fmt.Printf("materialize %d-file tree (hardlinks + rename + fsync + index): %.2f ms; cp -r (+sync): %.0f ms; %.0fx faster\n",
		len(files), median(mat)*1e3, median(cp)*1e3, median(cp)/median(mat))
	addRow("materialize a model tree from the store", fmt.Sprintf("%.2f ms", median(mat)*1e3), fmt.Sprintf("cp -r + sync %.0f ms", median(cp)*1e3), fmt.Sprintf("%.3fx time", median(mat)/median(cp)))

	// Commit of one blob: rename + directory fsync.
	var blob []float64
	for i := 0; i < 20; i++ {
		b := []byte(fmt.Sprintf("blob-%d-%d", i, time.Now().UnixNano()))
		w, err := st.Writer(context.Background(), cachestore.WriterOpts{Ref: string(b), Size: int64(len(b))})
		must(err)
		w.Write(b)
		t0 := time.Now()
		_, err = w.Commit(context.Background(), int64(len(b)), "")
		must(err)
		blob = append(blob, time.Since(t0).Seconds())
	}
	fmt.Printf("commit of one small blob (fsync, verify, rename, dir fsync, index): %.2f ms median\n", median(blob)*1e3)
}

// listAndRestart fills an index with n artifacts, then times the daemon's
// start and modelctl list.
func listAndRestart(dir string, n int) {
	root := filepath.Join(dir, "lroot")
	st, _, err := cachestore.Open(context.Background(), root)
	must(err)
	t0 := time.Now()
	for i := 0; i < n; i++ {
		b := []byte(fmt.Sprintf(`{"artifact":%d}`, i))
		d, err := st.Ingest(context.Background(), "x", bytes.NewReader(b), int64(len(b)), "")
		must(err)
		_, err = st.CommitVersion(context.Background(), cachestore.VersionSpec{Name: fmt.Sprintf("model-%05d", i), Source: "file:///seed", Manifest: cachestore.Manifest{
			{Path: "config.json", Digest: d, Size: int64(len(b))},
		}})
		must(err)
	}
	seed := time.Since(t0)
	evictionPass(st)
	st.Close()
	sock := filepath.Join(dir, "l.sock")
	var starts, lists, listsTable []float64
	for i := 0; i < 3; i++ {
		d := startDaemon(root, sock, true)
		starts = append(starts, d.start.Seconds())
		for j := 0; j < 3; j++ {
			t0 := time.Now()
			out := d.ctl("-o", "json", "list")
			lists = append(lists, time.Since(t0).Seconds())
			if j == 0 && i == 0 && bytes.Count(out, []byte(`"name"`)) < n {
				must(fmt.Errorf("list returned fewer than %d artifacts", n))
			}
			t0 = time.Now()
			d.ctl("list")
			listsTable = append(listsTable, time.Since(t0).Seconds())
		}
		d.stop()
	}
	fmt.Printf("%d artifacts in the index (seeded in %s): daemon start to healthy %.0f ms; modelctl -o json list %.0f ms; modelctl list (table) %.0f ms\n",
		n, seed.Round(time.Second), median(starts)*1e3, median(lists)*1e3, median(listsTable)*1e3)
	addRow(fmt.Sprintf("%d artifacts: daemon start / modelctl list", n), fmt.Sprintf("%.0f ms / %.0f ms", median(starts)*1e3, median(listsTable)*1e3),
		"goal: start < 1 s, list < 100 ms", fmt.Sprintf("%.2fx / %.2fx the goal", median(starts), median(listsTable)*1e3/100))
}

// evictionPass times the capacity work over the seeded index: the
// periodic pass with no pressure (summaries only), and the planning an
// admission does (every manifest read, the evictable total computed).
func evictionPass(st *cachestore.Store) {
	e := &capacity.Evictor{Policy: capacity.DefaultPolicy(), Store: st, FS: st, Now: time.Now}
	var idle, plan []float64
	for i := 0; i < 5; i++ {
		t0 := time.Now()
		_, err := e.Run(context.Background(), capacity.Pass{})
		must(err)
		idle = append(idle, time.Since(t0).Seconds())
		t0 = time.Now()
		in, err := e.Inputs()
		must(err)
		in.Now = in.Now.Add(time.Hour) // everything old enough
		capacity.Evictable(in)
		plan = append(plan, time.Since(t0).Seconds())
	}
	fmt.Printf("eviction over %d artifacts: periodic pass without pressure %.1f ms; admission planning (read all manifests, plan, evictable total) %.0f ms\n",
		len(mustList(st)), median(idle)*1e3, median(plan)*1e3)
}

func mustList(st *cachestore.Store) []cachestore.Artifact {
	l, err := st.ListSummaries()
	must(err)
	return l
}
