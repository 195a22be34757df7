package main

import (
	"fmt"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/modelcache/modelcache/internal/cliutil"
)

// invocation is a command line taken apart: global flags, the command,
// its flags and its positional arguments. urfave/cli v2 stops reading
// flags at the first argument and reports only the first bad flag; the
// parts are checked here, whole, before anything runs, and put back in
// the order urfave/cli reads ("modelctl pull URI --name x" works).
type invocation struct {
	globals []string
	cmdName string // as typed (an alias stays an alias)
	// subNames are the subcommands typed after it ("kernelcache build"):
	// cmd is the last of them.
	subNames []string
	cmd      *cli.Command
	flags    []string
	pos      []string
	help     bool // -h/--help among the command's flags
}

// split takes args (args[0] is the program) apart. A global flag after
// the command ("inspect m -o json") moves in front of it.
func split(app *cli.App, args []string) invocation {
	var inv invocation
	i := 1
	for ; i < len(args); i++ { // global flags up to the command
		tok := args[i]
		if !cliutil.IsFlag(tok) {
			break
		}
		inv.globals = append(inv.globals, tok)
		if takesValue(app.Flags, tok) && i+1 < len(args) && !cliutil.IsFlag(args[i+1]) {
			i++
			inv.globals = append(inv.globals, args[i])
		}
	}
	if i >= len(args) {
		return inv
	}
	inv.cmdName = args[i]
	inv.cmd = app.Command(args[i])
	if inv.cmd == nil {
		inv.pos = args[i+1:]
		return inv
	}
	for i+1 < len(args) && len(inv.cmd.Subcommands) > 0 && !cliutil.IsFlag(args[i+1]) && inv.cmd.Command(args[i+1]) != nil {
		i++
		inv.subNames = append(inv.subNames, args[i])
		inv.cmd = inv.cmd.Command(args[i])
	}
	for j := i + 1; j < len(args); j++ {
		tok := args[j]
		if tok == "--" {
			inv.pos = append(inv.pos, args[j+1:]...)
			break
		}
		if !cliutil.IsFlag(tok) {
			inv.pos = append(inv.pos, tok)
			continue
		}
		flags := &inv.flags
		fs := inv.cmd.Flags
		if globalFlag(inv.cmd, app, tok) {
			flags, fs = &inv.globals, app.Flags
		}
		*flags = append(*flags, tok)
		if takesValue(fs, tok) && j+1 < len(args) && !cliutil.IsFlag(args[j+1]) {
			j++
			*flags = append(*flags, args[j])
		}
		if n := flagName(tok); n == "h" || n == "help" {
			inv.help = true
		}
	}
	return inv
}

// argv puts the parts back in the order urfave/cli reads.
func (inv invocation) argv(prog string) []string {
	out := append([]string{prog}, inv.globals...)
	if inv.cmdName == "" {
		return out
	}
	out = append(out, inv.cmdName)
	out = append(out, inv.subNames...)
	out = append(out, inv.flags...)
	if len(inv.pos) > 0 {
		if inv.cmd != nil {
			out = append(out, "--")
		}
		out = append(out, inv.pos...)
	}
	return out
}

// intersperse is split followed by argv.
func intersperse(app *cli.App, args []string) []string {
	if len(args) == 0 {
		return args
	}
	return split(app, args).argv(args[0])
}

// check returns the usage errors of the invocation, all of them: bad
// global flags, an unknown command, bad command flags, a wrong number of
// arguments.
func (inv invocation) check(app *cli.App) error {
	_, problems := cliutil.CheckFlags(app.Flags, inv.globals, true)
	if inv.cmdName != "" && inv.cmd == nil && inv.cmdName != "help" && inv.cmdName != "h" {
		p := fmt.Sprintf("unknown command %q", inv.cmdName)
		var names []string
		for _, c := range app.Commands {
			if !c.Hidden {
				names = append(names, c.Names()...)
			}
		}
		if s := cliutil.Suggest(names, inv.cmdName); s != "" {
			p += fmt.Sprintf(" (did you mean %q?)", s)
		}
		problems = append(problems, p)
	}
	cmd := "" // the help that explains the problems: the command's when it has some
	if inv.cmd != nil {
		_, cp := cliutil.CheckFlags(inv.cmd.Flags, inv.flags, false)
		// After a bad flag the count of arguments means little ("--nmae x"
		// leaves x as an argument): report the flag alone.
		if p := arity(inv.cmd, inv.pos); p != "" && !inv.help && len(cp) == 0 {
			cp = append(cp, p)
		}
		if len(cp) > 0 {
			cmd = inv.cmd.Name
		}
		problems = append(problems, cp...)
	}
	if len(problems) == 0 {
		return nil
	}
	return usageError{msgs: problems, cmd: cmd}
}

// arity checks the number of positional arguments against the command's
// ArgsUsage: none, exactly one NAME/URI, "[NAME...]" any number, and
// "NAME [-- COMMAND ...]" at least one.
func arity(cmd *cli.Command, pos []string) string {
	want := cmd.ArgsUsage
	switch {
	case strings.HasPrefix(want, "["):
		return ""
	case want == "":
		if len(pos) > 0 {
			return fmt.Sprintf("%s takes no arguments (got %s)", cmd.Name, quoteAll(pos))
		}
	case strings.Contains(want, "..."):
		if len(pos) == 0 {
			return fmt.Sprintf("%s: want %s", cmd.Name, want)
		}
	default:
		n := len(strings.Fields(want))
		if len(pos) < n {
			return fmt.Sprintf("%s: want %s", cmd.Name, want)
		}
		if len(pos) > n {
			return fmt.Sprintf("%s takes one %s; unexpected %s", cmd.Name, want, quoteAll(pos[n:]))
		}
	}
	return ""
}

func quoteAll(s []string) string {
	q := make([]string, len(s))
	for i, x := range s {
		q[i] = fmt.Sprintf("%q", x)
	}
	return strings.Join(q, " ")
}

func flagName(tok string) string {
	n, _, _ := strings.Cut(strings.TrimLeft(tok, "-"), "=")
	return n
}

// globalFlag says whether tok, after the command, is read as a global
// flag: it names one and no flag of the command, or it is a typo of one
// and close to no flag of the command ("list --otput json").
func globalFlag(cmd *cli.Command, app *cli.App, tok string) bool {
	name := flagName(tok)
	if cliutil.Lookup(cmd.Flags, name) != nil {
		return false
	}
	return cliutil.Lookup(app.Flags, name) != nil || meant(cmd.Flags, tok) == nil && meant(app.Flags, tok) != nil
}

// meant is the flag tok names or, failing that, is a typo of.
func meant(flags []cli.Flag, tok string) cli.Flag { return cliutil.Meant(flags, flagName(tok)) }

// takesValue says whether the flag tok reads the next argument; a
// mistyped flag ("--sockt /s") is taken for the one it is close to, so
// that its value is not read as an argument.
func takesValue(flags []cli.Flag, tok string) bool {
	f := meant(flags, tok)
	return f != nil && cliutil.TakesValue(f) && !strings.Contains(tok, "=")
}
