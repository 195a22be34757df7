package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/modelcache/modelcache/api"
)

func pullCommand() *cli.Command {
	return &cli.Command{
		Name: "pull", Usage: "fetch an artifact into the cache and keep it desired", ArgsUsage: "URI",
		Description: "URI is hf://org/repo[@revision], s3://bucket/prefix, oci://registry/repo:tag|@sha256:<hex>,\n" +
			"ngc://org[/team]/model[:version] (NVIDIA NGC; no version: the latest, then pinned),\n" +
			"http(s)://host/path[#sha256=<hex>] or file:///abs/path (a file or a directory tree).\n" +
			"The desire is persisted: the daemon keeps the artifact present and retries failures until 'modelctl evict'.\n" +
			"A plain pull is an ad-hoc cache entry: to admit another pull the daemon may evict it, least recently used\n" +
			"first (list shows ENTRY ad-hoc); --keep or --pin declare it, and only disk pressure (--keep) or nothing (--pin) evicts it;\n" +
			"a source that does not exist or refuses access is not retried until the desire changes or it is pulled again.\n" +
			"Kernel caches (oci:// images in GKM's MCV layout) must be signed: --key cosign.pub, or keyless\n" +
			"--identity/--issuer/--trusted-root; see docs/kernel-caches.md.",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "name", Usage: "artifact name (letters, digits, '.', '_', '-')"},
			&cli.BoolFlag{Name: "pin", Usage: "never evict it by policy"},
			&cli.BoolFlag{Name: "keep", Usage: "declare it: never evicted to make room for another pull (disk pressure still may; --pin never)"},
			&cli.BoolFlag{Name: "public", Usage: "keep it public on the node though the daemon fetches it with credentials (its HF_TOKEN, AWS keys, NGC key, a registry login, credentials in the URI): without it such an artifact is root's only"},
			&cli.BoolFlag{Name: "replace", Usage: "replace the source of an existing artifact of this name (refused without it)"},
			&cli.StringFlag{Name: "digest", Usage: "expected manifest digest (sha256:…), the folder checksum; a mismatch fails the pull"},
			&cli.StringSliceFlag{Name: "include", Usage: "only files matching this glob (repeatable)"},
			&cli.StringSliceFlag{Name: "exclude", Usage: "skip files matching this glob (repeatable)"},
			&cli.BoolFlag{Name: "no-wait", Usage: "return once the pull is queued"},
			&cli.StringFlag{Name: "kind", Value: api.KindModel, Usage: "model, or kernelcache for an oci:// GPU kernel cache image (MCV layout)"},
			&cli.StringSliceFlag{Name: "kernel-cache", Usage: "a kernel cache image (oci://…) that goes with the model; repeatable, one per GPU architecture"},
			&cli.StringSliceFlag{Name: "key", Usage: "kernel caches: a cosign public key (PEM file) that may sign them; repeatable"},
			&cli.StringFlag{Name: "identity", Usage: "kernel caches, keyless: the certificate subject (email or URI) that must sign"},
			&cli.StringFlag{Name: "identity-regexp", Usage: "kernel caches, keyless: a regexp the certificate subject must match"},
			&cli.StringFlag{Name: "issuer", Usage: "kernel caches, keyless: the OIDC issuer recorded in the certificate"},
			&cli.StringFlag{Name: "issuer-regexp", Usage: "kernel caches, keyless: a regexp the issuer must match"},
			&cli.StringFlag{Name: "trusted-root", Usage: "kernel caches, keyless: a trusted_root.json or PEM CA bundle file (modelctl sends its content)"},
			&cli.StringFlag{Name: "signature-policy", Value: api.PolicyRequired, Usage: "kernel caches: required (a signature the policy trusts) or off"},
		},
		Action: func(c *cli.Context) error {
			if c.String("name") == "" {
				return usagef("pull: --name NAME is required (the name the model will have under models/)")
			}
			req := api.PullRequest{
				Name: c.String("name"), URI: c.Args().First(), Digest: c.String("digest"), Pin: c.Bool("pin"), Keep: c.Bool("keep"), Replace: c.Bool("replace"), Public: c.Bool("public"),
				Include: c.StringSlice("include"), Exclude: c.StringSlice("exclude"),
			}
			sig, err := signatureFlags(c)
			if err != nil {
				return err
			}
			switch c.String("kind") {
			case api.KindModel:
				for _, u := range c.StringSlice("kernel-cache") {
					req.KernelCaches = append(req.KernelCaches, api.KernelCacheRef{URI: u, Signature: sig})
				}
			case api.KindKernelCache:
				if len(c.StringSlice("kernel-cache")) > 0 {
					return usagef("pull: --kernel-cache belongs to a model; a kernel cache pull names its image as the URI")
				}
				req.Kind, req.Signature = api.KindKernelCache, sig
			default:
				return usagef("pull: --kind %q: use model or kernelcache", c.String("kind"))
			}
			credentialNote(c, req.URI)
			if c.Bool("no-wait") {
				a, err := client(c).Pull(c.Context, req, false, nil)
				if err != nil {
					return err
				}
				return output(c, a, func(w io.Writer) { fmt.Fprintf(w, "%s: %s\n", a.Name, a.Phase) })
			}
			p := newProgress(c.App.ErrWriter)
			// A daemon that restarts once it took the desire resumes the
			// pull: follow it when it is back.
			a, err := client(c).PullFollow(c.Context, req, p.event, p.outage("(the pull resumes; Ctrl-C detaches)"))
			p.finish()
			return pulled(c, req.Name, a, err)
		},
	}
}

// userCredentials are the variables of the user's environment that
// name credentials for a scheme, and the name the daemon's status gives
// its own (api.Status.Credentials).
var userCredentials = map[string]struct {
	vars   []string
	daemon string
}{
	"hf":  {[]string{"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"}, "HF_TOKEN"},
	"ngc": {[]string{"NGC_API_KEY", "NGC_CLI_API_KEY"}, "NGC_API_KEY"},
	"s3":  {[]string{"AWS_ACCESS_KEY_ID", "AWS_PROFILE"}, "AWS_ACCESS_KEY_ID"},
}

// credentialNote warns, before a pull, that a credential in the user's
// own environment does not reach the daemon: credentials are the
// daemon's (its environment, a models.d credentialsFile, a ModelCache's
// secretRef), and whether the daemon has one of its own.
func credentialNote(c *cli.Context, uri string) {
	scheme, _, ok := strings.Cut(uri, "://")
	uc, known := userCredentials[scheme]
	if !ok || !known {
		return
	}
	var set []string
	for _, v := range uc.vars {
		if os.Getenv(v) != "" {
			set = append(set, v)
		}
	}
	if len(set) == 0 {
		return
	}
	has := false
	if st, err := client(c).Status(c.Context); err == nil {
		has = slices.Contains(st.Credentials, uc.daemon)
	}
	w := c.App.ErrWriter
	if has {
		fmt.Fprintf(w, "modelctl: note: %s in your environment is not used: modelctl sends no credentials; modelcached fetches %s:// with its own %s.\n", strings.Join(set, ", "), scheme, uc.daemon)
		return
	}
	fmt.Fprintf(w, "modelctl: warning: %s is set in your environment, but modelcached does not see it (modelctl sends no credentials), and the daemon has no %s of its own.\n"+
		"  Give the daemon the credential: its environment ('sudo systemctl edit modelcached': Environment=%s=…), a models.d entry's credentialsFile, or a ModelCache's secretRef (docs/operator.md, Credentials).\n",
		strings.Join(set, ", "), uc.daemon, uc.daemon)
}

// pulled ends a pull or a retry that was followed: detached when
// interrupted once the daemon took it (it pulls on), the failure with its
// remedy, or the Ready line.
func pulled(c *cli.Context, name string, a *api.Artifact, err error) error {
	if err != nil && c.Context.Err() != nil && a != nil {
		return detachedError{fmt.Sprintf("detached; the pull continues — `modelctl wait %s` to follow, `modelctl evict %s` to cancel", name, name)}
	}
	if err != nil {
		return pullFailed(name, a, err)
	}
	return output(c, a, func(w io.Writer) { pulledText(w, a) })
}

// pulledText is a pull's last word: Ready where, or already Ready with
// nothing read, and what was evicted to make room for it.
func pulledText(w io.Writer, a *api.Artifact) {
	l := a.LastPull
	if l != nil && l.Unchanged {
		fmt.Fprintf(w, "%s: already Ready at %s (revision %s, %s): the source is unchanged; nothing was read or fetched\n", a.Name, a.Path, short(a.Revision), api.FormatBytes(a.Bytes))
	} else {
		fmt.Fprintf(w, "%s: Ready at %s (revision %s, %s)\n", a.Name, a.Path, short(a.Revision), api.FormatBytes(a.Bytes))
	}
	if l == nil || len(l.Evicted) == 0 {
		return
	}
	var parts []string
	var freed int64
	for _, v := range l.Evicted {
		parts = append(parts, fmt.Sprintf("%s@%s (%s)", v.Name, short(v.Revision), api.FormatBytes(v.Bytes)))
		freed += v.Bytes
	}
	fmt.Fprintf(w, "  To make room it evicted %s of ad-hoc entries: %s ('modelctl list' shows them Evicted; a model pulled with --keep or --pin is never evicted for another pull).\n", api.FormatBytes(freed), strings.Join(parts, ", "))
}
