package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers/oci/ocitest"
	"github.com/modelcache/modelcache/internal/testenv"
)

// kernelCacheBench pushes a signed Triton kernel cache image (MCV layout,
// one tar+gzip layer; BENCH_KC_MIB, default 500 MiB of cubins) to
// docker-registry and compares modelctl pull --kind kernelcache (signature
// check, compatibility check, digest check, extraction, fsync, commit) with
// crane export | tar -x (extraction only), both followed by sync. The
// registry keeps its data on the origin tmpfs (originDir), as the oci
// scenario's does.
func kernelCacheBench(dir, origin string, canDrop bool) {
	reg, err1 := testenv.Tool("docker-registry")
	crane, err2 := testenv.Tool("crane")
	cosign, err3 := testenv.Tool("cosign")
	if err1 != nil || err2 != nil || err3 != nil {
		fmt.Println("kernel cache: docker-registry, crane or cosign missing; skipped (see .ci/run)")
		return
	}
	mib := int64(500)
	if s := os.Getenv("BENCH_KC_MIB"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		must(err)
		mib = n
	}
	host, stop, err := testenv.StartRegistry(reg, origin)
	must(err)
	defer stop()

	// 2.5 MiB cubins, pseudo-random (they do not compress, as real cubins
	// barely do), in the MCV layout the tests use (ocitest).
	rng := rand.NewChaCha8([32]byte{7})
	const per = 5 << 19
	n := int(mib << 20 / per)
	var total int64
	kc := ocitest.KernelCache{Files: map[string][]byte{}}
	for i := 0; i < n; i++ {
		buf := make([]byte, per)
		rng.Read(buf)
		h := fmt.Sprintf("%064x", i)
		kc.Files[h+"/kernel.cubin"] = buf
		total += per
		kc.Entries = append(kc.Entries, ocitest.Entry{Hash: h, Backend: "cuda", Arch: 90, WarpSize: 32, PTXVersion: 83})
	}
	img, err := kc.Build()
	must(err)
	kc = ocitest.KernelCache{}
	ref, err := name.ParseReference(host+"/bench/kernels:sm90", name.Insecure)
	must(err)
	must(remote.Write(ref, img))
	dg, _ := img.Digest()
	keys := filepath.Join(dir, "kckeys")
	os.MkdirAll(keys, 0o755)
	sign := func(args ...string) {
		c := exec.Command(cosign, args...)
		c.Dir = keys
		c.Env = append(os.Environ(), "COSIGN_PASSWORD=", "HOME="+keys)
		if out, err := c.CombinedOutput(); err != nil {
			must(fmt.Errorf("cosign %v: %v %s", args, err, out))
		}
	}
	sign("generate-key-pair")
	sign("sign", "--yes", "--key", "cosign.key", "--tlog-upload=false", "--allow-http-registry", host+"/bench/kernels@"+dg.String())
	inv := filepath.Join(dir, "kc-gpus.json")
	os.WriteFile(inv, []byte(`{"cudaDriverVersion":"12.4","devices":[{"name":"NVIDIA H100","uuid":"GPU-b","computeCapability":"9.0"}]}`), 0o644)

	timed := func(run func()) float64 {
		coldPrep(canDrop)
		t0 := time.Now()
		run()
		syscall.Sync()
		return time.Since(t0).Seconds()
	}
	var mc, base, peer []float64
	var stages []map[string]float64
	for i := 0; i < *runs; i++ {
		baseToo(&mc, &base, func() float64 {
			daemonArgs = []string{"--gpu-inventory", inv, "--insecure-registry", host}
			d := startDaemon(filepath.Join(dir, "kcroot"), filepath.Join(dir, "kc.sock"), true)
			daemonArgs = nil
			defer func() { d.stop(); os.RemoveAll(filepath.Join(dir, "kcroot")) }()
			x := timed(func() {
				d.ctl("pull", "--kind", "kernelcache", "--key", filepath.Join(keys, "cosign.pub"), "--name", "kc", "oci://"+host+"/bench/kernels:sm90")
			})
			if !useBase {
				stages = append(stages, d.stages())
			}
			return x
		})
		out := filepath.Join(dir, "kcpeer")
		os.MkdirAll(out, 0o755)
		peer = append(peer, timed(func() {
			c := exec.Command("sh", "-c", fmt.Sprintf("%s export --insecure %s/bench/kernels:sm90 - | tar -x -C %s", crane, host, out))
			if b, err := c.CombinedOutput(); err != nil {
				must(fmt.Errorf("crane export | tar -x: %v %s", err, b))
			}
		}))
		os.RemoveAll(out)
	}
	fmt.Printf("kernel cache of %s (%d cubins, one tar+gzip layer) from docker-registry on loopback (seconds incl. sync, median of %d):\n", api.FormatBytes(total), n, *runs)
	fmt.Printf("  modelctl pull --kind kernelcache (verify signature, check GPUs, sha256, extract, fsync, commit)  %.2f  %v\n", median(mc), secs(mc))
	addRow(fmt.Sprintf("signed kernel cache of %s: pull+verify+extract", api.FormatBytes(total)), fmt.Sprintf("%.2f s", median(mc)), fmt.Sprintf("crane export | tar -x %.2f s", median(peer)), fmt.Sprintf("%.2fx time", median(ratios(mc, peer))))
	fmt.Printf("  crane export | tar -x (extract only)                                                        %.2f  %v  modelctl takes %.2fx its time\n", median(peer), secs(peer), median(ratios(mc, peer)))
	fmt.Printf("  where modelctl's seconds go (the daemon's modelcache_pull_stage_seconds; the layer's download is read/hash/write/fsync/commit): %s\n", stageLine(stages))
	if len(base) > 0 {
		fmt.Printf("  the base build takes %.2fx crane's time\n", median(ratios(base, peer)))
	}
	printBase("kernel cache", mc, base, false)
}

func secs(xs []float64) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = fmt.Sprintf("%.2f", x)
	}
	return out
}
