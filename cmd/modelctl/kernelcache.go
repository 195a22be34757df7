package main

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/modelcache/modelcache/gpu/mcv"
	"github.com/modelcache/modelcache/kernelcache"
)

// kernelcacheCommand builds, pushes and signs kernel cache images. It
// runs in modelctl's own process, with the invoking user's registry
// credentials and key: the daemon is not involved.
func kernelcacheCommand() *cli.Command {
	return &cli.Command{
		Name: "kernelcache", Usage: "build, push and sign GPU kernel cache images (GKM's MCV layout) without a container engine",
		Subcommands: []*cli.Command{kernelcacheBuildCommand()},
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
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "kind", Usage: "triton, vllm or torchinductor (default: told by what DIR holds)"},
			&cli.StringSliceFlag{Name: "target", Usage: "a GPU the cache was compiled for, backend:arch[:warp] (cuda:90, hip:gfx90a); needed where DIR holds no Triton metadata; repeatable"},
			&cli.StringFlag{Name: "key", Usage: "sign with this cosign private key (cosign generate-key-pair's cosign.key)"},
			&cli.StringFlag{Name: "identity-token", Usage: "sign keyless: an OIDC identity token Fulcio accepts (a file path, or the token)"},
			&cli.StringFlag{Name: "fulcio-url", Value: "https://fulcio.sigstore.dev", Usage: "sign keyless: the Fulcio that issues the certificate"},
			&cli.BoolFlag{Name: "no-sign", Usage: "push without signing (nodes under the default policy will refuse it)"},
			&cli.BoolFlag{Name: "insecure", Usage: "talk plain HTTP to the registry (loopback registries always are)"},
		},
		Action: kernelcacheBuild,
	}
}

func kernelcacheBuild(c *cli.Context) error {
	if c.NArg() != 2 {
		return usageError{msgs: []string{"give DIR and oci://REGISTRY/REPOSITORY:TAG"}, cmd: "kernelcache build"}
	}
	dir, uri := c.Args().Get(0), c.Args().Get(1)
	var signer kernelcache.Signer
	var err error
	switch {
	case c.Bool("no-sign"):
		if c.String("key") != "" || c.String("identity-token") != "" {
			return usageError{msgs: []string{"--no-sign with --key or --identity-token: choose one"}, cmd: "kernelcache build"}
		}
	case c.String("key") != "" && c.String("identity-token") != "":
		return usageError{msgs: []string{"--key and --identity-token: sign with one of them"}, cmd: "kernelcache build"}
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
		return usageError{msgs: []string{"sign the image: --key cosign.key, or --identity-token TOKEN for keyless (or --no-sign)"}, cmd: "kernelcache build"}
	}
	var targets []mcv.SummaryTarget
	for _, s := range c.StringSlice("target") {
		t, err := kernelcache.ParseTarget(s)
		if err != nil {
			return err
		}
		targets = append(targets, t)
	}
	reg := kernelcache.Registry{Insecure: c.Bool("insecure")}
	ref, err := reg.ParseRef(uri)
	if err != nil {
		return err
	}
	cache, err := kernelcache.Scan(dir, kernelcache.Options{Kind: c.String("kind")})
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
