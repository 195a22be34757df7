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
	takesValue := func(flags []cli.Flag, tok string) bool {
		name := strings.TrimLeft(tok, "-")
		if strings.Contains(name, "=") {
			return false
		}
		for _, f := range flags {
			for _, n := range f.Names() {
				if n == name {
					_, isBool := f.(*cli.BoolFlag)
					return !isBool
				}
			}
		}
		return false
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
	out = append(out, args[i])
	if cmd == nil {
		return append(out, args[i+1:]...)
	}
	var flags, pos []string
	for j := i + 1; j < len(args); j++ {
		tok := args[j]
		if tok == "--" {
			pos = append(pos, args[j+1:]...)
			break
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
	out = append(out, flags...)
	if len(pos) > 0 {
		out = append(out, "--")
		out = append(out, pos...)
	}
	return out
}
