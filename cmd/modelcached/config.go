package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/urfave/cli/v2"
	yaml3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"

	"github.com/modelcache/modelcache/internal/cliutil"
)

// The config file (--config) is the command line written as YAML: every
// key is a flag's name and takes what the flag takes (sizes with units,
// durations, lists for repeatable flags):
//
//	quota: 500Gi
//	high-watermark: 85
//	min-age: 2m
//	file-roots: [/srv/models, /mnt/nfs/models]
//
// A flag on the command line (or its environment variable) wins over the
// file. The camelCase keys of earlier releases are still read (oldKeys).

// oldKeys maps the config keys of earlier releases to their flags.
var oldKeys = map[string]string{
	"highWatermarkPercent": "high-watermark", "lowWatermarkPercent": "low-watermark", "minAge": "min-age",
	"keepRevisions": "keep-revisions", "maxConcurrentPulls": "max-concurrent-pulls", "bandwidthLimit": "bandwidth-limit",
	"progressFloor": "progress-floor", "progressWindow": "progress-window", "fileRoots": "file-roots",
	"kernelCacheSignaturePolicy": "kernel-cache-signature-policy", "maxConnectionsPerUID": "max-connections-per-uid",
}

// notInFile are flags that make no sense in the file.
var notInFile = map[string]bool{"config": true, "help": true, "version": true}

// maxConfigFile bounds what --config reads.
const maxConfigFile = 1 << 20

// applyConfigFile sets each flag that the command line left unset from
// the YAML file at path. It reports every bad key and value, not only the
// first; none is applied when any is bad.
func applyConfigFile(c *cli.Context, flags []cli.Flag, path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	if len(raw) > maxConfigFile {
		return fmt.Errorf("--config %s: larger than %d bytes; is it the right file?", path, maxConfigFile)
	}
	js, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return fmt.Errorf("--config %s: not valid YAML: %s", path, strings.TrimPrefix(err.Error(), "error converting YAML to JSON: "))
	}
	var keys map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(js))
	if err := dec.Decode(&keys); err != nil || (keys == nil && strings.TrimSpace(string(js)) != "null") {
		return fmt.Errorf("--config %s: want a YAML mapping of flag names to values, such as \"quota: 500Gi\"", path)
	}
	literals := literalScalars(raw)
	var valid []string
	for _, f := range flags {
		if n := f.Names()[0]; !notInFile[n] {
			valid = append(valid, n)
		}
	}
	sort.Strings(valid)
	type setting struct{ flag, value string }
	var sets []setting
	var problems []string
	names := make([]string, 0, len(keys))
	for k := range keys {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, key := range names {
		name := key
		if n, ok := oldKeys[key]; ok {
			name = n
		}
		f := cliutil.Lookup(flags, name)
		if f == nil || notInFile[name] {
			p := fmt.Sprintf("unknown key %q", key)
			if s := cliutil.Suggest(valid, key); s != "" {
				p += fmt.Sprintf(" (did you mean %q?)", s)
			}
			problems = append(problems, p+"; the keys are the flags' names: "+strings.Join(valid, ", "))
			continue
		}
		values, err := scalars(keys[key])
		if lit, ok := literals[key]; ok && err == nil {
			values = lit // as written: 0660 stays the octal mode the flag reads
		}
		if err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", key, err))
			continue
		}
		if _, isSlice := f.(*cli.StringSliceFlag); !isSlice && len(values) != 1 {
			problems = append(problems, fmt.Sprintf("%s: want one value, not a list", key))
			continue
		}
		for _, v := range values {
			if err := cliutil.CheckValue(f, v); err != nil {
				problems = append(problems, fmt.Sprintf("%s: %q: %v", key, v, err))
				continue
			}
			sets = append(sets, setting{name, v})
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("--config %s:\n  %s", path, strings.Join(problems, "\n  "))
	}
	setFromFile := map[string]bool{} // a list key sets its flag once per element
	for _, s := range sets {
		if c.IsSet(s.flag) && !setFromFile[s.flag] {
			continue // the command line (or the environment) wins
		}
		if err := c.Set(s.flag, s.value); err != nil {
			return fmt.Errorf("--config %s: %s: %q: %v", path, s.flag, s.value, err)
		}
		setFromFile[s.flag] = true
	}
	return nil
}

// literalScalars returns, for each top-level key whose value is a scalar
// or a list of scalars, the values as written in the file. YAML 1.1 (which
// the JSON conversion follows) reads socket-mode: 0660 as the octal
// integer 432; the flag reads the text "0660", and so must the file.
func literalScalars(raw []byte) map[string][]string {
	var doc yaml3.Node
	if yaml3.Unmarshal(raw, &doc) != nil || len(doc.Content) != 1 || doc.Content[0].Kind != yaml3.MappingNode {
		return nil
	}
	text := func(n *yaml3.Node) (string, bool) {
		return n.Value, n.Kind == yaml3.ScalarNode && n.Tag != "!!null"
	}
	out := map[string][]string{}
	m := doc.Content[0].Content
	for i := 0; i+1 < len(m); i += 2 {
		k, v := m[i], m[i+1]
		switch v.Kind {
		case yaml3.ScalarNode:
			if s, ok := text(v); ok {
				out[k.Value] = []string{s}
			}
		case yaml3.SequenceNode:
			var list []string
			for _, e := range v.Content {
				s, ok := text(e)
				if !ok {
					list = nil
					break
				}
				list = append(list, s)
			}
			if list != nil {
				out[k.Value] = list
			}
		}
	}
	return out
}

// scalars reads a YAML value as the flag strings it stands for: a scalar
// is one, a list of scalars is one per element.
func scalars(raw json.RawMessage) ([]string, error) {
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err == nil {
		var out []string
		for _, x := range list {
			s, err := scalar(x)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
		return out, nil
	}
	s, err := scalar(raw)
	if err != nil {
		return nil, err
	}
	return []string{s}, nil
}

func scalar(raw json.RawMessage) (string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return "", err
	}
	switch v := v.(type) {
	case string:
		return v, nil
	case json.Number:
		return v.String(), nil
	case bool:
		return fmt.Sprint(v), nil
	case nil:
		return "", fmt.Errorf("no value; remove the key for the default")
	}
	return "", fmt.Errorf("want a value such as a number, a word or a size, not a mapping")
}
