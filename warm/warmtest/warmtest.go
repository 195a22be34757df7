// Package warmtest writes the model trees the tests and benchmarks of
// warming read (real safetensors shards, their index, configs), reads
// them back as a loader does (Reader), and reads the benchmarks'
// settings; all in warmtest.go.
package warmtest

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Tensor is one tensor of a shard: its name and size; a shard stores
// tensors in the order given (not name order).
type Tensor struct {
	Name string
	Size int64
}

// Safetensors writes a real safetensors file (U8 tensors, data in
// the order given, random bytes) and returns its header length. The
// layout is the format's own (github.com/huggingface/safetensors,
// README "Format"): an 8-byte little-endian header length N, N bytes of
// JSON mapping each tensor to dtype, shape and data_offsets relative to
// the byte buffer after the header, an optional "__metadata__" of
// strings, then the buffer.
func Safetensors(t testing.TB, path string, tensors []Tensor) int64 {
	t.Helper()
	header := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	var at int64
	for _, ts := range tensors {
		header[ts.Name] = map[string]any{"dtype": "U8", "shape": []int64{ts.Size}, "data_offsets": []int64{at, at + ts.Size}}
		at += ts.Size
	}
	raw, err := json.Marshal(header)
	if err != nil {
		t.Fatal(err)
	}
	for len(raw)%8 != 0 { // the format pads the header with spaces
		raw = append(raw, ' ')
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(raw)))
	f.Write(n[:])
	f.Write(raw)
	Random(t, f, at)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	return int64(len(raw))
}

// Random writes n random bytes to f (incompressible, so a
// compressing filesystem stores them all).
func Random(t testing.TB, f *os.File, n int64) {
	t.Helper()
	rng := rand.NewChaCha8([32]byte{1})
	buf := make([]byte, 1<<20)
	for n > 0 {
		rng.Read(buf)
		k := min(n, int64(len(buf)))
		if _, err := f.Write(buf[:k]); err != nil {
			t.Fatal(err)
		}
		n -= k
	}
}

// File writes content at path, making its directory.
func File(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Index writes a safetensors index as transformers writes one beside
// sharded checkpoints (model.safetensors.index.json: "metadata" with
// "total_size", and "weight_map" from tensor name to shard file), whose
// weight_map lists tensors in the order given (encoding/json would sort a
// map's keys).
func Index(t testing.TB, path string, weights [][2]string) {
	t.Helper()
	s := `{"metadata": {"total_size": 0}, "weight_map": {`
	for i, w := range weights {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%q: %q", w[0], w[1])
	}
	File(t, path, s+"}}")
}

// Model writes a tree of nShards shards of shardMiB each (four tensors
// a shard, stored in reverse name order), a config, a tokenizer, an index
// naming the shards last to first, and a README.
func Model(t testing.TB, dir string, nShards int, shardMiB int64) {
	t.Helper()
	File(t, filepath.Join(dir, "config.json"), `{"architectures": ["LlamaForCausalLM"]}`)
	File(t, filepath.Join(dir, "tokenizer.json"), `{"model": {}}`)
	File(t, filepath.Join(dir, "README.md"), "# a model\n")
	var weights [][2]string
	for s := nShards; s >= 1; s-- {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", s, nShards)
		var ts []Tensor
		for k := 3; k >= 0; k-- {
			ts = append(ts, Tensor{Name: fmt.Sprintf("layers.%d.%d.weight", s, k), Size: shardMiB << 20 / 4})
		}
		Safetensors(t, filepath.Join(dir, name), ts)
		for _, x := range ts {
			weights = append(weights, [2]string{x.Name, name})
		}
	}
	Index(t, filepath.Join(dir, "model.safetensors.index.json"), weights)
}

// Reader reads ranges of a tree's files as a loader does, each file
// opened once. Close it.
type Reader struct {
	Dir   string
	files map[string]*os.File
	buf   []byte
}

// Read reads n bytes of file from off, 16 MiB at a time.
func (r *Reader) Read(file string, off, n int64) error {
	if r.files == nil {
		r.files, r.buf = map[string]*os.File{}, make([]byte, 16<<20)
	}
	f := r.files[file]
	if f == nil {
		var err error
		if f, err = os.Open(filepath.Join(r.Dir, file)); err != nil {
			return err
		}
		r.files[file] = f
	}
	for end := off + n; off < end; off += int64(len(r.buf)) {
		if _, err := f.ReadAt(r.buf[:min(int64(len(r.buf)), end-off)], off); err != nil {
			return err
		}
	}
	return nil
}

// Close closes the files Read opened.
func (r *Reader) Close() {
	for _, f := range r.files {
		f.Close()
	}
}

// EnvInt is a positive whole number from the environment variable name
// (a benchmark's setting), or def when it is unset.
func EnvInt(t testing.TB, name string, def int64) int64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: give a positive whole number", name, v)
	}
	return n
}

// EnvDuration is a duration from the environment variable name, or def
// when it is unset.
func EnvDuration(t testing.TB, name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		t.Fatalf("%s=%q: give a duration such as 5s", name, v)
	}
	return d
}
