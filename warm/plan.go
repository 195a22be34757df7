package warm

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// Item is one range of one file of a tree, in the order a loader reads
// it: File is relative to the tree's root (slash-separated), the range is
// [Offset, Offset+Length).
type Item struct {
	File   string
	Offset int64
	Length int64
}

// maxHeader is the largest safetensors header parsed: real ones hold
// well under 1 MiB (a few thousand tensors), the format allows 100 MB,
// and a hostile one should not cost the daemon hundreds of MB of JSON.
// A larger one makes its shard one item, read whole.
const maxHeader = 16 << 20

// maxIndex is the largest *.safetensors.index.json parsed for shard
// order; a larger one is ignored (shards then go in name order).
const maxIndex = 64 << 20

// Plan lists what a loader reads of the committed tree dir, in the order
// it reads it:
//
//  1. config and tokenizer files (config.json first, then the others of
//     configFile's list in path order), and the safetensors index files;
//  2. safetensors shards, in the order each first appears as a value of
//     the weight_map of the tree's *.safetensors.index.json files (in path
//     order), then the shards no index names, in path order. Each shard is
//     its header (the 8-byte length and the JSON) then its tensors in name
//     order (safetensors' safe_open(...).keys() is sorted, and loaders walk
//     it), then any bytes no tensor covers;
//  3. everything else, in path order.
//
// A shard whose header is not valid safetensors is one item, the whole
// file. Files of size zero are left out, and a file linked twice is listed
// once. Plan follows no symlink out of dir: one that leads out is
// ErrEscape. Symlinks on the way to dir itself are followed.
func Plan(dir string) ([]Item, error) {
	dirfd, err := openTree(dir)
	if err != nil {
		return nil, err
	}
	defer unix.Close(dirfd)
	return plan(dirfd, dir)
}

func plan(dirfd int, root string) ([]Item, error) {
	files, err := walkTree(dirfd, root)
	if err != nil {
		return nil, err
	}
	var config, shards, rest []file
	byPath := map[string]file{}
	var indexes []string
	for _, f := range files {
		byPath[f.rel] = f
		base := path.Base(f.rel)
		switch {
		case f.size == 0:
		case strings.HasSuffix(base, ".safetensors.index.json"):
			config = append(config, f)
			indexes = append(indexes, f.rel)
		case configFile(base):
			config = append(config, f)
		case strings.HasSuffix(base, ".safetensors"):
			shards = append(shards, f)
		default:
			rest = append(rest, f)
		}
	}
	sort.SliceStable(config, func(i, j int) bool {
		return path.Base(config[i].rel) == "config.json" && path.Base(config[j].rel) != "config.json"
	})

	var items []Item
	whole := func(f file) { items = append(items, Item{File: f.rel, Offset: 0, Length: f.size}) }
	for _, f := range config {
		whole(f)
	}
	placed := map[string]bool{}
	var ordered []file
	for _, ix := range indexes {
		for _, s := range indexOrder(dirfd, root, ix) {
			if f, ok := byPath[s]; ok && !placed[s] && strings.HasSuffix(s, ".safetensors") && f.size > 0 {
				placed[s] = true
				ordered = append(ordered, f)
			}
		}
	}
	for _, f := range shards {
		if !placed[f.rel] {
			ordered = append(ordered, f)
		}
	}
	for _, f := range ordered {
		its, err := shardItems(dirfd, root, f)
		if err != nil {
			return nil, err
		}
		items = append(items, its...)
	}
	for _, f := range rest {
		whole(f)
	}
	return items, nil
}

// configFile reports whether a file of this base name is one a loader
// reads before the weights: model and generation configs, tokenizers and
// their vocabularies, chat templates.
func configFile(base string) bool {
	switch base {
	case "config.json", "generation_config.json", "special_tokens_map.json", "added_tokens.json",
		"preprocessor_config.json", "processor_config.json", "chat_template.json", "params.json":
		return true
	}
	switch {
	case strings.HasPrefix(base, "tokenizer"), strings.HasPrefix(base, "vocab"),
		strings.HasSuffix(base, ".txt"), strings.HasSuffix(base, ".tiktoken"), strings.HasSuffix(base, ".jinja"),
		strings.HasSuffix(base, "_config.json"):
		return true
	}
	return false
}

// indexOrder reads the safetensors index ix and returns the shard paths
// (relative to the tree's root) in the order they first appear in its
// weight_map. An index that cannot be read or parsed gives none: the
// shards then go in name order, which is no error of the tree.
func indexOrder(dirfd int, root, ix string) []string {
	f, size, err := openFile(dirfd, root, ix)
	if err != nil || size > maxIndex {
		if f != nil {
			f.Close()
		}
		return nil
	}
	defer f.Close()
	dec := json.NewDecoder(io.LimitReader(f, maxIndex))
	var order []string
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	for dec.More() {
		key, err := dec.Token()
		if err != nil {
			return order
		}
		if key != "weight_map" {
			var skip json.RawMessage
			if dec.Decode(&skip) != nil {
				return order
			}
			continue
		}
		if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
			return order
		}
		seen := map[string]bool{}
		for dec.More() {
			if _, err := dec.Token(); err != nil { // the tensor's name
				return order
			}
			var shard string
			if dec.Decode(&shard) != nil {
				return order
			}
			p := path.Join(path.Dir(ix), shard)
			if !seen[p] && shard != "" && !strings.HasPrefix(p, "../") && !path.IsAbs(shard) {
				seen[p] = true
				order = append(order, p)
			}
		}
		return order
	}
	return order
}

// tensorInfo is one tensor of a safetensors header: its name and its
// data range relative to the end of the header.
type tensorInfo struct {
	name       string
	begin, end int64
}

// shardItems is the read order of one safetensors shard: header, tensors
// by name, then the bytes no tensor covers. A file that does not parse is
// one item.
func shardItems(dirfd int, root string, f file) ([]Item, error) {
	whole := []Item{{File: f.rel, Offset: 0, Length: f.size}}
	fh, _, err := openFile(dirfd, root, f.rel)
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	hlen, tensors, ok := readHeader(fh, f.size)
	if !ok {
		return whole, nil
	}
	data := 8 + hlen
	items := []Item{{File: f.rel, Offset: 0, Length: data}}
	sort.Slice(tensors, func(i, j int) bool { return tensors[i].name < tensors[j].name })
	var covered []tensorInfo
	for _, t := range tensors {
		if t.end > t.begin {
			items = append(items, Item{File: f.rel, Offset: data + t.begin, Length: t.end - t.begin})
			covered = append(covered, t)
		}
	}
	// The bytes between and after tensors (padding, or a header that
	// lies): read last, so the whole file is in the plan.
	sort.Slice(covered, func(i, j int) bool { return covered[i].begin < covered[j].begin })
	at := int64(0)
	for _, t := range append(covered, tensorInfo{begin: f.size - data, end: f.size - data}) {
		if t.begin > at {
			items = append(items, Item{File: f.rel, Offset: data + at, Length: t.begin - at})
		}
		at = max(at, t.end)
	}
	return items, nil
}

// readHeader reads a safetensors header: its length and its tensors'
// data ranges. ok is false when the file is not safetensors (too short,
// a length beyond the file or maxHeader, JSON that does not parse, a
// range outside the data); overlapping ranges are kept as they are.
func readHeader(f *os.File, size int64) (hlen int64, tensors []tensorInfo, ok bool) {
	var lenBuf [8]byte
	if size < 8 {
		return 0, nil, false
	}
	if _, err := f.ReadAt(lenBuf[:], 0); err != nil {
		return 0, nil, false
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n < 2 || n > maxHeader || int64(n) > size-8 {
		return 0, nil, false
	}
	raw := make([]byte, n)
	if _, err := f.ReadAt(raw, 8); err != nil && !errors.Is(err, io.EOF) {
		return 0, nil, false
	}
	var header map[string]json.RawMessage
	if json.Unmarshal(bytes.TrimRight(raw, " "), &header) != nil {
		return 0, nil, false
	}
	dataLen := size - 8 - int64(n)
	for name, v := range header {
		if name == "__metadata__" {
			continue
		}
		var t struct {
			Offsets []int64 `json:"data_offsets"`
		}
		if json.Unmarshal(v, &t) != nil || len(t.Offsets) != 2 {
			return 0, nil, false
		}
		b, e := t.Offsets[0], t.Offsets[1]
		if b < 0 || e < b || e > dataLen {
			return 0, nil, false
		}
		tensors = append(tensors, tensorInfo{name: name, begin: b, end: e})
	}
	return int64(n), tensors, true
}

// Total is the number of bytes a plan reads.
func Total(items []Item) int64 {
	var n int64
	for _, it := range items {
		n += it.Length
	}
	return n
}

func (it Item) String() string {
	return fmt.Sprintf("%s[%d:+%d]", it.File, it.Offset, it.Length)
}
