// Command modelctl is the command line of modelcached: it talks to the
// daemon over its unix socket.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"
	"sigs.k8s.io/yaml"

	"github.com/modelcache/modelcache/api"
)

var version = "dev"

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

type usageError struct{ msg string }

func (u usageError) Error() string { return u.msg }

func usagef(format string, args ...any) error { return usageError{fmt.Sprintf(format, args...)} }

func main() {
	out := bufio.NewWriterSize(os.Stdout, 64<<10) // a table of 10,000 rows is one write, not 10,000
	code := run(os.Args, out, os.Stderr)
	out.Flush()
	os.Exit(code)
}

func run(args []string, stdout, stderr io.Writer) int {
	app := newApp(stdout, stderr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := app.RunContext(ctx, intersperse(app, args))
	if err == nil {
		return exitOK
	}
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintln(stderr, "modelctl:", ue.msg)
		fmt.Fprintln(stderr, "Run 'modelctl --help' for usage.")
		return exitUsage
	}
	fmt.Fprintln(stderr, "modelctl:", explain(err, app.Metadata["socket"]))
	return exitFailure
}

// explain adds the remedy to the errors people hit.
func explain(err error, socket any) string {
	var ua *api.UnavailableError
	switch {
	case errors.As(err, &ua):
		return fmt.Sprintf("%v\n  Is modelcached running? Start it with 'make run' (development) or 'sudo systemctl start modelcached',\n  or point --socket / MODELCACHE_SOCKET at the socket it serves.", err)
	case errors.Is(err, api.ErrForbidden):
		return err.Error()
	case errors.Is(err, api.ErrNotFound):
		return err.Error() + "\n  'modelctl list' shows what the cache holds."
	}
	return err.Error()
}

// pullFailed says what a failed pull leaves behind: the desire stays (the
// daemon keeps trying, or waits for it to change), and how to drop it.
func pullFailed(name string, a *api.Artifact, err error) error {
	if !errors.Is(err, api.ErrFailed) {
		return err
	}
	next := "the daemon retries it with backoff"
	if a != nil && a.NextRetry == nil {
		next = "the daemon does not retry it (" + a.Reason + ") until the desire changes or you pull again"
	} else if a != nil {
		next += " (next attempt " + a.NextRetry.Local().Format("15:04:05") + ")"
	}
	return fmt.Errorf("%w\n  The desire for %s stays: %s.\n  Fix the URI and pull again, or drop the desire with 'modelctl evict %s'.", err, name, next, name)
}

func newApp(stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:      "modelctl",
		Usage:     "control modelcached, the node-local model cache",
		Version:   version,
		Writer:    stdout,
		ErrWriter: stderr,
		Metadata:  map[string]any{},
		// modelctl --generate-bash-completion lists what may follow; the
		// shell scripts in packaging/deb/completions call it.
		EnableBashCompletion: true,
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "socket", Value: api.DefaultSocket, EnvVars: []string{"MODELCACHE_SOCKET"}, Usage: "the daemon's unix socket"},
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "table", Usage: "table, json or yaml"},
		},
		Before: func(c *cli.Context) error {
			switch c.String("output") {
			case "table", "json", "yaml":
			default:
				return usagef("-o %q: want table, json or yaml", c.String("output"))
			}
			c.App.Metadata["socket"] = c.String("socket")
			return nil
		},
		OnUsageError: func(c *cli.Context, err error, _ bool) error { return usageError{err.Error()} },
		CommandNotFound: func(c *cli.Context, cmd string) {
			fmt.Fprintf(stderr, "modelctl: no command %q. Run 'modelctl --help' for usage.\n", cmd)
			os.Exit(exitUsage)
		},
		Commands: commands(),
	}
	for _, c := range app.Commands {
		c.OnUsageError = app.OnUsageError
	}
	return app
}

func client(c *cli.Context) *api.Client { return &api.Client{Socket: c.String("socket")} }

func needArgs(c *cli.Context, n int, what string) error {
	if c.NArg() != n {
		return usagef("%s: want %s", c.Command.Name, what)
	}
	return nil
}

func commands() []*cli.Command {
	return []*cli.Command{
		{
			Name: "list", Aliases: []string{"ls"}, Usage: "list artifacts with their phase, revision and size",
			Action: func(c *cli.Context) error {
				list, err := client(c).List(c.Context)
				if err != nil {
					return err
				}
				return output(c, list, func(w io.Writer) {
					tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "NAME\tPHASE\tENTRY\tREVISION\tSIZE\tPINNED\tIN USE\tSOURCE / MESSAGE")
					for _, a := range list {
						detail := a.URI
						if a.Phase != api.PhaseReady && a.Message != "" {
							detail = a.Message
						}
						if a.Progress != nil && a.Phase == api.PhaseDownloading {
							detail = progressText(a.Progress)
						}
						entry := a.Entry
						if entry == "" {
							entry = "-"
						}
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%v\t%s\t%s\n", a.Name, a.Phase, entry, short(a.Revision), api.FormatBytes(a.Bytes), a.Pinned, inUseText(a.InUse), detail)
					}
					tw.Flush()
				})
			},
		},
		{
			Name: "inspect", Usage: "show one artifact: desire, versions, files", ArgsUsage: "NAME",
			Action: func(c *cli.Context) error {
				if err := needArgs(c, 1, "NAME"); err != nil {
					return err
				}
				a, err := client(c).Get(c.Context, c.Args().First())
				if err != nil {
					return err
				}
				return output(c, a, nil) // the table format shows YAML: one artifact has no rows
			},
		},
		{
			Name: "pull", Usage: "fetch an artifact into the cache and keep it desired", ArgsUsage: "URI",
			Description: "URI is hf://org/repo[@revision], s3://bucket/prefix, oci://registry/repo:tag|@sha256:<hex>,\n" +
				"ngc://org[/team]/model[:version] (NVIDIA NGC; no version: the latest, then pinned),\n" +
				"http(s)://host/path[#sha256=<hex>] or file:///abs/path (a file or a directory tree).\n" +
				"The desire is persisted: the daemon keeps the artifact present and retries failures until 'modelctl evict'.\n" +
				"A plain pull is an ad-hoc cache entry: to admit another pull the daemon may evict it, least recently used\n" +
				"first (list shows ENTRY ad-hoc); --keep or --pin declare it, and only disk pressure (--keep) or nothing (--pin) evicts it;\n" +
				"a source that does not exist or refuses access is not retried until the desire changes or it is pulled again.\n" +
				"Kernel caches (oci:// images in GKM's MCV layout) must be signed: --key cosign.pub, or keyless\n" +
				"--identity/--issuer/--trusted-root; see docs/operator.md (GPUs and kernel caches).",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "name", Usage: "artifact name (letters, digits, '.', '_', '-')"},
				&cli.BoolFlag{Name: "pin", Usage: "never evict it by policy"},
				&cli.BoolFlag{Name: "keep", Usage: "declare it: never evicted to make room for another pull (disk pressure still may; --pin never)"},
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
				if err := needArgs(c, 1, "one URI"); err != nil {
					return err
				}
				if c.String("name") == "" {
					return usagef("pull: --name NAME is required (the name the model will have under models/)")
				}
				req := api.PullRequest{
					Name: c.String("name"), URI: c.Args().First(), Digest: c.String("digest"), Pin: c.Bool("pin"), Keep: c.Bool("keep"),
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
				if c.Bool("no-wait") {
					a, err := client(c).Pull(c.Context, req, false, nil)
					if err != nil {
						return err
					}
					return output(c, a, func(w io.Writer) { fmt.Fprintf(w, "%s: %s\n", a.Name, a.Phase) })
				}
				p := newProgress(c.App.ErrWriter)
				a, err := client(c).Pull(c.Context, req, true, p.event)
				p.finish()
				if err != nil {
					return pullFailed(req.Name, a, err)
				}
				return output(c, a, func(w io.Writer) {
					fmt.Fprintf(w, "%s: Ready at %s (revision %s, %s)\n", a.Name, a.Path, short(a.Revision), api.FormatBytes(a.Bytes))
				})
			},
		},
		{
			Name: "man", Hidden: true, Usage: "print the manual page (roff), for packaging",
			Action: func(c *cli.Context) error {
				m, err := c.App.ToManWithSection(1)
				if err != nil {
					return err
				}
				fmt.Fprint(c.App.Writer, m)
				return nil
			},
		},
		{
			Name: "gpu", Usage: "this node's GPUs as the daemon sees them (NVML, or a simulated inventory)",
			Action: func(c *cli.Context) error {
				g, err := client(c).GPU(c.Context)
				if err != nil {
					return err
				}
				return output(c, g, func(w io.Writer) { printGPU(w, g) })
			},
		},
		{
			Name: "env", Usage: "the environment a framework needs for an artifact (paths, TRITON_CACHE_DIR, VLLM_CACHE_ROOT, …) as export lines", ArgsUsage: "NAME",
			Description: "For a model: MODEL_PATH, HF_HUB_CACHE and HF_HUB_OFFLINE for hub models, and the cache directories of its\n" +
				"Ready, compatible kernel caches. For a kernel cache: its cache directories. Use: eval \"$(modelctl env NAME)\"",
			Action: func(c *cli.Context) error {
				if err := needArgs(c, 1, "NAME"); err != nil {
					return err
				}
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
		},
		{
			Name: "wait", Usage: "wait until an artifact is Ready (exit 0) or Failed (exit 1); for init containers", ArgsUsage: "NAME",
			Flags: []cli.Flag{&cli.DurationFlag{Name: "timeout", Usage: "give up after this long (0: never)"}},
			Action: func(c *cli.Context) error {
				if err := needArgs(c, 1, "NAME"); err != nil {
					return err
				}
				p := newProgress(c.App.ErrWriter)
				a, err := client(c).Wait(c.Context, c.Args().First(), c.Duration("timeout"), p.event)
				p.finish()
				if err != nil {
					return err
				}
				return output(c, a, func(w io.Writer) { fmt.Fprintf(w, "%s: Ready at %s\n", a.Name, a.Path) })
			},
		},
		pinCommand("pin", "protect an artifact's current version from eviction", true),
		pinCommand("unpin", "let an artifact's current version be evicted again", false),
		{
			Name: "evict", Usage: "remove an artifact (or one revision) and its desire, then free unused blobs", ArgsUsage: "NAME",
			Flags: []cli.Flag{
				&cli.StringFlag{Name: "revision", Usage: "remove only this revision"},
				&cli.BoolFlag{Name: "force", Usage: "remove even if pinned"},
			},
			Action: func(c *cli.Context) error {
				if err := needArgs(c, 1, "NAME"); err != nil {
					return err
				}
				r, err := client(c).Evict(c.Context, c.Args().First(), c.String("revision"), c.Bool("force"))
				if err != nil {
					return err
				}
				return output(c, r, func(w io.Writer) {
					fmt.Fprintf(w, "%s: evicted %d revision(s); freed %s in %d blob(s)\n", r.Name, len(r.Revisions), api.FormatBytes(r.GC.BytesFreed), r.GC.BlobsRemoved)
				})
			},
		},
		{
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
		},
		{
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
		},
		leaseCommand(),
		{
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
		},
		{
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
		},
	}
}

func pinCommand(name, usage string, pin bool) *cli.Command {
	return &cli.Command{
		Name: name, Usage: usage, ArgsUsage: "NAME",
		Action: func(c *cli.Context) error {
			if err := needArgs(c, 1, "NAME"); err != nil {
				return err
			}
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

// output writes v as JSON or YAML, or calls table for the table format.
func output(c *cli.Context, v any, table func(io.Writer)) error {
	w := c.App.Writer
	format := c.String("output")
	switch {
	case format == "json":
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	case format == "yaml" || table == nil:
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	table(w)
	return nil
}

// inUseText is the IN USE column: "-" or the first holder and a count.
func inUseText(hs []api.Holder) string {
	if len(hs) == 0 {
		return "-"
	}
	s := hs[0].Kind + ":" + hs[0].ID
	if len(hs) > 1 {
		s += fmt.Sprintf(" (+%d)", len(hs)-1)
	}
	return s
}

func short(rev string) string {
	if len(rev) > 12 {
		return rev[:12]
	}
	return rev
}

func progressText(p *api.Progress) string {
	s := fmt.Sprintf("%d/%d files, %s", p.FilesDone, p.FilesTotal, api.FormatBytes(p.BytesDone))
	if p.BytesTotal > 0 {
		s += fmt.Sprintf(" of %s (%.0f%%)", api.FormatBytes(p.BytesTotal), 100*float64(p.BytesDone+p.BytesSkipped)/float64(p.BytesTotal))
	}
	if p.BytesSkipped > 0 {
		s += fmt.Sprintf(", %s already cached", api.FormatBytes(p.BytesSkipped))
	}
	return s + fmt.Sprintf(", %s/s", api.FormatBytes(int64(p.BytesPerSecond)))
}

// progress draws a bar on a terminal and plain lines otherwise.
type progress struct {
	w    io.Writer
	tty  bool
	last string
	drew bool
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.tty = true
	}
	return p
}

func (p *progress) event(ev api.Event) {
	a := ev.Artifact
	if a == nil {
		return
	}
	line := fmt.Sprintf("%s: %s", a.Name, a.Phase)
	if a.Progress != nil && a.Phase == api.PhaseDownloading {
		line += " " + progressText(a.Progress)
	} else if a.Message != "" {
		line += " " + a.Message
	}
	if p.tty {
		bar := ""
		if pr := a.Progress; pr != nil && pr.BytesTotal > 0 {
			frac := float64(pr.BytesDone+pr.BytesSkipped) / float64(pr.BytesTotal)
			n := int(frac * 30)
			bar = "[" + strings.Repeat("=", min(n, 30)) + strings.Repeat(" ", 30-min(n, 30)) + "] "
		}
		fmt.Fprintf(p.w, "\r\033[K%s%s", bar, line)
		p.drew = true
		return
	}
	if line != p.last {
		fmt.Fprintln(p.w, line)
		p.last = line
	}
}

func (p *progress) finish() {
	if p.tty && p.drew {
		fmt.Fprintln(p.w)
	}
}
