// Command modelctl is the command line of modelcached: it talks to the
// daemon over its unix socket.
//
// Where to find what:
//
//	main.go        the app, its global flags and the command table; how an error
//	               is reported (exit codes, the remedy)
//	args.go        a command line taken apart and checked whole before anything runs
//	commands.go    the commands: list, inspect, wait, retry, evict, verify, gc, du, pin, ...
//	pull.go        modelctl pull: the credentials note, how a followed pull (or retry) ends
//	lease.go       modelctl lease: hold an artifact while modelctl or a command runs
//	warm.go        modelctl warm: read an artifact into the page cache ahead of its consumer
//	gpu.go         the gpu command's output and the signature policy flags
//	describe.go    the human output: list's table, inspect's description
//	progress.go    a pull's progress lines on a terminal
//	completion.go  shell completion scripts and the completions they ask for
//	socket.go      why the socket could not be used, and the remedy
//	kernelcache.go modelctl kernelcache build and capture: images made, pushed and
//	               signed in this process (package kernelcache), never by the daemon
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"reflect"
	"regexp"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"
	"sigs.k8s.io/yaml"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/internal/cliutil"
)

var version = "dev"

// Exit codes.
const (
	exitOK          = 0
	exitFailure     = 1
	exitUsage       = 2
	exitInterrupted = 130 // 128 + SIGINT, as a shell reports it
)

// usageError is a command line modelctl cannot run: one line per
// problem, then where to look.
type usageError struct {
	msgs []string
	cmd  string // the command whose help explains it; "" for the top level
}

func (u usageError) Error() string { return strings.Join(u.msgs, "; ") }

func usagef(format string, args ...any) error {
	return usageError{msgs: []string{fmt.Sprintf(format, args...)}}
}

// detachedError ends a command that a signal interrupted while the
// daemon goes on with the work.
type detachedError struct{ msg string }

func (d detachedError) Error() string { return d.msg }

func main() {
	out := bufio.NewWriterSize(os.Stdout, 64<<10) // a table of 10,000 rows is one write, not 10,000
	code := run(os.Args, out, os.Stderr)
	out.Flush()
	os.Exit(code)
}

// run is modelctl: it returns the exit code and never exits itself, so
// that what was written reaches stdout first.
func run(args []string, stdout, stderr io.Writer) int {
	app := newApp(stdout, stderr)
	if len(args) > 1 && args[1] == completeCommand { // the shell asks what may follow
		complete(app, args[2:], stdout)
		return exitOK
	}
	inv := split(app, args)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := inv.check(app)
	if err == nil {
		err = app.RunContext(ctx, inv.argv(args[0]))
	}
	if errors.Is(err, api.ErrInvalid) && inv.cmd != nil {
		// The daemon refused an argument or a flag's value (a name, a
		// digest, a URI): a usage error, as if modelctl had found it.
		err = usageError{msgs: []string{err.Error()}, cmd: inv.cmd.Name}
	}
	return report(ctx, err, stderr, app.Metadata["socket"])
}

// report writes err for people and returns the exit code.
func report(ctx context.Context, err error, stderr io.Writer, socket any) int {
	if err == nil {
		return exitOK
	}
	var ue usageError
	if errors.As(err, &ue) {
		for _, m := range ue.msgs {
			fmt.Fprintln(stderr, "modelctl:", m)
		}
		where := "modelctl --help"
		if ue.cmd != "" {
			where = "modelctl " + ue.cmd + " --help"
		}
		fmt.Fprintf(stderr, "Run '%s' for usage.\n", where)
		return exitUsage
	}
	var de detachedError
	if errors.As(err, &de) {
		fmt.Fprintln(stderr, "modelctl:", de.msg)
		return exitInterrupted
	}
	if ctx.Err() != nil { // SIGINT or SIGTERM while a command waited
		fmt.Fprintln(stderr, "modelctl: interrupted")
		return exitInterrupted
	}
	var ec cli.ExitCoder
	if errors.As(err, &ec) {
		if m := ec.Error(); m != "" {
			fmt.Fprintln(stderr, "modelctl:", m)
		}
		return ec.ExitCode()
	}
	fmt.Fprintln(stderr, "modelctl:", explain(err, socket))
	return exitFailure
}

// explain adds the remedy to the errors people hit.
func explain(err error, socket any) string {
	var ua *api.UnavailableError
	switch {
	case errors.As(err, &ua):
		return unreachable(ua)
	case errors.Is(err, api.ErrForbidden):
		return err.Error()
	case errors.Is(err, api.ErrNotFound):
		return err.Error() + "\n  'modelctl list' shows what the cache holds."
	case errors.Is(err, api.ErrRateLimited):
		return err.Error() + "\n  The daemon limits how often one user starts such work; wait a little and run it again."
	}
	return err.Error()
}

// pullFailed says what a failed pull leaves behind and what fixes it,
// by the failure's kind: the desire stays (the daemon retries it, or
// waits for it to change or for modelctl retry), and how to drop it; or,
// where the daemon dropped a new name's desire after a failure no retry
// can fix (the artifact is no longer Failed), that nothing stays.
func pullFailed(name string, a *api.Artifact, err error) error {
	if !errors.Is(err, api.ErrFailed) {
		return err
	}
	reason := ""
	if a != nil {
		reason = a.Reason
	}
	if a != nil && a.Phase != api.PhaseFailed {
		return fmt.Errorf("%w\n  %s, and pull again; --keep keeps the desire (Failed, shown by list) when a pull fails.", err, remedy(reason, false))
	}
	next := "the daemon retries it with backoff"
	if a != nil && a.NextRetry == nil {
		next = "the daemon does not retry it (" + a.Reason + ") until the desire changes or 'modelctl retry " + name + "' asks"
	} else if a != nil {
		next += " (next attempt " + a.NextRetry.Local().Format("15:04:05") + "; 'modelctl retry " + name + "' tries now)"
	}
	drop := "drop the desire with 'modelctl evict " + name + "'"
	if a != nil && a.Desire != nil {
		switch o := a.Desire.Origin; {
		case strings.HasPrefix(o, "file:"):
			drop = "drop it by removing it from " + strings.TrimPrefix(o, "file:")
		case o != "" && o != "api":
			drop = "the cluster declares it (" + o + "): change or delete its ModelCache to drop it"
		}
	}
	return fmt.Errorf("%w\n  The desire for %s stays: %s.\n  %s, then 'modelctl retry %s'; or %s.", err, name, next, remedy(reason, true), name, drop)
}

// remedy is what fixes a failure of the given reason (api.Reason*);
// stays says the desire stays (the fix is followed by a retry, not a new
// pull).
func remedy(reason string, stays bool) string {
	switch reason {
	case api.ReasonSourceNotFound, api.ReasonInvalidSource:
		return "Fix the URI (or create what it names)"
	case api.ReasonDigestMismatch:
		return "Check the expected digest (#sha256=, --digest) against the source"
	case api.ReasonAccessDenied:
		return "Give modelcached access: credentials are the daemon's, not modelctl's (its environment, a models.d credentialsFile, a ModelCache's secretRef: docs/operator.md, Credentials); a file:// path must be readable by the identity the message names"
	case api.ReasonInsufficientCapacity:
		return "Make room: free space, raise the quota, or evict or unpin artifacts (modelctl evict, modelctl unpin)"
	case api.ReasonSignatureFailed:
		return "Sign the image with a key the policy trusts, or fix the policy (--key, --identity, --issuer)"
	case api.ReasonSourceInconsistent, api.ReasonSourceChanged:
		return "The source contradicts itself or changed under its recorded digest; fix the source"
	}
	if stays {
		return "If the cause persists, fix it"
	}
	return "Fix the cause"
}

func newApp(stdout, stderr io.Writer) *cli.App {
	app := &cli.App{
		Name:      "modelctl",
		Usage:     "control modelcached, the node-local model cache",
		Version:   version,
		Writer:    stdout,
		ErrWriter: stderr,
		Metadata:  map[string]any{},
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "socket", Value: api.DefaultSocket, EnvVars: []string{"MODELCACHE_SOCKET"}, Usage: "the daemon's unix socket"},
			&cli.StringFlag{Name: "output", Aliases: []string{"o"}, Value: "table", Usage: "table, wide (list: the full source), json, yaml, or name (list: one name a line)"},
		},
		Before: func(c *cli.Context) error {
			switch c.String("output") {
			case "table", "wide", "json", "yaml":
			case "name":
				// c.Args() begins with the command: only list has names to
				// print and nothing else to say.
				if cmd := c.App.Command(c.Args().First()); cmd == nil || cmd.Name != "list" {
					return usagef("-o name: only list prints names; want table, wide, json or yaml")
				}
			default:
				hint := ""
				if s := cliutil.Suggest([]string{"table", "wide", "json", "yaml", "name"}, c.String("output")); s != "" {
					hint = fmt.Sprintf(" (did you mean -o %s?)", s)
				}
				return usagef("-o %q%s: want table, wide, json, yaml or name (list)", c.String("output"), hint)
			}
			c.App.Metadata["socket"] = c.String("socket")
			return nil
		},
		// The command line was checked whole before (invocation.check);
		// what urfave/cli still finds is reported the same way.
		OnUsageError: func(c *cli.Context, err error, _ bool) error {
			return usageError{msgs: []string{dashes(err.Error())}}
		},
		// Errors come back to run, which flushes stdout before exiting.
		ExitErrHandler: func(*cli.Context, error) {},
		Commands:       commands(),
	}
	for _, c := range app.Commands {
		c.OnUsageError = func(cc *cli.Context, err error, _ bool) error {
			return usageError{msgs: []string{dashes(err.Error())}, cmd: cc.Command.Name}
		}
	}
	return app
}

// dashes rewrites the flag package's "-name" as "--name".
func dashes(msg string) string {
	return flagInMsg.ReplaceAllStringFunc(msg, func(m string) string {
		name := strings.TrimLeft(m[strings.Index(m, "-"):], "-")
		return m[:strings.Index(m, "-")] + cliutil.Flag(name)
	})
}

var flagInMsg = regexp.MustCompile(`(^|[\s:])-{1,2}[A-Za-z][\w-]*`)

func client(c *cli.Context) *api.Client { return &api.Client{Socket: c.String("socket")} }

// commands is the table of modelctl's commands, in the order help lists
// them; each is defined by its own function. docs/flags.md's tables of
// them and their flags are written from them (TestCommandsDoc compares):
//
//go:generate go test -run ^TestCommandsDoc$ -update-docs .
func commands() []*cli.Command {
	return []*cli.Command{
		listCommand(),
		inspectCommand(),
		pullCommand(),
		manCommand(),
		gpuCommand(),
		envCommand(),
		waitCommand(),
		retryCommand(),
		pinCommand("pin", "protect an artifact's current version from eviction", true),
		pinCommand("unpin", "let an artifact's current version be evicted again", false),
		evictCommand(),
		verifyCommand(),
		gcCommand(),
		versionCommand(),
		leaseCommand(),
		warmCommand(),
		completionCommand(),
		duCommand(),
		statusCommand(),
		kernelcacheCommand(),
	}
}

// output writes v as JSON or YAML, or calls table for the table (and
// wide) formats.
func output(c *cli.Context, v any, table func(io.Writer)) error {
	w := c.App.Writer
	format := c.String("output")
	switch {
	case format == "json":
		return api.WriteJSON(w, v, "  ")
	case format == "yaml":
		return writeYAML(w, v)
	}
	table(w)
	return nil
}

// writeYAML writes v as sigs.k8s.io/yaml's Marshal does. A non-empty
// slice goes one element at a time, each marshalled alone and written as
// an item of the sequence: Marshal goes through JSON and a generic tree
// of the whole value, which for a large list costs hundreds of MiB and
// seconds (docs/benchmarks.md, the list row). The items are the same YAML; a string long enough for the
// emitter to fold may fold at other spaces, two columns further in.
func writeYAML(w io.Writer, v any) error {
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Slice || rv.Len() == 0 {
		b, err := yaml.Marshal(v)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	for i := range rv.Len() {
		b, err := yaml.Marshal(rv.Index(i).Interface())
		if err != nil {
			return err
		}
		lines := bytes.SplitAfter(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
		for j, l := range lines {
			switch {
			case j == 0:
				bw.WriteString("- ")
			case len(l) > 1: // an empty line of a block scalar stays empty
				bw.WriteString("  ")
			}
			bw.Write(l)
		}
		bw.WriteByte('\n')
	}
	return bw.Flush()
}

// inUseText is the IN USE column: "-" or the first holder and a count.
func inUseText(hs []api.Holder) string {
	if len(hs) == 0 {
		return "-"
	}
	s := hs[0].String()
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
	have := p.BytesDone + p.BytesSkipped // the amount and the percentage count the same bytes
	s := fmt.Sprintf("%d/%d files, %s", p.FilesDone, p.FilesTotal, api.FormatBytes(have))
	if p.BytesTotal > 0 {
		s += fmt.Sprintf(" of %s (%.0f%%)", api.FormatBytes(p.BytesTotal), 100*float64(have)/float64(p.BytesTotal))
	}
	if p.BytesSkipped > 0 {
		s += fmt.Sprintf(", %s of it already cached", api.FormatBytes(p.BytesSkipped))
	}
	return s + fmt.Sprintf(", %s/s", api.FormatBytes(int64(p.BytesPerSecond)))
}
