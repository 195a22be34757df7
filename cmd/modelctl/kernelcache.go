package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/gpu/mcv"
	"github.com/modelcache/modelcache/kernelcache"
)

// kernelcacheCommand builds, pushes and signs kernel cache images. It
// runs in modelctl's own process, with the invoking user's registry
// credentials and key: the daemon is not involved.
func kernelcacheCommand() *cli.Command {
	return &cli.Command{
		Name: "kernelcache", Usage: "build, push and sign GPU kernel cache images (GKM's MCV layout) without a container engine",
		Subcommands: []*cli.Command{kernelcacheBuildCommand(), kernelcacheCaptureCommand(), kernelcacheKeptCommand()},
	}
}

func kernelcacheBuildCommand() *cli.Command {
	return &cli.Command{
		Name:      "build",
		Usage:     "pack a cache directory Triton, vLLM or torch.compile wrote into an image, push it and sign it",
		ArgsUsage: "DIR oci://REGISTRY/REPOSITORY:TAG",
		Description: "DIR is what the framework wrote: TRITON_CACHE_DIR, VLLM_CACHE_ROOT (with torch_compile_cache/) or\n" +
			"TORCHINDUCTOR_CACHE_DIR. Registry credentials are read as crane and docker read them ($DOCKER_CONFIG or\n" +
			"~/.docker/config.json and its credential helpers). --key signs with a cosign key (password in COSIGN_PASSWORD);\n" +
			"--identity-token signs keyless through Fulcio. Prints the digest the image is pinned by.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "kind", Usage: "triton, vllm or torchinductor (default: told by what DIR holds)"},
			&cli.StringSliceFlag{Name: "target", Usage: "a GPU the cache was compiled for, backend:arch[:warp] (cuda:90, hip:gfx90a); needed where DIR holds no Triton metadata; repeatable"},
		}, pushFlags()...),
		Action: kernelcacheBuild,
	}
}

// pushFlags are the flags of a command that pushes and signs an image.
func pushFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "key", Usage: "sign with this cosign private key (cosign generate-key-pair's cosign.key)"},
		&cli.StringFlag{Name: "identity-token", Usage: "sign keyless: an OIDC identity token Fulcio accepts (a file path, or the token)"},
		&cli.StringFlag{Name: "fulcio-url", Value: "https://fulcio.sigstore.dev", Usage: "sign keyless: the Fulcio that issues the certificate"},
		&cli.BoolFlag{Name: "no-sign", Usage: "push without signing (nodes under the default policy will refuse it)"},
		&cli.BoolFlag{Name: "insecure", Usage: "talk plain HTTP to the registry (loopback registries always are)"},
	}
}

func kernelcacheBuild(c *cli.Context) error {
	if c.NArg() != 2 {
		return usageError{msgs: []string{"give DIR and oci://REGISTRY/REPOSITORY:TAG"}, cmd: "kernelcache build"}
	}
	dir, uri := c.Args().Get(0), c.Args().Get(1)
	var targets []mcv.SummaryTarget
	for _, s := range c.StringSlice("target") {
		t, err := kernelcache.ParseTarget(s)
		if err != nil {
			return err
		}
		targets = append(targets, t)
	}
	cache, err := kernelcache.Scan(dir, kernelcache.Options{Kind: c.String("kind")})
	if err != nil {
		return err
	}
	return pushCache(c, "kernelcache build", cache, uri, targets)
}

// pushCache builds the image of cache, pushes it to uri with the user's
// registry credentials and signs it as the flags say; it prints the
// pinned reference.
func pushCache(c *cli.Context, cmd string, cache *kernelcache.Cache, uri string, targets []mcv.SummaryTarget) error {
	var signer kernelcache.Signer
	var err error
	switch {
	case c.Bool("no-sign"):
		if c.String("key") != "" || c.String("identity-token") != "" {
			return usageError{msgs: []string{"--no-sign with --key or --identity-token: choose one"}, cmd: cmd}
		}
	case c.String("key") != "" && c.String("identity-token") != "":
		return usageError{msgs: []string{"--key and --identity-token: sign with one of them"}, cmd: cmd}
	case c.String("key") != "":
		if signer, err = kernelcache.ReadKey(c.String("key")); err != nil {
			return err
		}
	case c.String("identity-token") != "":
		tok := c.String("identity-token")
		if b, err := os.ReadFile(tok); err == nil {
			tok = string(trimSpace(b))
		}
		if signer, err = kernelcache.FulcioSigner(c.String("fulcio-url"), tok); err != nil {
			return err
		}
	default:
		return usageError{msgs: []string{"sign the image: --key cosign.key, or --identity-token TOKEN for keyless (or --no-sign)"}, cmd: cmd}
	}
	reg := kernelcache.Registry{Insecure: c.Bool("insecure")}
	ref, err := reg.ParseRef(uri)
	if err != nil {
		return err
	}
	b, err := kernelcache.Image(cache, kernelcache.ImageOptions{Title: kernelcache.Title(ref), Targets: targets})
	if err != nil {
		return err
	}
	defer b.Close()
	d, _ := mcv.DirNamed(cache.Kind)
	fmt.Fprintf(c.App.ErrWriter, "%s cache: %d files, %d bytes, %d kernels; summary %s\n", cache.Kind, len(cache.Files), cache.Bytes, len(cache.Entries), b.Labels[d.Summary])
	dref, err := reg.Push(c.Context, ref, b)
	if err != nil {
		return err
	}
	if signer != nil {
		if err := reg.Sign(c.Context, dref, signer); err != nil {
			return fmt.Errorf("pushed %s, but signing failed: %w", dref, err)
		}
	}
	fmt.Fprintln(c.App.Writer, "oci://"+dref.String())
	return nil
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

func kernelcacheCaptureCommand() *cli.Command {
	return &cli.Command{
		Name:      "capture",
		Usage:     "build, push and sign an image of what a pod compiled into its writable kernel cache volume",
		ArgsUsage: "VOLUME oci://REGISTRY/REPOSITORY:TAG",
		Description: "VOLUME is a CSI volume published with kernelCacheWritable (its ID, namespace/pod of the pod that mounts\n" +
			"it, or its model), of a model whose models.d file or ModelCache sets captureKernelCaches: true. Run it on the node, as root,\n" +
			"while the pod runs or after: once the pod is gone the daemon keeps what it compiled (modelctl kernelcache kept\n" +
			"lists it) until it is captured or passes the kept layers' limits. The image holds the volume's kernel cache\n" +
			"directory as the pod saw it (what it was given and what it compiled), read with the checks of an extraction, and\n" +
			"every kernel's target must be a GPU of this node. It is pushed with your registry credentials and signed with your\n" +
			"key, never the node's; a kept layer goes once it is.",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "path", Usage: "the cache directory within the volume (default: the volume's one kernel cache directory, kernels/NAME/io.triton.cache)"},
			&cli.StringFlag{Name: "kind", Usage: "triton, vllm or torchinductor (default: the kernel cache's, or told by what the directory holds)"},
		}, pushFlags()...),
		Action: kernelcacheCapture,
	}
}

func kernelcacheCapture(c *cli.Context) error {
	if c.NArg() != 2 {
		return usageError{msgs: []string{"give VOLUME and oci://REGISTRY/REPOSITORY:TAG"}, cmd: "kernelcache capture"}
	}
	src, err := client(c).CaptureSource(c.Context, c.Args().Get(0))
	if err != nil {
		return err
	}
	rel, kind := c.String("path"), c.String("kind")
	if rel == "" {
		switch len(src.Caches) {
		case 0:
			return fmt.Errorf("volume %s was given no kernel cache: name the directory the pod compiled into with --path (relative to the volume)", src.Volume)
		case 1:
			rel = src.Caches[0].Path
			if kind == "" {
				kind = src.Caches[0].Kind
			}
		default:
			var ps []string
			for _, cc := range src.Caches {
				ps = append(ps, cc.Path)
			}
			return fmt.Errorf("volume %s has %d kernel cache directories (%s): choose one with --path", src.Volume, len(ps), strings.Join(ps, ", "))
		}
	}
	if rel = filepath.Clean(rel); filepath.IsAbs(rel) || rel == ".." || strings.HasPrefix(rel, "../") {
		return fmt.Errorf("--path %s: give a directory inside the volume", rel)
	}
	if bad := refusedUnder(src.Refused, filepath.ToSlash(rel)); len(bad) > 0 {
		return fmt.Errorf("%w: the pod wrote what a kernel cache may not hold under %s: %s", kernelcache.ErrRefused, rel, strings.Join(bad, ", "))
	}
	cache, err := kernelcache.Scan(filepath.Join(src.Target, rel), kernelcache.Options{Kind: kind})
	if err != nil {
		return err
	}
	var gpus []mcv.Target
	for _, dv := range src.GPUs.Devices {
		gpus = append(gpus, mcv.Target{Backend: dv.Backend, Arch: dv.Arch, WarpSize: dv.WarpSize})
	}
	if err := kernelcache.CheckCompiledOn(cache, gpus); err != nil {
		return err
	}
	kept := ""
	if src.Kept {
		kept = ", kept since " + src.KeptAt.Format(time.RFC3339)
	}
	fmt.Fprintf(c.App.ErrWriter, "capturing %s of volume %s (model %s, pod %s%s)\n", rel, src.Volume, src.Model, src.Pod, kept)
	if err := pushCache(c, "kernelcache capture", cache, c.Args().Get(1), nil); err != nil {
		return err
	}
	return client(c).Captured(c.Context, src.Volume)
}

// refusedUnder lists the refused entries at or under dir (relative to
// the volume).
func refusedUnder(refused []string, dir string) []string {
	var out []string
	for _, r := range refused {
		p, _, _ := strings.Cut(r, " (")
		if dir == "." || p == dir || strings.HasPrefix(p, dir+"/") {
			out = append(out, r)
		}
	}
	return out
}

func kernelcacheKeptCommand() *cli.Command {
	return &cli.Command{
		Name:  "kept",
		Usage: "list the writable kernel cache layers kept for capture after their pods went (--drop VOLUME removes one)",
		Flags: []cli.Flag{&cli.StringFlag{Name: "drop", Usage: "remove the kept layer of this volume ID without capturing it"}},
		Action: func(c *cli.Context) error {
			if id := c.String("drop"); id != "" {
				return client(c).DropKeptLayer(c.Context, id)
			}
			ls, err := client(c).KeptLayers(c.Context)
			if err != nil {
				return err
			}
			return output(c, ls, func(w io.Writer) {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "VOLUME\tMODEL\tPOD\tKEPT\tFILES\tSIZE\tREFUSED")
				for _, l := range ls {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%d\n", l.Volume, l.Model, l.Pod, l.KeptAt.Local().Format(time.DateTime), l.Files, api.FormatBytes(l.Bytes), len(l.Refused))
				}
				tw.Flush()
			})
		},
	}
}
