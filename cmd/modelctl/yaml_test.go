package main

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/modelcache/modelcache/api"
)

// TestWriteYAMLAsMarshal: -o yaml writes what sigs.k8s.io/yaml's Marshal
// writes, a list one element at a time: the same bytes, and the same value
// where the emitter folds a long string.
func TestWriteYAMLAsMarshal(t *testing.T) {
	now := time.Date(2026, 11, 23, 21, 0, 0, 0, time.UTC)
	full := api.Artifact{Name: "m", Kind: api.KindModel, URI: "hf://org/m", Phase: api.PhaseFailed, Message: "first line\n\nthird line after an empty one\n",
		Bytes: 1 << 30, Attempts: 2, Created: &now, Progress: &api.Progress{FilesDone: 1, FilesTotal: 2},
		Versions: []api.Version{{Revision: "r1", Files: []api.File{{Path: "a", Size: 1}}}, {Revision: "r2"}},
		InUse:    []api.Holder{{Kind: "pod", ID: "ns/p"}, {Kind: "lease", ID: "job"}}}
	same := []any{
		[]api.Artifact{full, {}, full},
		[]api.ArtifactRow{full.Row(), {}},
		[]string{"a", "b: c", "- d", ""},
		[]api.Artifact{},
		[]api.Artifact(nil),
		full,
		map[string]int{"b": 2, "a": 1},
	}
	for _, v := range same {
		want, err := yaml.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		if err := writeYAML(&got, v); err != nil {
			t.Fatal(err)
		}
		if got.String() != string(want) {
			t.Errorf("writeYAML(%T):\ngot\n%s\nwant (yaml.Marshal)\n%s", v, got.String(), want)
		}
	}
	long := []api.Artifact{{Name: "m", Message: strings.Repeat("a failure message with many words ", 8)}, full}
	want, _ := yaml.Marshal(long)
	var got bytes.Buffer
	if err := writeYAML(&got, long); err != nil {
		t.Fatal(err)
	}
	var gv, wv any
	if err := yaml.Unmarshal(got.Bytes(), &gv); err != nil {
		t.Fatalf("writeYAML of a long string is not YAML: %v\n%s", err, got.String())
	}
	yaml.Unmarshal(want, &wv)
	if !reflect.DeepEqual(gv, wv) {
		t.Errorf("writeYAML of a long string:\ngot\n%s\nwant the value of\n%s", got.String(), want)
	}
}
