package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/internal/cliutil"
)

func listCommand() *cli.Command {
	return &cli.Command{
		Name: "list", Aliases: []string{"ls"}, Usage: "list artifacts with their phase, revision, size and age (-o wide: the full source; -o name: names only)",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "no-headers", Usage: "leave out the header row of the table"}},
		Action: func(c *cli.Context) error {
			// A short-lived process that decodes thousands of rows and
			// keeps them all: collecting as the heap doubles from its
			// first few MiB was a fifth of its time (pprof).
			debug.SetGCPercent(400)
			if f := c.String("output"); f == "json" || f == "yaml" {
				arts, err := client(c).List(c.Context)
				if err != nil {
					return err
				}
				return output(c, arts, nil)
			}
			rows, err := client(c).ListRows(c.Context) // the table's fields only
			if err != nil {
				return err
			}
			if c.String("output") == "name" { // one name a line, for xargs and scripts
				for _, r := range rows {
					fmt.Fprintln(c.App.Writer, r.Name)
				}
				return nil
			}
			listTable(c.App.Writer, rows, time.Now(), c.String("output") == "wide", c.Bool("no-headers"))
			return nil
		},
	}
}

func inspectCommand() *cli.Command {
	return &cli.Command{
		Name: "inspect", Usage: "show one artifact: desire, versions, files (-o json or yaml: every field, exact numbers)", ArgsUsage: "NAME",
		Action: func(c *cli.Context) error {
			a, err := client(c).Get(c.Context, c.Args().First())
			if err != nil {
				return err
			}
			return output(c, a, func(w io.Writer) { describe(w, a, time.Now()) })
		},
	}
}

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

// capacityText is the capacity policy as status shows it: the quota, the
// watermarks and what pulls in flight reserve.
func capacityText(s *api.Status) string {
	quota := "no quota"
	if s.QuotaBytes > 0 {
		quota = "quota " + api.FormatBytes(s.QuotaBytes)
	}
	t := fmt.Sprintf("capacity: %s, watermarks %d%% (eviction starts) and %d%% (it stops), %s reserved by pulls in flight", quota, s.HighWatermark, s.LowWatermark, api.FormatBytes(s.ReservedBytes))
	if s.DiskPressure {
		t += "; under disk pressure now"
	}
	return t
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

func manCommand() *cli.Command {
	return &cli.Command{
		Name: "man", Hidden: true, Usage: "print the manual page (roff), for packaging",
		Action: func(c *cli.Context) error {
			m, err := c.App.ToManWithSection(1)
			if err != nil {
				return err
			}
			fmt.Fprint(c.App.Writer, m)
			return nil
		},
	}
}

func gpuCommand() *cli.Command {
	return &cli.Command{
		Name: "gpu", Usage: "this node's GPUs as the daemon sees them (NVML, or a simulated inventory)",
		Action: func(c *cli.Context) error {
			g, err := client(c).GPU(c.Context)
			if err != nil {
				return err
			}
			return output(c, g, func(w io.Writer) { printGPU(w, g) })
		},
	}
}

func envCommand() *cli.Command {
	return &cli.Command{
		Name: "env", Usage: "the environment a framework needs for an artifact (paths, TRITON_CACHE_DIR, VLLM_CACHE_ROOT, …) as export lines", ArgsUsage: "NAME",
		Description: "For a model: MODEL_PATH, HF_HUB_CACHE and HF_HUB_OFFLINE for hub models, and the cache directories of its\n" +
			"Ready, compatible kernel caches. For a kernel cache: its cache directories. Use: eval \"$(modelctl env NAME)\"",
		Action: func(c *cli.Context) error {
			env, err := client(c).Env(c.Context, c.Args().First())
			if err != nil {
				return err
			}
			return output(c, env, func(w io.Writer) {
				keys := make([]string, 0, len(env))
				for k := range env {
					keys = append(keys, k)
				}
				sort.Strings(keys)
				for _, k := range keys {
					fmt.Fprintf(w, "export %s=%s\n", k, shellQuote(env[k]))
				}
			})
		},
	}
}

func waitCommand() *cli.Command {
	return &cli.Command{
		Name: "wait", Usage: "wait until an artifact is Ready (exit 0) or Failed (exit 1); for init containers", ArgsUsage: "NAME",
		Description: "A NAME that nothing desires (no pull, models.d file or ModelCache) fails at once, unless --for-create\n" +
			"waits for a desire to appear. --timeout takes 90s, 5m, 1h30m or a bare number of seconds. A model is done\n" +
			"once it is Ready and each of its kernel caches is Ready, Incompatible or Failed (--skip-kernel-caches: the\n" +
			"model alone); a GPU of this node that none of them runs on is named in a note.",
		Flags: []cli.Flag{
			&cli.GenericFlag{Name: "timeout", Value: &cliutil.Duration{}, Usage: "give up after this long: 90s, 5m, 1h (a bare number is seconds; 0: never)", DefaultText: "0, never"},
			&cli.BoolFlag{Name: "for-create", Usage: "wait for NAME to be desired if nothing desires it yet, instead of failing at once"},
			&cli.BoolFlag{Name: "skip-kernel-caches", Usage: "a model is done when it is Ready, without waiting for its kernel caches"},
		},
		Action: func(c *cli.Context) error {
			name := c.Args().First()
			cl := client(c)
			timeout := c.Generic("timeout").(*cliutil.Duration).D
			until := "(no --timeout: until it does)"
			if timeout > 0 {
				until = "until --timeout " + timeout.String() + " passes"
			}
			p := newProgress(c.App.ErrWriter)
			defer p.finish()
			start := time.Now()
			if !c.Bool("for-create") {
				// A daemon that is not up yet (a node booting, a DaemonSet
				// rollout) is waited for like one that restarts.
				_, err := cl.Get(c.Context, name)
				if api.Lost(err) {
					var ua *api.UnavailableError
					errors.As(err, &ua)
					o := p.outage(until)
					o.Lost(err, false)
					err = cl.AwaitDaemon(c.Context, timeout)
					if err == nil {
						o.Back(time.Since(start))
						_, err = cl.Get(c.Context, name)
					} else if api.Lost(err) {
						return fmt.Errorf("%s: modelcached did not answer within --timeout %s\n  %s", name, timeout, unreachable(ua))
					}
				}
				if errors.Is(err, api.ErrNotFound) {
					return fmt.Errorf("%s: nothing desires it and the cache does not hold it\n"+
						"  Pull it ('modelctl pull URI --name %s'), or wait for a models.d file or ModelCache to ask for it with --for-create.", name, name)
				} else if err != nil {
					return err
				}
			}
			if timeout > 0 {
				timeout = max(time.Millisecond, timeout-time.Since(start))
			}
			var notes []string
			waiting := ""
			a, err := cl.WaitFollow(c.Context, name, api.WaitOptions{Timeout: timeout, SkipKernelCaches: c.Bool("skip-kernel-caches")},
				func(e api.Event) {
					if notes = e.Notes; !e.Done && len(notes) > 0 && waiting == "" { // Ready, its kernel caches on their way: say so once
						waiting = notes[0]
						fmt.Fprintln(c.App.ErrWriter, "\n"+name+" is Ready, "+waiting)
					}
					p.event(e)
				}, p.outage(until))
			p.finish()
			for _, n := range notes { // what a model's kernel caches left undone: a GPU without one, a failure
				if n != waiting {
					fmt.Fprintln(c.App.ErrWriter, "note: "+n)
				}
			}
			if err != nil {
				return err
			}
			return output(c, a, func(w io.Writer) { fmt.Fprintf(w, "%s: Ready at %s\n", a.Name, a.Path) })
		},
	}
}

func retryCommand() *cli.Command {
	return &cli.Command{
		Name: "retry", Usage: "pull a Failed artifact again now, whatever declared it (pull, models.d file, ModelCache)", ArgsUsage: "NAME",
		Description: "A Failed artifact is retried with backoff, or, after a failure the same desire cannot fix (a source\n" +
			"that does not exist or refuses access), not until its desire changes. Once the cause is fixed elsewhere\n" +
			"(a permission, a token, a file put in place), retry pulls it again now, its source resolved anew.\n" +
			"Touching a models.d file (touch FILE) retries that file's Failed artifacts too.",
		Flags: []cli.Flag{
			&cli.BoolFlag{Name: "no-wait", Usage: "return once the retry is queued"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() != 1 {
				return usagef("retry takes exactly one NAME (got %d)", c.NArg())
			}
			name := c.Args().First()
			if c.Bool("no-wait") {
				a, err := client(c).Retry(c.Context, name, false, nil)
				if err != nil {
					return err
				}
				return output(c, a, func(w io.Writer) { fmt.Fprintf(w, "%s: retrying\n", a.Name) })
			}
			p := newProgress(c.App.ErrWriter)
			a, err := client(c).RetryFollow(c.Context, name, p.event, p.outage("(the pull resumes; Ctrl-C detaches)"))
			p.finish()
			return pulled(c, name, a, err)
		},
	}
}

func evictCommand() *cli.Command {
	return &cli.Command{
		Name: "evict", Aliases: []string{"rm", "delete"}, Usage: "remove artifacts (or one revision) and their desires, then free unused blobs", ArgsUsage: "[NAME...]",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "revision", Usage: "remove only this revision (of one NAME)"},
			&cli.BoolFlag{Name: "force", Usage: "remove even if pinned"},
			&cli.BoolFlag{Name: "failed", Usage: "also every ad-hoc entry whose pull failed and that serves nothing (list shows them Failed, ENTRY ad-hoc, no REVISION)"},
		},
		Action: evict,
	}
}

// evict removes each NAME, and with --failed every Failed ad-hoc entry,
// one request each: one that is refused (in use, pinned) does not stop
// the others, and the exit status is 1 if any was refused.
func evict(c *cli.Context) error {
	names := c.Args().Slice()
	if c.String("revision") != "" && len(names) != 1 {
		return usagef("evict --revision takes exactly one NAME (got %d)", len(names))
	}
	if c.Bool("failed") {
		rows, err := client(c).ListRows(c.Context)
		if err != nil {
			return err
		}
		named := map[string]bool{}
		for _, n := range names {
			named[n] = true
		}
		for _, r := range rows {
			// Not one that still serves an older version: its last pull
			// failed, not the model (a --replace to a bad source).
			if r.Phase == api.PhaseFailed && r.Entry == api.EntryAdHoc && r.Revision == "" && !named[r.Name] {
				names = append(names, r.Name)
			}
		}
		if len(names) == 0 {
			fmt.Fprintln(c.App.ErrWriter, "no Failed ad-hoc entries")
			return nil
		}
	}
	if len(names) == 0 {
		return usagef("evict: want NAME..., or --failed")
	}
	var results []*api.EvictResult
	var errs []string
	for _, n := range names {
		r, err := client(c).Evict(c.Context, n, c.String("revision"), c.Bool("force"))
		if err != nil {
			if len(names) == 1 {
				return err
			}
			errs = append(errs, err.Error())
			continue
		}
		results = append(results, r)
	}
	var v any = results
	if len(names) == 1 {
		v = results[0]
	}
	if err := output(c, v, func(w io.Writer) {
		for _, r := range results {
			fmt.Fprintf(w, "%s: evicted %d revision(s); freed %s in %d blob(s)\n", r.Name, len(r.Revisions), api.FormatBytes(r.GC.BytesFreed), r.GC.BlobsRemoved)
		}
	}); err != nil {
		return err
	}
	if len(errs) > 0 {
		return cli.Exit(strings.Join(errs, "\n"), exitFailure)
	}
	return nil
}

func verifyCommand() *cli.Command {
	return &cli.Command{
		Name: "verify", Usage: "re-hash blobs (of NAMEs, or all); corrupt ones are quarantined and re-fetched", ArgsUsage: "[NAME...]",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "fsck", Usage: "instead: check that index, blobs and trees agree (no rehash; exit 1 on any problem)"}},
		Action: func(c *cli.Context) error {
			if c.Bool("fsck") {
				r, err := client(c).Fsck(c.Context)
				if err != nil {
					return err
				}
				if err := output(c, r, func(w io.Writer) {
					fmt.Fprintf(w, "fsck: %d problems\n", len(r.Problems))
					for _, p := range r.Problems {
						fmt.Fprintf(w, "  %s\n", p)
					}
				}); err != nil {
					return err
				}
				if len(r.Problems) > 0 {
					return cli.Exit("", exitFailure)
				}
				return nil
			}
			r, err := client(c).Verify(c.Context, c.Args().Slice()...)
			if err != nil {
				return err
			}
			if err := output(c, r, func(w io.Writer) {
				fmt.Fprintf(w, "checked %d blobs (%s): %d corrupt, %d missing\n", r.BlobsChecked, api.FormatBytes(r.BytesChecked), len(r.Corrupt), len(r.Missing))
				for _, d := range r.Corrupt {
					fmt.Fprintf(w, "  corrupt: %s\n", d)
				}
				for _, d := range r.Missing {
					fmt.Fprintf(w, "  missing: %s\n", d)
				}
				for _, a := range r.Refetching {
					fmt.Fprintf(w, "  re-fetching: %s\n", a)
				}
			}); err != nil {
				return err
			}
			if len(r.Corrupt)+len(r.Missing) > 0 { // found damage: exit 1 after the report
				return cli.Exit("", exitFailure)
			}
			return nil
		},
	}
}

func gcCommand() *cli.Command {
	return &cli.Command{
		Name: "gc", Usage: "remove blobs that no artifact uses, and partial downloads no pull will resume",
		Flags: []cli.Flag{&cli.BoolFlag{Name: "dry-run", Usage: "print what would be removed and the bytes, remove nothing"}},
		Action: func(c *cli.Context) error {
			r, err := client(c).GC(c.Context, c.Bool("dry-run"))
			if err != nil {
				return err
			}
			return output(c, r, func(w io.Writer) {
				verb := "removed"
				if r.DryRun {
					verb = "would remove"
					for _, d := range r.Removed {
						fmt.Fprintf(w, "  %s\n", d)
					}
				}
				fmt.Fprintf(w, "%s %d blobs, %s; %d partial downloads, %s; %d blobs in use\n", verb, r.BlobsRemoved, api.FormatBytes(r.BytesFreed), r.IngestsRemoved, api.FormatBytes(r.IngestBytesFreed), r.BlobsKept)
			})
		},
	}
}

func versionCommand() *cli.Command {
	return &cli.Command{
		Name: "version", Usage: "the versions of modelctl and of the daemon it talks to",
		Action: func(c *cli.Context) error {
			v := struct {
				Client string `json:"client"`
				Daemon string `json:"daemon,omitempty"`
			}{Client: version}
			s, err := client(c).Status(c.Context)
			if err == nil {
				v.Daemon = s.Version
			}
			if oerr := output(c, v, func(w io.Writer) {
				fmt.Fprintf(w, "modelctl:    %s\n", v.Client)
				if err == nil {
					fmt.Fprintf(w, "modelcached: %s\n", v.Daemon)
				}
			}); oerr != nil {
				return oerr
			}
			return err // the daemon's side could not be read
		},
	}
}

func duCommand() *cli.Command {
	return &cli.Command{
		Name: "du", Usage: "disk use per artifact (unique and shared bytes), of the store and its filesystem",
		Action: func(c *cli.Context) error {
			u, err := client(c).Usage(c.Context)
			if err != nil {
				return err
			}
			return output(c, u, func(w io.Writer) {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tSIZE\tUNIQUE\tSHARED\tKERNEL CACHES")
				sort.Slice(u.Artifacts, func(i, j int) bool { return u.Artifacts[i].Bytes > u.Artifacts[j].Bytes })
				for _, a := range u.Artifacts {
					kc := ""
					switch {
					case a.KernelCacheBytes > 0:
						kc = "+" + api.FormatBytes(a.KernelCacheBytes)
					case a.Serves != "":
						kc = "(of " + a.Serves + ")"
					}
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", a.Name, api.FormatBytes(a.Bytes), api.FormatBytes(a.UniqueBytes), api.FormatBytes(a.SharedBytes), kc)
				}
				tw.Flush()
				fmt.Fprintf(w, "store %s in %d blobs at %s; filesystem %s free of %s\n", api.FormatBytes(u.StoreBytes), u.Blobs, u.Root, api.FormatBytes(u.FSFreeBytes), api.FormatBytes(u.FSCapacityBytes))
			})
		},
	}
}

func statusCommand() *cli.Command {
	return &cli.Command{
		Name: "status", Usage: "the daemon at a glance",
		Action: func(c *cli.Context) error {
			s, err := client(c).Status(c.Context)
			if err != nil {
				return err
			}
			return output(c, s, func(w io.Writer) {
				fmt.Fprintf(w, "modelcached %s, up %s\nroot %s, socket %s, models dir %s, direct I/O %v\n", s.Version, time.Since(s.Started).Round(time.Second), s.Root, s.Socket, s.ModelsDir, s.DirectIO)
				fmt.Fprintf(w, "artifacts: %d ready, %d downloading, %d pending, %d failed\n", s.Phases[api.PhaseReady], s.Phases[api.PhaseDownloading], s.Phases[api.PhasePending], s.Phases[api.PhaseFailed])
				fmt.Fprintf(w, "store %s; filesystem %s free\n", api.FormatBytes(s.StoreBytes), api.FormatBytes(s.FSFreeBytes))
				fmt.Fprintln(w, capacityText(s))
				if len(s.Credentials) > 0 {
					fmt.Fprintf(w, "credentials of the daemon's own: %s\n", strings.Join(s.Credentials, ", "))
				}
				if s.DiskPressure {
					fmt.Fprintln(w, "disk pressure: over the quota or above the high watermark")
				}
				if le := s.LastEviction; le != nil {
					fmt.Fprintf(w, "last eviction %s: %d evicted, %s freed", le.At.Format(time.RFC3339), len(le.Evicted), api.FormatBytes(le.BytesFreed))
					if le.ShortBytes > 0 {
						fmt.Fprintf(w, ", %s could not be freed (pinned, in use or too young)", api.FormatBytes(le.ShortBytes))
					}
					fmt.Fprintln(w)
					for _, f := range le.Failed {
						fmt.Fprintf(w, "  failed: %s\n", f)
					}
				}
				for _, e := range s.ModelsDirError {
					fmt.Fprintf(w, "models dir problem: %s\n", e)
				}
			})
		},
	}
}

func pinCommand(name, usage string, pin bool) *cli.Command {
	return &cli.Command{
		Name: name, Usage: usage, ArgsUsage: "NAME",
		Action: func(c *cli.Context) error {
			cl := client(c)
			call := cl.Unpin
			if pin {
				call = cl.Pin
			}
			a, err := call(c.Context, c.Args().First())
			if err != nil {
				return err
			}
			return output(c, a, func(w io.Writer) { fmt.Fprintf(w, "%s: pinned=%v\n", a.Name, a.Pinned) })
		},
	}
}
