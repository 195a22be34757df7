package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestWriteColumnsAsTabwriter: the table list prints is byte for byte
// what text/tabwriter printed, on the fast path and the fallback.
func TestWriteColumnsAsTabwriter(t *testing.T) {
	for _, rows := range [][][]string{
		{{"NAME", "PHASE", "SOURCE"}},
		{{"NAME", "PHASE", "SOURCE"}, {"m", "Ready", "http://x/y"}, {"a-much-longer-name", "", ""}, {"", "Downloading", "12% of 4 GiB"}},
		{{"NAME", "SIZE", "SOURCE"}, {"modèle-ü", "1 GiB", "hf://org/ß"}, {"日本語モデル", "17 B", "-"}},
		{{"NAME", "MESSAGE"}, {"m", "a\ttab"}, {"n", "x"}},           // a tab: tabwriter splits the cell
		{{"NAME", "MESSAGE"}, {"m\nn", "two lines"}, {"o", "x"}},     // a newline ends a tabwriter line
		{{"NAME", "MESSAGE"}, {"m", "\xffescaped\xff"}, {"o", "\v"}}, // tabwriter's escape and vertical tab
		{{"A", "B", "C"}, {"", "", ""}},
		{{"NAME", "SOURCE"}, {strings.Repeat("long-", 40), "x"}, {"m", "y"}}, // padding wider than one run of spaces
	} {
		var got, want bytes.Buffer
		row := func(i int, dst []string) []string { return append(dst, rows[i]...) }
		writeColumns(&got, len(rows), row)
		tabwrite(&want, len(rows), row)
		if got.String() != want.String() {
			t.Errorf("rows %q:\ngot\n%q\nwant (tabwriter)\n%q", rows, got.String(), want.String())
		}
	}
}
