// Command pullbench measures modelcached against the tools people use
// today, in one run on one machine, and prints ratios (absolute numbers
// drift on shared machines; ratios measured side by side do not).
//
//	go run ./bench/pullbench -bin bin [-size-mib 2048] [-runs 3]
//
// It serves a synthetic model (four shards + small JSON files) from a
// loopback HTTP server and alternates: curl -o of the files, modelctl pull
// with O_DIRECT, modelctl pull buffered — dropping the page cache before
// each cold run when it may (root). Then: a second artifact of the same
// files (bytes fetched, time); materializing a tree vs cp -r; the daemon's
// peak RSS and CPU per GB; modelctl list with 10,000 artifacts in the
// index; daemon restart time with them.
//
// Where to find what:
//
//	main.go         flags, the order of the scenarios, the origin's tmpfs and
//	                the synthetic model
//	daemon.go       the daemons it starts (this build's, -base-bin's in turn),
//	                modelctl, their metrics, RSS and CPU
//	http.go         the http scenario: curl -o, the reference pipeline and
//	                modelctl pull; dedup of a second artifact
//	sources.go      the hf, oci and s3 scenarios against each source's own
//	                client, and an hf revision that changes one shard
//	store.go        materialize vs cp -r, a small blob's commit, list and
//	                restart with many artifacts, eviction passes over them
//	stats.go        medians, ratios and the runs behind them
//	big.go          the one-file pull from an in-memory origin: peak RSS, CPU
//	                per GB, and the restart of a pull killed halfway
//	kernelcache.go  a signed kernel cache: modelctl pull vs crane export | tar -x
//	reference.go    the reference pipeline, the verified pull the http row
//	                compares with (run as "pullbench reference")
//	table.go        the summary table that ends a run
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

type file struct {
	name string
	size int64
	sha  string
}

var (
	binDir  = flag.String("bin", "bin", "directory with modelcached and modelctl")
	baseBin = flag.String("base-bin", os.Getenv("BENCH_BASE_BIN"), "another build's directory (e.g. main's): the hf, oci, s3 and kernelcache scenarios alternate its pulls with -bin's and print the ratio; env BENCH_BASE_BIN")
	sizeMiB = flag.Int64("size-mib", envInt("BENCH_SIZE_MIB", 2048), "model size in MiB (four shards); env BENCH_SIZE_MIB")
	runs    = flag.Int("runs", int(envInt("BENCH_RUNS", 3)), "alternating runs of each pull variant; env BENCH_RUNS")
	bigMiB  = flag.Int64("big-mib", envInt("BENCH_BIG_MIB", 4096), "size of the one-file pull for peak RSS and the kill/restart test; env BENCH_BIG_MIB")
	nArts   = flag.Int("artifacts", int(envInt("BENCH_ARTIFACTS", 10000)), "artifacts in the index for the list/restart test")
	only    = flag.String("only", os.Getenv("BENCH_ONLY"), "run one scenario: http, big, kernelcache, list, hf, oci or s3 (default: all); env BENCH_ONLY")
	workDir = flag.String("dir", os.Getenv("BENCH_DIR"), "scratch directory (default: a temp dir on the same filesystem as /var/tmp)")
)

func envInt(k string, def int64) int64 {
	if v, err := strconv.ParseInt(os.Getenv(k), 10, 64); err == nil {
		return v
	}
	return def
}

// cleanup runs, last first, when must ends the bench on an error (the
// deferred calls do not run on os.Exit): it stops the daemons started,
// unmounts the origins' tmpfs and removes the scratch directory, so a
// failed run leaves no daemon or mount behind.
var cleanup []func()

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "pullbench:", err)
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
		os.Exit(1)
	}
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "reference" {
		referenceMain(os.Args[2:])
		return
	}
	flag.Parse()
	dir := *workDir
	if dir == "" {
		d, err := os.MkdirTemp("/var/tmp", "pullbench-")
		must(err)
		dir = d
	}
	defer os.RemoveAll(dir)
	cleanup = append(cleanup, func() { os.RemoveAll(dir) })
	fmt.Printf("pullbench: model %d MiB in 4 shards + 2 JSON files, %d alternating runs, scratch %s\n", *sizeMiB, *runs, dir)
	canDrop := dropCaches() == nil
	if !canDrop {
		fmt.Println("note: cannot drop the page cache (not root): cold runs are warm on the server side")
	}

	origin := originDir(dir)
	defer syscall.Unmount(origin, 0)
	cleanup = append(cleanup, func() { syscall.Unmount(origin, 0) })

	switch *only {
	case "", "http":
	case "big":
		bigPull(dir, *bigMiB, canDrop)
		printTable()
		return
	case "kernelcache":
		kernelCacheBench(dir, origin, canDrop)
		printTable()
		return
	case "list":
		listAndRestart(dir, *nArts)
		printTable()
		return
	case "s3", "hf", "oci":
		src := filepath.Join(origin, "src")
		files := makeModel(src, *sizeMiB<<20)
		map[string]func(dir, src string, files []file, canDrop bool){"s3": s3Bench, "hf": hfBench, "oci": ociBench}[*only](dir, src, files, canDrop)
		printTable()
		return
	default:
		must(fmt.Errorf("-only %q: the scenarios that run alone are http, big, kernelcache, list, hf, oci and s3", *only))
	}
	src := filepath.Join(origin, "src")
	files := makeModel(src, *sizeMiB<<20)
	if *only == "http" {
		httpBench(dir, src, files, canDrop)
		printTable()
		return
	}
	httpBench(dir, src, files, canDrop)
	defer printTable()
	bigPull(dir, *bigMiB, canDrop)

	hfBench(dir, src, files, canDrop)
	ociBench(dir, src, files, canDrop)
	s3Bench(dir, src, files, canDrop)
	kernelCacheBench(dir, origin, canDrop)
	materializeVsCp(dir, src, files)
	listAndRestart(dir, *nArts)
}

// originDir is where the origins keep their data: a tmpfs under dir
// (root only), so that an origin serves from memory as a real one across
// the network would, and the node's disk carries only the pull's writes.
// The model and one origin's copy of it fit (2 × size + slack). Without
// root it is a plain directory and the run says so.
func originDir(dir string) string {
	o := filepath.Join(dir, "origin")
	must(os.MkdirAll(o, 0o755))
	size := fmt.Sprintf("size=%dm", 2**sizeMiB+512)
	if err := syscall.Mount("tmpfs", o, "tmpfs", 0, size); err != nil {
		fmt.Printf("note: origins serve from the same disk as the store (tmpfs: %v): cold reads of the origin share the disk\n", err)
	} else {
		fmt.Printf("origins serve from tmpfs (%s); the store is on %s\n", size, dir)
	}
	return o
}

func dropCaches() error {
	syscall.Sync()
	return os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
}

func coldPrep(can bool) {
	if can {
		dropCaches()
	}
}

// makeModel writes four shards of pseudo-random bytes and two JSON files.
func makeModel(dir string, size int64) []file {
	must(os.MkdirAll(dir, 0o755))
	var out []file
	rng := rand.NewChaCha8([32]byte{1, 2, 3})
	buf := make([]byte, 4<<20)
	for i := 1; i <= 4; i++ {
		name := fmt.Sprintf("model-%05d-of-00004.safetensors", i)
		f, err := os.Create(filepath.Join(dir, name))
		must(err)
		h := sha256.New()
		left := size / 4
		for left > 0 {
			n := min(int64(len(buf)), left)
			rng.Read(buf[:n])
			f.Write(buf[:n])
			h.Write(buf[:n])
			left -= n
		}
		must(f.Close())
		out = append(out, file{name, size / 4, hex.EncodeToString(h.Sum(nil))})
	}
	for _, j := range []struct{ name, body string }{
		{"config.json", `{"architectures":["LlamaForCausalLM"],"torch_dtype":"bfloat16"}`},
		{"model.safetensors.index.json", `{"metadata":{"total_size":` + strconv.FormatInt(size, 10) + `}}`},
	} {
		must(os.WriteFile(filepath.Join(dir, j.name), []byte(j.body), 0o644))
		s := sha256.Sum256([]byte(j.body))
		out = append(out, file{j.name, int64(len(j.body)), hex.EncodeToString(s[:])})
	}
	return out
}
