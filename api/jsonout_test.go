package api

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"
)

// TestWriteJSONAsEncodingJSON: what modelctl -o json prints and what the
// daemon answers are byte for byte what encoding/json wrote before: field
// rules, escapes, map order, nulls, indentation.
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
