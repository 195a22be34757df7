package main

import (
	"io"
	"reflect"
	"testing"
)

func TestIntersperse(t *testing.T) {
	app := newApp(io.Discard, io.Discard)
	for _, tc := range []struct{ in, want []string }{
		{[]string{"modelctl", "pull", "file:///m", "--name", "x", "--pin"}, []string{"modelctl", "pull", "--name", "x", "--pin", "--", "file:///m"}},
		{[]string{"modelctl", "--socket", "/s", "inspect", "m", "-o", "json"}, []string{"modelctl", "--socket", "/s", "-o", "json", "inspect", "--", "m"}},
		{[]string{"modelctl", "wait", "m", "--timeout=5s"}, []string{"modelctl", "wait", "--timeout=5s", "--", "m"}},
		{[]string{"modelctl", "pull", "--include", "*.json", "u", "--include", "*.bin"}, []string{"modelctl", "pull", "--include", "*.json", "--include", "*.bin", "--", "u"}},
		{[]string{"modelctl", "list"}, []string{"modelctl", "list"}},
		{[]string{"modelctl", "nosuch", "x"}, []string{"modelctl", "nosuch", "x"}},
	} {
		if got := intersperse(app, tc.in); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("intersperse(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
