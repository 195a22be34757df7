package warm

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/modelcache/modelcache/internal/testenv"
)

// tensorSpec is one tensor of a fixture shard: its name and size; the
// shard stores tensors in the order given (not name order).
type tensorSpec struct {
	name string
	size int64
}

// writeSafetensors writes a real safetensors file (U8 tensors, data in
// the order given, random bytes) and returns its header length.
func writeSafetensors(t testing.TB, path string, tensors []tensorSpec) int64 {
	t.Helper()
	header := map[string]any{"__metadata__": map[string]string{"format": "pt"}}
	var at int64
	for _, ts := range tensors {
		header[ts.name] = map[string]any{"dtype": "U8", "shape": []int64{ts.size}, "data_offsets": []int64{at, at + ts.size}}
		at += ts.size
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
	writeRandom(t, f, at)
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	return int64(len(raw))
}

// writeRandom writes n random bytes to f (incompressible, so a
// compressing filesystem stores them all).
func writeRandom(t testing.TB, f *os.File, n int64) {
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

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeIndex writes a safetensors index whose weight_map lists tensors
// in the order given (encoding/json would sort a map's keys).
func writeIndex(t testing.TB, path string, weights [][2]string) {
	t.Helper()
	s := `{"metadata": {"total_size": 0}, "weight_map": {`
	for i, w := range weights {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%q: %q", w[0], w[1])
	}
	writeFile(t, path, s+"}}")
}

// diskDir is a fresh directory on a disk-backed filesystem (diskBase),
// removed when the test ends.
func diskDir(t testing.TB) string {
	t.Helper()
	base, err := diskBase("")
	if err != nil {
		t.Fatal(err)
	}
	d, err := os.MkdirTemp(base, "warm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// diskBase is prefer if it is not empty, which must then be on a
// disk-backed filesystem, else the first of TMPDIR and /var/tmp that is:
// the page cache of tmpfs cannot be dropped.
func diskBase(prefer string) (string, error) {
	onDisk := func(dir string) bool {
		var st unix.Statfs_t
		return unix.Statfs(dir, &st) == nil && st.Type != unix.TMPFS_MAGIC && st.Type != unix.RAMFS_MAGIC
	}
	if prefer != "" {
		if !onDisk(prefer) {
			return "", fmt.Errorf("%s is not a directory on a disk-backed filesystem (tmpfs and ramfs keep their pages); name one that is", prefer)
		}
		return prefer, nil
	}
	for _, base := range []string{os.TempDir(), "/var/tmp"} {
		if onDisk(base) {
			return base, nil
		}
	}
	return "", fmt.Errorf("neither %s nor /var/tmp is on a disk-backed filesystem; set TMPDIR to one", os.TempDir())
}

// drop writes back and drops the page cache of every file of the tree,
// and checks that nothing of it is resident.
func drop(t testing.TB, dir string) {
	t.Helper()
	if err := testenv.DropPageCache(dir); err != nil {
		t.Fatal(err)
	}
	if r, total, err := Resident(dir); err != nil || r > total/100 {
		t.Fatalf("after dropping the page cache of %s: %d of %d bytes resident (%v)", dir, r, total, err)
	}
}

// model writes a tree of nShards shards of shardMiB each (four tensors
// a shard, stored in reverse name order), a config, a tokenizer, an index
// naming the shards last to first, and a README.
func model(t testing.TB, dir string, nShards int, shardMiB int64) {
	t.Helper()
	writeFile(t, filepath.Join(dir, "config.json"), `{"architectures": ["LlamaForCausalLM"]}`)
	writeFile(t, filepath.Join(dir, "tokenizer.json"), `{"model": {}}`)
	writeFile(t, filepath.Join(dir, "README.md"), "# a model\n")
	var weights [][2]string
	for s := nShards; s >= 1; s-- {
		name := fmt.Sprintf("model-%05d-of-%05d.safetensors", s, nShards)
		var ts []tensorSpec
		for k := 3; k >= 0; k-- {
			ts = append(ts, tensorSpec{name: fmt.Sprintf("layers.%d.%d.weight", s, k), size: shardMiB << 20 / 4})
		}
		writeSafetensors(t, filepath.Join(dir, name), ts)
		for _, x := range ts {
			weights = append(weights, [2]string{x.name, name})
		}
	}
	writeIndex(t, filepath.Join(dir, "model.safetensors.index.json"), weights)
}

func sortedNames(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
