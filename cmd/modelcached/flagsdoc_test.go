package main

import (
	"flag"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/internal/cliutil"
)

var updateDocs = flag.Bool("update-docs", false, "rewrite the modelcached section of docs/flags.md from the flags")

// TestFlagsDoc holds docs/flags.md's table of modelcached's flags to the
// flag definitions: a flag added, removed or changed (its default, its
// help) without the doc fails here. go generate ./cmd/modelcached writes
// the table.
func TestFlagsDoc(t *testing.T) {
	if err := cliutil.SyncDocSection("../../docs/flags.md", "modelcached-flags", "go generate ./cmd/modelcached", flagsTable(), *updateDocs); err != nil {
		t.Fatal(err)
	}
}

// flagsTable is the reference table of modelcached's flags: each flag's
// config file key, default, environment variables and help, in the order
// --help lists them.
func flagsTable() string {
	byFlag := map[string][]string{}
	for old, name := range oldKeys {
		byFlag[name] = append(byFlag[name], old)
	}
	for _, old := range byFlag {
		sort.Strings(old)
	}
	var b strings.Builder
	b.WriteString("| Flag | Config key | Default | Environment | What it sets |\n|---|---|---|---|---|\n")
	for _, f := range newApp().Flags {
		name := f.Names()[0]
		key := "— (command line only)"
		if !notInFile[name] {
			key = cliutil.Code(name)
			if old := byFlag[name]; len(old) > 0 {
				key += " (earlier: " + cliutil.Code(strings.Join(old, "`, `")) + ")"
			}
		}
		def := "none"
		if d := cliutil.DefaultText(f); d != "" {
			def = cliutil.Code(d)
		}
		env := ""
		for i, e := range cliutil.EnvVars(f) {
			if i > 0 {
				env += ", "
			}
			env += cliutil.Code(e)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", cliutil.Code(cliutil.Flag(name)), key, def, env, cliutil.Cell(cliutil.Usage(f)))
	}
	return b.String()
}
