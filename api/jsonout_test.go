package api

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
	"time"
	"unicode/utf8"
)

// TestWriteJSONAsEncodingJSON: what modelctl -o json prints and what the
// daemon answers are byte for byte what encoding/json wrote before (field
// rules, escapes, map order, nulls, indentation), and the same value where
// a string holds invalid UTF-8.
func TestWriteJSONAsEncodingJSON(t *testing.T) {
	now := time.Date(2026, 11, 23, 20, 1, 2, 345678901, time.UTC)
	full := Artifact{
		Name: "m<&>", Kind: KindModel, URI: "hf://org/m?a=1&b=2", Phase: PhaseFailed, Message: "line\u2028sep \"quoted\" \x01",
		Revision: "abc", Bytes: 1 << 40, Pinned: true, Attempts: 3, NextRetry: &now, Created: &now,
		Progress: &Progress{FilesDone: 1, FilesTotal: 2, BytesDone: 3, BytesPerSecond: 1.5},
		Desire:   &Desire{URI: "hf://org/m", Pin: true},
		Versions: []Version{{Revision: "r1", Created: now, Files: []File{{Path: "a/b.safetensors", Size: 7}}}, {Revision: "r2"}},
		InUse:    []Holder{{}},
		Metadata: &Metadata{},
	}
	values := []any{
		full,
		&full,
		Artifact{},                 // zero: omitempty of 0, false, nil
		[]Artifact{full, {}, full}, // an array
		[]Artifact(nil),            // null
		[]Artifact{},               // []
		map[string]int{"b": 2, "a": 1, "<": 0},
		map[string]string(nil),
		Status{Phases: map[Phase]int{PhaseReady: 2, PhaseFailed: 1}},
		[]ArtifactRow{full.Row(), {}},
		"plain",
	}
	for _, indent := range []string{"", "  "} {
		for _, v := range values {
			var want, got bytes.Buffer
			enc := json.NewEncoder(&want)
			enc.SetIndent("", indent)
			if err := enc.Encode(v); err != nil {
				t.Fatal(err)
			}
			if err := WriteJSON(&got, v, indent); err != nil {
				t.Fatalf("WriteJSON(%T): %v", v, err)
			}
			if got.String() != want.String() {
				t.Errorf("WriteJSON(%T, indent %q):\ngot  %s\nwant %s", v, indent, got.String(), want.String())
			}
		}
	}
	// Invalid UTF-8 (a remote server's error text, a process name) becomes
	// U+FFFD either way; encoding/json writes it as the escape \ufffd, this
	// writer as the character: the same JSON value, valid UTF-8.
	for _, v := range []any{
		"invalid UTF-8 \xff\xfe from a remote error, \xe2\x82 cut",
		Artifact{Name: "m", Message: "bad \xc3\x28 bytes", InUse: []Holder{{ID: "pid 1 (\xffexe)"}}},
		map[string]string{"\xff": "key"},
	} {
		want, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		if err := WriteJSON(&got, v, ""); err != nil {
			t.Fatalf("WriteJSON(%T) with invalid UTF-8: %v", v, err)
		}
		var gv, wv any
		if !utf8.Valid(got.Bytes()) || json.Unmarshal(got.Bytes(), &gv) != nil || json.Unmarshal(want, &wv) != nil || !reflect.DeepEqual(gv, wv) {
			t.Errorf("WriteJSON(%T) with invalid UTF-8:\ngot  %s\nwant %s (the same value)", v, got.String(), want)
		}
	}
	for _, items := range [][]Artifact{nil, {}, {full}, {full, {}, full}} {
		var want, got bytes.Buffer
		json.NewEncoder(&want).Encode(items)
		if err := WriteJSONArray(&got, items); err != nil {
			t.Fatal(err)
		}
		if got.String() != want.String() {
			t.Errorf("WriteJSONArray(%d items):\ngot  %s\nwant %s", len(items), got.String(), want.String())
		}
	}
}
