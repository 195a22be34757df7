package main

import (
	"strings"

	"github.com/urfave/cli/v2"
)

// intersperse moves a command's flags in front of its arguments, so that
// "modelctl pull URI --name x" works: urfave/cli v2 stops reading flags at
// the first argument. Global flags stay where they are.
func intersperse(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	lookup := func(flags []cli.Flag, tok string) cli.Flag {
		name, _, _ := strings.Cut(strings.TrimLeft(tok, "-"), "=")
		for _, f := range flags {
			for _, n := range f.Names() {
				if n == name {
					return f
				}
			}
		}
		return nil
	}
	takesValue := func(flags []cli.Flag, tok string) bool {
		f := lookup(flags, tok)
		_, isBool := f.(*cli.BoolFlag)
		return f != nil && !isBool && !strings.Contains(tok, "=")
	}
	out := []string{args[0]}
	i := 1
	for ; i < len(args); i++ { // global flags up to the command
		tok := args[i]
		if !strings.HasPrefix(tok, "-") || tok == "-" || tok == "--" {
			break
		}
		out = append(out, tok)
		if takesValue(app.Flags, tok) && i+1 < len(args) {
			i++
			out = append(out, args[i])
		}
	}
	if i >= len(args) {
		return out
	}
	cmd := app.Command(args[i])
	if cmd == nil {
		return append(out, args[i:]...)
	}
	cmdName := args[i]
	var flags, pos []string
	for j := i + 1; j < len(args); j++ {
		tok := args[j]
		if tok == "--" {
			pos = append(pos, args[j+1:]...)
			break
		}
		if strings.HasPrefix(tok, "-") && tok != "-" && lookup(cmd.Flags, tok) == nil && lookup(app.Flags, tok) != nil {
			// A global flag after the command ("inspect m -o json"): move it in front.
			out = append(out, tok)
			if takesValue(app.Flags, tok) && j+1 < len(args) {
				j++
				out = append(out, args[j])
			}
			continue
		}
		if strings.HasPrefix(tok, "-") && tok != "-" {
			flags = append(flags, tok)
			if takesValue(cmd.Flags, tok) && j+1 < len(args) {
				j++
				flags = append(flags, args[j])
			}
			continue
		}
		pos = append(pos, tok)
	}
	out = append(out, cmdName)
	out = append(out, flags...)
	if len(pos) > 0 {
		out = append(out, "--")
		out = append(out, pos...)
	}
	return out
}
