package main

import (
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/modelcache/modelcache/internal/cliutil"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite the modelctl sections of docs/flags.md from the commands")

// TestCommandsDoc holds docs/flags.md's tables of modelctl's commands and
// their flags to the command definitions: a command or flag added,
// removed or changed without the doc fails here. go generate
// ./cmd/modelctl writes the tables.
func TestCommandsDoc(t *testing.T) {
	commands, flags := commandTables()
	for name, body := range map[string]string{"modelctl-commands": commands, "modelctl-flags": flags} {
		if err := cliutil.SyncDocSection("../../docs/flags.md", name, "go generate ./cmd/modelctl", body, *updateDocs); err != nil {
			t.Error(err)
		}
	}
}

// commandTables are the reference tables of modelctl: its commands (as
// help lists them, hidden ones left out), then every flag, the global
// ones first.
func commandTables() (commands, flags string) {
	app := newApp(io.Discard, io.Discard)
	var c, f strings.Builder
	c.WriteString("| Command | Arguments | What it does |\n|---|---|---|\n")
	f.WriteString("| Command | Flag | Default | What it sets |\n|---|---|---|---|\n")
	row := func(cmd string, fl cli.Flag) {
		names := ""
		for i, n := range fl.Names() {
			if i > 0 {
				names += ", "
			}
			names += cliutil.Code(cliutil.Flag(n))
		}
		def := ""
		if d := cliutil.DefaultText(fl); d != "" && d != "false" {
			def = cliutil.Code(d)
		}
		if env := cliutil.EnvVars(fl); len(env) > 0 {
			def += " (" + cliutil.Code("$"+strings.Join(env, "`, `$")) + ")"
		}
		fmt.Fprintf(&f, "| %s | %s | %s | %s |\n", cmd, names, strings.TrimSpace(def), cliutil.Cell(cliutil.Usage(fl)))
	}
	for _, fl := range app.Flags {
		if fl.Names()[0] != "help" && fl.Names()[0] != "version" {
			row("(every command)", fl)
		}
	}
	for _, cmd := range app.Commands {
		if cmd.Hidden {
			continue
		}
		name := cliutil.Code("modelctl " + cmd.Name)
		if len(cmd.Aliases) > 0 {
			name += " (" + cliutil.Code(strings.Join(cmd.Aliases, "`, `")) + ")"
		}
		args := ""
		if cmd.ArgsUsage != "" {
			args = cliutil.Code(cmd.ArgsUsage)
		}
		fmt.Fprintf(&c, "| %s | %s | %s |\n", name, args, cliutil.Cell(cmd.Usage))
		for _, fl := range cmd.Flags {
			if fl.Names()[0] != "help" {
				row(cliutil.Code(cmd.Name), fl)
			}
		}
	}
	return c.String(), f.String()
}
