package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/s3/manager"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
	"github.com/modelcache/modelcache/internal/testenv"
)

// hfBench serves the model from the test hub (LFS shards redirect to a
// CDN origin) and alternates modelctl pull hf://, the official JS client's
// snapshotDownload, and curl -L of the resolve URLs. Then a revision that
// changes one shard of four: the bytes fetched.
func hfBench(dir, src string, files []file, canDrop bool) {
	hub := hubtest.New()
	defer hub.Close()
	model := map[string][]byte{}
	var total int64
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(src, f.name))
		must(err)
		model[f.name] = b
		total += int64(len(b))
	}
	sha := hub.Commit("bench/model", model, "main")
	node, nerr := exec.LookPath("node")
	js, _ := filepath.Abs("test/hfjs/check.mjs")
	if _, err := os.Stat(filepath.Join(filepath.Dir(js), "node_modules")); nerr == nil && err != nil {
		nerr = err
	}
	if nerr != nil {
		fmt.Printf("hf: the official JS client is not installed (cd test/hfjs && npm ci): %v\n", nerr)
	}
	timed := func(run func()) (float64, float64) {
		coldPrep(canDrop)
		t0 := time.Now()
		run()
		a := time.Since(t0).Seconds()
		syscall.Sync()
		return float64(total) / a, float64(total) / time.Since(t0).Seconds()
	}
	var mc, mcBase, mc1, jsNo, jsSync, curlNo, curlSync, getsPerPull []float64
	for i := 0; i < *runs; i++ {
		daemonArgs = []string{"--range-connections", "1"}
		d := startDaemon(filepath.Join(dir, "hroot"), filepath.Join(dir, "h.sock"), true, "HF_ENDPOINT="+hub.URL(), "HF_TOKEN=")
		_, x := timed(func() { d.ctl("pull", "hf://bench/model", "--name", "m") })
		mc1 = append(mc1, x)
		d.stop()
		os.RemoveAll(filepath.Join(dir, "hroot"))
		daemonArgs = nil
		baseToo(&mc, &mcBase, func() float64 {
			d := startDaemon(filepath.Join(dir, "hroot"), filepath.Join(dir, "h.sock"), true, "HF_ENDPOINT="+hub.URL(), "HF_TOKEN=")
			defer func() { d.stop(); os.RemoveAll(filepath.Join(dir, "hroot")) }()
			gets := hub.ResolveGets.Load()
			_, x := timed(func() { d.ctl("pull", "hf://bench/model", "--name", "m") })
			if !useBase {
				getsPerPull = append(getsPerPull, float64(hub.ResolveGets.Load()-gets))
			}
			return x
		})
		if i == *runs-1 {
			hfRevisionUpdate(dir, hub, model, files[1].name)
		}
		if nerr == nil {
			cache := filepath.Join(dir, "jscache")
			a, b := timed(func() {
				c := exec.Command(node, js, "download", hub.URL(), "bench/model", sha, cache)
				c.Dir = filepath.Dir(js)
				c.Stderr = os.Stderr
				must(c.Run())
			})
			jsNo, jsSync = append(jsNo, a), append(jsSync, b)
			os.RemoveAll(cache)
		}
		out := filepath.Join(dir, "hcurl")
		os.MkdirAll(out, 0o755)
		args := []string{"-sS", "--fail", "-L"}
		for _, f := range files {
			args = append(args, "-o", filepath.Join(out, f.name), hub.URL()+"/bench/model/resolve/"+sha+"/"+f.name)
		}
		a, b := timed(func() { must(exec.Command("curl", args...).Run()) })
		curlNo, curlSync = append(curlNo, a), append(curlSync, b)
		os.RemoveAll(out)
	}
	fmt.Printf("hf pull of %s from the loopback test hub (GB/s, median of %d):\n", api.FormatBytes(total), *runs)
	fmt.Printf("  modelctl pull hf:// (verified, fsynced)  %.2f  %v  default --range-connections (adaptive, up to 4 per shard): %v GETs of file content per pull\n", median(mc)/1e9, gbps(mc), getsPerPull)
	fmt.Printf("  modelctl pull hf://, --range-connections 1 %.2f  %v\n", median(mc1)/1e9, gbps(mc1))
	if len(jsNo) > 0 {
		fmt.Printf("  @huggingface/hub snapshotDownload       %.2f  %v (+sync %.2f)  modelctl vs it: %.2fx (vs +sync %.2fx)\n",
			median(jsNo)/1e9, gbps(jsNo), median(jsSync)/1e9, median(ratios(mc, jsNo)), median(ratios(mc, jsSync)))
		addRow("hf pull of "+api.FormatBytes(total)+" from the loopback hub, incl. sync", gb(median(mc)), "@huggingface/hub snapshotDownload + sync "+gb(median(jsSync)), fmt.Sprintf("%.2fx", median(ratios(mc, jsSync))))
	}
	fmt.Printf("  curl -L of the resolve URLs              %.2f  %v (+sync %.2f)  modelctl vs it: %.2fx (vs +sync %.2fx)\n",
		median(curlNo)/1e9, gbps(curlNo), median(curlSync)/1e9, median(ratios(mc, curlNo)), median(ratios(mc, curlSync)))
	printBase("hf pull", mc, mcBase, true)
	if len(mcBase) > 0 && len(jsSync) > 0 {
		fmt.Printf("  base build vs snapshotDownload + sync: %.2fx\n", median(ratios(mcBase, jsSync)))
	}
}

// hfRevisionUpdate pulls the model, commits a revision in which one
// shard of four changes, and says what the pull of it fetched: only the
// shard (and the small git files). It commits the model back, so that
// the next run pulls what the peers pull.
func hfRevisionUpdate(dir string, hub *hubtest.Hub, model map[string][]byte, shard string) {
	d := startDaemon(filepath.Join(dir, "hroot"), filepath.Join(dir, "h.sock"), true, "HF_ENDPOINT="+hub.URL(), "HF_TOKEN=")
	d.ctl("pull", "hf://bench/model", "--name", "m")
	next := map[string][]byte{}
	for k, v := range model {
		next[k] = v
	}
	changed := append([]byte(nil), model[shard]...)
	changed[len(changed)/2] ^= 0xff
	next[shard] = changed
	hub.Commit("bench/model", next, "main")
	before := hub.Sent.Load()
	t0 := time.Now()
	d.ctl("pull", "hf://bench/model", "--name", "m")
	fmt.Printf("hf revision that changes 1 of 4 shards: %s fetched (the shard is %s), %s\n",
		api.FormatBytes(hub.Sent.Load()-before), api.FormatBytes(int64(len(changed))), time.Since(t0).Round(time.Millisecond))
	addRow("hf revision update (1 of 4 shards changed)", api.FormatBytes(hub.Sent.Load()-before)+" fetched", "the changed shard is "+api.FormatBytes(int64(len(changed))), fmt.Sprintf("%.2fx", float64(hub.Sent.Load()-before)/float64(len(changed))))
	d.stop()
	os.RemoveAll(filepath.Join(dir, "hroot"))
	hub.Commit("bench/model", model, "main")
}

// alternate runs modelctl (a pull into a fresh daemon) and each peer
// command, *runs times, and prints throughputs and ratios.
func alternate(title, dir string, total int64, canDrop bool, env []string, uri string, peers map[string]func(out string)) {
	timed := func(run func()) float64 {
		coldPrep(canDrop)
		t0 := time.Now()
		run()
		syscall.Sync()
		return float64(total) / time.Since(t0).Seconds()
	}
	mc, base := []float64{}, []float64{}
	res := map[string][]float64{}
	for i := 0; i < *runs; i++ {
		baseToo(&mc, &base, func() float64 {
			d := startDaemon(filepath.Join(dir, "xroot"), filepath.Join(dir, "x.sock"), true, env...)
			defer func() { d.stop(); os.RemoveAll(filepath.Join(dir, "xroot")) }()
			return timed(func() { d.ctl("pull", uri, "--name", "m") })
		})
		for name, run := range peers {
			out := filepath.Join(dir, "peer")
			os.MkdirAll(out, 0o755)
			res[name] = append(res[name], timed(func() { run(out) }))
			os.RemoveAll(out)
		}
	}
	fmt.Printf("%s (GB/s incl. sync, median of %d):\n  modelctl pull  %.2f  %v\n", title, *runs, median(mc)/1e9, gbps(mc))
	for name, r := range res {
		fmt.Printf("  %-14s %.2f  %v  modelctl vs it: %.2fx\n", name, median(r)/1e9, gbps(r), median(ratios(mc, r)))
		addRow(title, gb(median(mc)), name+" "+gb(median(r)), fmt.Sprintf("%.2fx", median(ratios(mc, r))))
		if len(base) > 0 {
			fmt.Printf("  %-14s base build vs it: %.2fx\n", name, median(ratios(base, r)))
		}
	}
	printBase(title, mc, base, true)
}

// ociBench pushes the model as an ORAS artifact (raw layers) to Debian's
// docker-registry and compares modelctl pull oci:// with oras pull.
func ociBench(dir, src string, files []file, canDrop bool) {
	reg, err := testenv.Tool("docker-registry")
	oras, oerr := testenv.Tool("oras")
	if err != nil || oerr != nil {
		fmt.Println("oci: docker-registry or oras missing; skipped (see .ci/run)")
		return
	}
	host, stop, err := testenv.StartRegistry(reg, filepath.Dir(src)) // its data beside the model, on the origin tmpfs
	must(err)
	defer stop()
	args := []string{"push", "--plain-http", host + "/bench/model:v1"}
	var total int64
	for _, f := range files {
		args = append(args, f.name)
		total += f.size
	}
	push := exec.Command(oras, args...)
	push.Dir = src
	if out, err := push.CombinedOutput(); err != nil {
		must(fmt.Errorf("oras push: %v %s", err, out))
	}
	alternate("oci pull of "+api.FormatBytes(total)+" from docker-registry on loopback", dir, total, canDrop,
		[]string{}, "oci://"+host+"/bench/model:v1", map[string]func(string){
			"oras pull": func(out string) {
				c := exec.Command(oras, "pull", "--plain-http", "-o", out, host+"/bench/model:v1")
				if b, err := c.CombinedOutput(); err != nil {
					must(fmt.Errorf("oras pull: %v %s", err, b))
				}
			},
		})
}

// s3Bench puts the model into versitygw and compares modelctl pull s3://
// with curl of presigned URLs.
func s3Bench(dir, src string, files []file, canDrop bool) {
	gw, err := testenv.Tool("versitygw")
	if err != nil {
		fmt.Println("s3: versitygw missing; skipped (see .ci/run)")
		return
	}
	host, err := testenv.FreeAddr()
	must(err)
	data := filepath.Join(filepath.Dir(src), "s3data") // on the origin tmpfs
	os.MkdirAll(data, 0o755)
	cmd := exec.Command(gw, "--port", host, "posix", data)
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY=bench", "ROOT_SECRET_KEY=bench-secret-key")
	must(cmd.Start())
	defer func() { cmd.Process.Kill(); cmd.Wait(); os.RemoveAll(data) }()
	must(testenv.WaitTCP(host, 10*time.Second))
	ep := "http://" + host
	c := s3.New(s3.Options{Region: "us-east-1", BaseEndpoint: aws.String(ep), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider("bench", "bench-secret-key", "")})
	ctx := context.Background()
	_, err = c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String("models")})
	must(err)
	var total int64
	var urls []string
	pre := s3.NewPresignClient(c)
	for _, f := range files {
		fh, err := os.Open(filepath.Join(src, f.name))
		must(err)
		_, err = c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String("models"), Key: aws.String("m/" + f.name), Body: fh, ChecksumAlgorithm: "SHA256"})
		fh.Close()
		must(err)
		total += f.size
		req, err := pre.PresignGetObject(ctx, &s3.GetObjectInput{Bucket: aws.String("models"), Key: aws.String("m/" + f.name)})
		must(err)
		urls = append(urls, req.URL)
	}
	env := []string{"AWS_ENDPOINT_URL=" + ep, "AWS_ACCESS_KEY_ID=bench", "AWS_SECRET_ACCESS_KEY=bench-secret-key", "AWS_REGION=us-east-1"}
	alternate("s3 pull of "+api.FormatBytes(total)+" from versitygw on loopback", dir, total, canDrop, env, "s3://models/m/",
		map[string]func(string){
			"curl presigned": func(out string) {
				args := []string{"-sS", "--fail"}
				for i, u := range urls {
					args = append(args, "-o", filepath.Join(out, files[i].name), u)
				}
				must(exec.Command("curl", args...).Run())
			},
			// The AWS SDK's own downloader (parallel ranged GETs), no verification.
			"aws-sdk s3 manager": func(out string) {
				dl := manager.NewDownloader(c)
				for _, f := range files {
					fh, err := os.Create(filepath.Join(out, f.name))
					must(err)
					_, err = dl.Download(ctx, fh, &s3.GetObjectInput{Bucket: aws.String("models"), Key: aws.String("m/" + f.name)})
					fh.Close()
					must(err)
				}
			},
		})
}
