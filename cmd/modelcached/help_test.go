package main

import (
	"bytes"
	"strings"
	"testing"
)

// The daemon takes flags only: its help and its manual page show the
// flags, and no command (not "help"), no "[GLOBAL OPTIONS] command".
func TestHelpShowsFlagsOnly(t *testing.T) {
	app := newApp()
	var help bytes.Buffer
	app.Writer = &help
	if err := app.Run([]string{"modelcached", "--help"}); err != nil {
		t.Fatal(err)
	}
	man, err := manPage(newApp())
	if err != nil {
		t.Fatal(err)
	}
	for what, text := range map[string]string{"--help": help.String(), "--print-man": man} {
		for _, bad := range []string{"COMMANDS", "] command", "command [", "GLOBAL", "help, h"} {
			if strings.Contains(text, bad) {
				t.Errorf("%s shows %q:\n%s", what, bad, text)
			}
		}
		for _, want := range []string{"modelcached [options]", "OPTIONS", "--quota", "--models-dir"} {
			if !strings.Contains(text, want) {
				t.Errorf("%s lacks %q", what, want)
			}
		}
	}
	if p := checkArgs(app, []string{"help"}); len(p) != 1 || !strings.Contains(p[0], "takes flags only") {
		t.Errorf("modelcached help: %q, want an unexpected argument", p)
	}
}
