package cliutil

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/urfave/cli/v2"
)

func TestSuggest(t *testing.T) {
	names := []string{"list", "inspect", "pull", "pin", "unpin", "evict", "verify", "status"}
	for in, want := range map[string]string{"lsit": "list", "pul": "pull", "evcit": "evict", "stauts": "status", "insp": "inspect", "xyz": "", "delete": "", "pinned": "pin", "Pinned": "pin"} {
		if got := Suggest(names, in); got != want {
			t.Errorf("Suggest(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCheckFlags(t *testing.T) {
	flags := []cli.Flag{
		&cli.StringFlag{Name: "name"}, &cli.BoolFlag{Name: "pin"}, &cli.IntFlag{Name: "high-watermark"},
		&cli.DurationFlag{Name: "min-age"}, &cli.GenericFlag{Name: "timeout", Value: &Duration{}},
	}
	pos, problems := CheckFlags(flags, []string{"a", "--nmae", "x", "--pin=maybe", "--high-watermark", "ninety", "--min-age=5", "--timeout", "7", "b", "--name", "--", "-c"}, false)
	if want := []string{"a", "b", "-c"}; !reflect.DeepEqual(pos, want) {
		t.Errorf("positional %q, want %q", pos, want)
	}
	want := []string{
		"unknown flag --nmae (did you mean --name?)",
		"--pin=maybe: want true or false",
		`--high-watermark "ninety": want a whole number`,
		`--min-age "5": want a duration with its unit, such as 90s, 5m or 1h30m`,
		"--name needs a value",
	}
	if !reflect.DeepEqual(problems, want) {
		t.Errorf("problems\n%q\nwant\n%q", problems, want)
	}
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{"5": 5 * time.Second, "1.5": 1500 * time.Millisecond, "90s": 90 * time.Second, "1h30m": 90 * time.Minute, "0": 0} {
		if got, err := ParseDuration(in); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"soon", "-5", "5 minutes"} {
		if _, err := ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q) accepted", in)
		}
	}
}

func TestSyncDocSection(t *testing.T) {
	path := filepath.Join(t.TempDir(), "flags.md")
	doc := "# Flags\n\n<!-- BEGIN x: written by gen; do not edit -->\n| a |\n<!-- END x -->\n\nafter\n"
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := SyncDocSection(path, "x", "gen", "| a |\n", false); err != nil {
		t.Fatalf("an equal section: %v", err)
	}
	err := SyncDocSection(path, "x", "gen", "| b |\n", false)
	if err == nil || !strings.Contains(err.Error(), "run gen") || !strings.Contains(err.Error(), `"| a |"`) {
		t.Fatalf("a drifted section: %v, want the generator and the line that differs named", err)
	}
	if err := SyncDocSection(path, "x", "gen", "| b |\n", true); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(path)
	if want := strings.Replace(doc, "| a |", "| b |", 1); string(got) != want {
		t.Fatalf("updated:\n%s\nwant:\n%s", got, want)
	}
	if err := SyncDocSection(path, "y", "gen", "", false); err == nil || !strings.Contains(err.Error(), "no section y") {
		t.Fatalf("a missing section: %v", err)
	}
}
