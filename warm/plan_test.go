package warm

import (
	"errors"
	"github.com/modelcache/modelcache/warm/warmtest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestPlanReadsInLoaderOrder(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"README.md", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt", "tokenizer.json"} {
		warmtest.File(t, filepath.Join(dir, f), "{}\n")
	}
	warmtest.File(t, filepath.Join(dir, "config.json"), `{"model_type": "llama"}`)
	warmtest.File(t, filepath.Join(dir, "pytorch_model.bin"), strings.Repeat("w", 300))
	// The index names shard 2 first; a shard's tensors are stored out of
	// name order.
	warmtest.Index(t, filepath.Join(dir, "model.safetensors.index.json"), [][2]string{
		{"b.weight", "model-00002-of-00002.safetensors"},
		{"a.weight", "model-00001-of-00002.safetensors"},
		{"c.weight", "model-00002-of-00002.safetensors"},
		{"escape", "../outside.safetensors"},
	})
	h1 := warmtest.Safetensors(t, filepath.Join(dir, "model-00001-of-00002.safetensors"), []warmtest.Tensor{{Name: "z", Size: 100}, {Name: "a.weight", Size: 200}})
	h2 := warmtest.Safetensors(t, filepath.Join(dir, "model-00002-of-00002.safetensors"), []warmtest.Tensor{{Name: "c.weight", Size: 64}, {Name: "b.weight", Size: 32}})
	// A shard no index names, with 16 bytes no tensor covers.
	h3 := warmtest.Safetensors(t, filepath.Join(dir, "extra.safetensors"), []warmtest.Tensor{{Name: "e", Size: 40}})
	f, err := os.OpenFile(filepath.Join(dir, "extra.safetensors"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(make([]byte, 16))
	f.Close()
	// A shard whose header length lies: read whole, in name order.
	warmtest.File(t, filepath.Join(dir, "broken.safetensors"), "\xff\xff\xff\xff\xff\xff\xff\x7fnot json")
	// An in-tree link to the config and an empty file: neither is read twice or at all.
	if err := os.Symlink("config.json", filepath.Join(dir, "alias.json")); err != nil {
		t.Fatal(err)
	}
	warmtest.File(t, filepath.Join(dir, "empty.json"), "")

	got, err := Plan(dir)
	if err != nil {
		t.Fatal(err)
	}
	size := func(name string) int64 {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	whole := func(name string) Item { return Item{File: name, Offset: 0, Length: size(name)} }
	want := []Item{
		whole("config.json"),
		whole("generation_config.json"),
		whole("model.safetensors.index.json"),
		whole("special_tokens_map.json"),
		whole("tokenizer.json"),
		whole("tokenizer_config.json"),
		whole("vocab.txt"),
		{"model-00002-of-00002.safetensors", 0, 8 + h2},
		{"model-00002-of-00002.safetensors", 8 + h2 + 64, 32}, // b.weight
		{"model-00002-of-00002.safetensors", 8 + h2, 64},      // c.weight
		{"model-00001-of-00002.safetensors", 0, 8 + h1},
		{"model-00001-of-00002.safetensors", 8 + h1 + 100, 200}, // a.weight
		{"model-00001-of-00002.safetensors", 8 + h1, 100},       // z
		whole("broken.safetensors"),
		{"extra.safetensors", 0, 8 + h3},
		{"extra.safetensors", 8 + h3, 40},
		{"extra.safetensors", 8 + h3 + 40, 16},
		whole("README.md"),
		whole("pytorch_model.bin"),
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("plan:\n got %v\nwant %v", got, want)
	}
	var files int64
	for _, it := range want {
		if it.Offset == 0 {
			files += size(it.File)
		}
	}
	if Total(got) != files {
		t.Errorf("Total = %d, want the files' size %d", Total(got), files)
	}
}

func TestPlanRefusesSymlinksOutOfTheTree(t *testing.T) {
	outside := t.TempDir()
	warmtest.File(t, filepath.Join(outside, "secret.safetensors"), "secret")
	for _, tc := range []struct{ name, target string }{
		{"relative", "../" + filepath.Base(outside) + "/secret.safetensors"},
		{"absolute", filepath.Join(outside, "secret.safetensors")},
		{"directory", outside},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := filepath.Dir(outside)
			dir, err := os.MkdirTemp(parent, "tree-")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			warmtest.File(t, filepath.Join(dir, "config.json"), "{}")
			if err := os.Symlink(tc.target, filepath.Join(dir, "model.safetensors")); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(dir, "model.safetensors")); err != nil {
				t.Fatalf("the escaping link does not resolve, so the test proves nothing: %v", err)
			}
			_, err = Plan(dir)
			if !errors.Is(err, ErrEscape) || !strings.Contains(err.Error(), "model.safetensors") {
				t.Errorf("Plan = %v, want ErrEscape naming model.safetensors", err)
			}
			if _, _, err := Resident(dir); !errors.Is(err, ErrEscape) {
				t.Errorf("Resident = %v, want ErrEscape", err)
			}
		})
	}
}

func TestPlanFollowsThePathToTheTree(t *testing.T) {
	base := t.TempDir()
	rev := filepath.Join(base, "rev1")
	warmtest.File(t, filepath.Join(rev, "config.json"), "{}")
	if err := os.Symlink("rev1", filepath.Join(base, "current")); err != nil {
		t.Fatal(err)
	}
	got, err := Plan(filepath.Join(base, "current"))
	if err != nil || len(got) != 1 || got[0].File != "config.json" {
		t.Errorf("Plan(current) = %v, %v; want config.json", got, err)
	}
	if _, err := Plan(filepath.Join(base, "missing")); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("Plan(missing) = %v, want an error naming the tree", err)
	}
	if _, err := Plan(""); err == nil {
		t.Error("Plan(\"\") = nil error")
	}
}

func TestReadHeaderRefusesHostileHeaders(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"short":          "\x02\x00\x00",
		"beyond the end": "\x40\x00\x00\x00\x00\x00\x00\x00{}",
		"not json":       "\x04\x00\x00\x00\x00\x00\x00\x00{{{{",
		"offsets out":    "\x2c\x00\x00\x00\x00\x00\x00\x00" + `{"t":{"dtype":"U8","data_offsets":[0,99]}} ` + "xx",
		"offsets turned": "\x2b\x00\x00\x00\x00\x00\x00\x00" + `{"t":{"dtype":"U8","data_offsets":[2,1]}}  ` + "xx",
	} {
		p := filepath.Join(dir, "f")
		warmtest.File(t, p, content)
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, ok := readHeader(f, int64(len(content))); ok {
			t.Errorf("%s: header accepted", name)
		}
		f.Close()
	}
}
