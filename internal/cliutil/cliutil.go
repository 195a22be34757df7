// Package cliutil holds what modelctl and modelcached share in reading a
// command line: every bad flag is found before anything runs (the flag
// package stops at the first), each is named with two dashes and, when a
// known name is close, the one that was probably meant (cliutil.go);
// and flagdoc.go writes docs/flags.md's reference tables from the same
// flag definitions, so the docs cannot drift from the code.
package cliutil

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"
)

// Checker is a flag value that can say whether a string would be
// accepted without setting anything; a cli.GenericFlag's Value that
// implements it is checked by CheckFlags.
type Checker interface {
	Check(s string) error
}

// Flag names a flag the way a user types it: two dashes, one for a
// one-letter name.
func Flag(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// CheckFlags reads args (flags, their values and positional arguments in
// any order; "--" ends the flags) against flags, and returns the
// positional arguments and one problem per bad flag: unknown (with a
// suggestion), missing its value, or a value its type refuses. It sets
// nothing. The help flag (and the version flag when withVersion) are
// known.
func CheckFlags(flags []cli.Flag, args []string, withVersion bool) (positional, problems []string) {
	known := append([]cli.Flag{}, flags...)
	known = append(known, cli.HelpFlag)
	if withVersion {
		known = append(known, cli.VersionFlag)
	}
	for i := 0; i < len(args); i++ {
		tok := args[i]
		if tok == "--" {
			positional = append(positional, args[i+1:]...)
			break
		}
		if !IsFlag(tok) {
			positional = append(positional, tok)
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(tok, "-"), "=")
		f := Lookup(known, name)
		if f == nil {
			p := "unknown flag " + Flag(name)
			if s := Suggest(FlagNames(known), name); s != "" {
				p += " (did you mean " + Flag(s) + "?)"
				if TakesValue(Lookup(known, s)) && !hasValue && i+1 < len(args) && !IsFlag(args[i+1]) {
					i++ // its value is no argument
				}
			}
			problems = append(problems, p)
			continue
		}
		if !TakesValue(f) {
			if hasValue {
				if _, err := strconv.ParseBool(value); err != nil {
					problems = append(problems, fmt.Sprintf("%s=%s: want true or false", Flag(name), value))
				}
			}
			continue
		}
		if !hasValue {
			if i+1 >= len(args) || IsFlag(args[i+1]) || args[i+1] == "--" {
				problems = append(problems, Flag(name)+" needs a value")
				continue
			}
			i++
			value = args[i]
		}
		if err := checkValue(f, value); err != nil {
			problems = append(problems, fmt.Sprintf("%s %q: %v", Flag(name), value, err))
		}
	}
	return positional, problems
}

// Meant returns the flag named name or, when none is, the one it is
// close to (a typo): what a reader of the command line takes it for.
func Meant(flags []cli.Flag, name string) cli.Flag {
	if f := Lookup(flags, name); f != nil {
		return f
	}
	return Lookup(flags, Suggest(FlagNames(flags), name))
}

// IsFlag says whether tok is a flag: "-x" or "--name", not "-", "--" or
// a negative number.
func IsFlag(tok string) bool {
	if len(tok) < 2 || tok[0] != '-' || tok == "--" {
		return false
	}
	c := tok[1]
	if c == '-' {
		c = tok[2]
	}
	return c != '.' && (c < '0' || c > '9')
}

// Lookup returns the flag one of whose names is name, or nil.
func Lookup(flags []cli.Flag, name string) cli.Flag {
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				return f
			}
		}
	}
	return nil
}

// TakesValue says whether f reads the next argument (every flag but a
// boolean one).
func TakesValue(f cli.Flag) bool {
	_, isBool := f.(*cli.BoolFlag)
	return !isBool
}

// FlagNames lists every name of flags.
func FlagNames(flags []cli.Flag) []string {
	var out []string
	for _, f := range flags {
		out = append(out, f.Names()...)
	}
	return out
}

// CheckValue says whether f would accept v, without setting anything.
func CheckValue(f cli.Flag, v string) error { return checkValue(f, v) }

func checkValue(f cli.Flag, v string) error {
	var err error
	switch f := f.(type) {
	case *cli.IntFlag, *cli.Int64Flag:
		if _, err = strconv.ParseInt(v, 0, 64); err != nil {
			return fmt.Errorf("want a whole number")
		}
	case *cli.UintFlag, *cli.Uint64Flag:
		if _, err = strconv.ParseUint(v, 0, 64); err != nil {
			return fmt.Errorf("want a whole number, 0 or more")
		}
	case *cli.Float64Flag:
		if _, err = strconv.ParseFloat(v, 64); err != nil {
			return fmt.Errorf("want a number")
		}
	case *cli.DurationFlag:
		if _, err = time.ParseDuration(v); err != nil {
			return fmt.Errorf("want a duration with its unit, such as 90s, 5m or 1h30m")
		}
	case *cli.GenericFlag:
		if c, ok := f.Value.(Checker); ok {
			return c.Check(v)
		}
	}
	return nil
}

// Suggest returns the candidate closest to s when it is close enough to
// be what was meant (a typo or two, or a prefix), else "".
func Suggest(candidates []string, s string) string {
	best, bestD := "", 0
	for _, c := range candidates {
		if len(c) < 2 {
			continue
		}
		d := distance(s, c)
		if strings.HasPrefix(c, s) && len(s) >= 2 {
			d = min(d, 1)
		}
		if strings.HasPrefix(strings.ToLower(s), strings.ToLower(c)) && len(c) >= 3 {
			d = min(d, 1) // the word with an ending: pinned for pin
		}
		if best == "" || d < bestD {
			best, bestD = c, d
		}
	}
	if best == "" || bestD > max(1, min(2, len(s)/3)) {
		return ""
	}
	return best
}

// distance is the Damerau–Levenshtein (optimal string alignment) distance:
// a swap of two neighbours counts as one typo.
func distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}

// Duration is a flag value for a duration that also takes a bare number
// as seconds ("--timeout 5" is 5s), since that is what people type.
type Duration struct{ D time.Duration }

// ParseDuration reads "90s", "5m", "1h30m" or a bare number of seconds.
func ParseDuration(s string) (time.Duration, error) {
	if n, err := strconv.ParseFloat(s, 64); err == nil && n >= 0 {
		return time.Duration(n * float64(time.Second)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("want a duration such as 30s, 5m or 1h30m (a bare number is seconds)")
	}
	return d, nil
}

// Set implements flag.Value.
func (d *Duration) Set(s string) error {
	v, err := ParseDuration(s)
	if err != nil {
		return err
	}
	d.D = v
	return nil
}

// Check implements Checker.
func (d *Duration) Check(s string) error { _, err := ParseDuration(s); return err }

func (d *Duration) String() string {
	if d == nil {
		return "0s"
	}
	return d.D.String()
}
