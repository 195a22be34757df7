package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	yaml3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/internal/cliutil"
)

// modelsFile is one YAML file of the models dir: one desire, or a list
// under "models".
type modelsFile struct {
	api.Desire `json:",inline"`
	Models     []api.Desire `json:"models,omitempty"`
}

// modelsDir is the desires of the models dir (--models-dir): its YAML
// files read, validated and watched; the daemon's desire set takes them
// whole (desireSet.file) with the problems found (desireSet.fileErrors).
type modelsDir struct{ d *Daemon }

// maxModelsFile bounds what one models.d file may hold; more is refused
// before anything is parsed.
const maxModelsFile = 1 << 20

// loadModelsDir reads every *.yaml / *.yml regular file. A bad file, and
// anything there that is not a regular file (a symlink, a FIFO, a device,
// a directory), is reported by name (log and status) and skipped; the
// others still count.
func (m modelsDir) load() {
	d := m.d
	dir := d.cfg.ModelsDir
	desires := map[string]api.Desire{}
	stamps := map[string]time.Time{}
	var problems []string
	if dir != "" {
		ents, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			problems = append(problems, fmt.Sprintf("%s: %v", dir, err))
		}
		sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
		for _, e := range ents {
			n := e.Name()
			if strings.HasPrefix(n, ".") || !(strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml")) {
				continue
			}
			path := filepath.Join(dir, n)
			if !e.Type().IsRegular() {
				problems = append(problems, fmt.Sprintf("%s: %s, not a regular file; skipped (models.d reads only regular files)", path, "a "+fetchers.TypeName(e.Type())))
				continue
			}
			if fi, err := e.Info(); err == nil {
				stamps[path] = fi.ModTime()
			}
			list, err := m.parse(path)
			if err != nil {
				problems = append(problems, err.Error())
				continue
			}
			for _, ds := range list {
				if prev, dup := desires[ds.Name]; dup {
					problems = append(problems, fmt.Sprintf("%s: artifact %s is already declared in %s; the first one counts", path, ds.Name, strings.TrimPrefix(prev.Origin, "file:")))
					continue
				}
				desires[ds.Name] = ds
			}
		}
	}
	for i, p := range problems {
		problems[i] = fetchers.RedactText(p) // status shows them to every local user
		d.log.Error("models dir", "problem", problems[i])
	}
	d.desires.writeMu.Lock()
	defer d.desires.writeMu.Unlock()
	d.mu.Lock()
	d.desires.file, d.desires.fileErrors = desires, problems
	// A file touched (its mtime moved) retries its Failed desires, as
	// modelctl retry does: the fix was elsewhere (a permission, a token).
	for name, ds := range desires {
		path := strings.TrimPrefix(ds.Origin, "file:")
		before, seen := d.desires.fileStamps[path]
		if st := d.arts[name]; seen && !before.Equal(stamps[path]) && st != nil && st.cancel == nil && st.phase == api.PhaseFailed {
			st.force = true
			d.log.Info("models.d file touched; retrying its failed desire", "artifact", name, "file", path)
		}
	}
	d.desires.fileStamps = stamps
	d.desires.publish()
	d.notify()
	d.mu.Unlock()
	d.kick()
}

// readModelsFile reads path only when it is a regular file, and at most
// maxModelsFile bytes of it. It opens without following a symlink and
// without blocking on a FIFO (either may have replaced the file since the
// directory was listed) and checks the handle it read from. Its errors
// never quote the file's content.
func readModelsFile(path string) ([]byte, error) {
	b, err := fetchers.ReadRegularFile(path, maxModelsFile, false)
	if err != nil {
		return nil, fmt.Errorf("%v; skipped (models.d reads only regular files)", err)
	}
	return b, nil
}

func (m modelsDir) parse(path string) ([]api.Desire, error) {
	d := m.d
	raw, err := readModelsFile(path)
	if err != nil {
		return nil, err
	}
	if err := checkModelsKeys(raw); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	var mf modelsFile
	if err := yaml.UnmarshalStrict(raw, &mf); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, fmt.Errorf("%s: %s", path, typeProblem(raw, te))
		}
		return nil, fmt.Errorf("%s: %v (a model's keys are: %s; or a list of models under models:)", path, err, strings.Join(modelsKeys(reflect.TypeFor[api.Desire]()), ", "))
	}
	list := mf.Models
	if mf.Desire.Name != "" || mf.Desire.URI != "" {
		list = append(list, mf.Desire)
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("%s: declares no model", path)
	}
	out := make([]api.Desire, 0, len(list))
	for _, ds := range list {
		v, err := d.validateDesire(ds)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		v.Origin = "file:" + path
		v.Credentialed = d.sources.Credentialed(context.Background(), v) // private unless public: true (tenancy.go)
		out = append(out, v)
	}
	return out, nil
}

// notInModelsDir are keys of a desire that the cluster sync or the
// daemon set, never a models.d file, and why.
var notInModelsDir = map[string]string{
	"clusterDigest": "the cluster sync", "ref": "the cluster sync", "revision": "the cluster sync (a ModelCache's rollout)",
	"stage": "the cluster sync (a ModelCache's rollout)", "retain": "the cluster sync (a ModelCache's rollout)",
	"policy": "the cluster sync", "origin": "the daemon", "serves": "the daemon", "requester": "the daemon (a socket peer's identity)",
	"credentialed": "the daemon (whether the source is fetched with credentials)",
}

// refusedBy says who sets key if models.d may not, in any case of its
// letters (the decoder matches keys as encoding/json does).
func refusedBy(key string) string {
	for k, by := range notInModelsDir {
		if strings.EqualFold(k, key) {
			return by
		}
	}
	return ""
}

// modelsKeys are the keys a models.d mapping of type t may hold: the JSON
// names of its fields (the fields of an embedded struct with them), so
// that the list cannot drift from the types; for a desire, less those in
// notInModelsDir.
func modelsKeys(t reflect.Type) []string {
	desire := t == reflect.TypeFor[api.Desire]() || t == reflect.TypeFor[modelsFile]()
	var keys []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-" || !f.IsExported() && !f.Anonymous:
		case name == "" && f.Anonymous:
			keys = append(keys, modelsKeys(f.Type)...)
		case desire && notInModelsDir[jsonName(f)] != "":
		default:
			keys = append(keys, jsonName(f))
		}
	}
	return keys
}

func jsonName(f reflect.StructField) string {
	if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" {
		return name
	}
	return f.Name
}

// modelsField is the field of t (or of a struct embedded in it) whose
// JSON name is key, in any case of its letters as encoding/json takes it.
func modelsField(t reflect.Type, key string) (reflect.StructField, bool) {
	for f := range t.Fields() {
		if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name == "" && f.Anonymous {
			if sf, ok := modelsField(f.Type, key); ok {
				return sf, true
			}
		} else if strings.EqualFold(jsonName(f), key) {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// checkModelsKeys reports each key of a models.d file that its place does
// not take, by line, with the closest valid key and all of them; a key
// that only the cluster sync or the daemon sets, with who sets it. What
// is not YAML, or not a mapping where one is due, is left to the decoder.
func checkModelsKeys(raw []byte) error {
	var doc yaml3.Node
	if err := yaml3.Unmarshal(raw, &doc); err != nil || len(doc.Content) == 0 {
		return nil
	}
	var problems []string
	var walk func(n *yaml3.Node, t reflect.Type, what string)
	walk = func(n *yaml3.Node, t reflect.Type, what string) {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		switch {
		case n.Kind == yaml3.SequenceNode && t.Kind() == reflect.Slice:
			for _, c := range n.Content {
				walk(c, t.Elem(), what)
			}
		case n.Kind == yaml3.MappingNode && t.Kind() == reflect.Struct:
			valid := modelsKeys(t)
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i]
				if by := refusedBy(k.Value); by != "" && (t == reflect.TypeFor[modelsFile]() || t == reflect.TypeFor[api.Desire]()) {
					problems = append(problems, fmt.Sprintf("line %d: key %q is set by %s, not in models.d; remove it", k.Line, k.Value, by))
					continue
				}
				f, ok := modelsField(t, k.Value)
				if !ok {
					p := fmt.Sprintf("line %d: unknown key %q", k.Line, k.Value)
					if s := cliutil.Suggest(valid, k.Value); s != "" {
						p += fmt.Sprintf(" (did you mean %q?)", s)
					}
					problems = append(problems, p+fmt.Sprintf("; %s keys are: %s", what, strings.Join(valid, ", ")))
					continue
				}
				inner := what
				switch k.Value {
				case "models":
					inner = "a model's"
				case "kernelCaches":
					inner = "a kernel cache's"
				case "signature":
					inner = "a signature policy's"
				}
				walk(n.Content[i+1], f.Type, inner)
			}
		}
	}
	walk(doc.Content[0], reflect.TypeFor[modelsFile](), "a model's")
	if len(problems) == 0 {
		return nil
	}
	return errors.New(strings.Join(problems, "\n  "))
}

// typeProblem says which key of a models.d file holds a value of the
// wrong type, by line: the first key on te's path whose YAML value is not
// of the type the field wants (te names the path, not the list element).
func typeProblem(raw []byte, te *json.UnmarshalTypeError) string {
	want := map[reflect.Kind]string{reflect.Bool: "true or false", reflect.String: "a string", reflect.Slice: "a list",
		reflect.Struct: "a mapping", reflect.Map: "a mapping", reflect.Pointer: "a mapping"}[te.Type.Kind()]
	if want == "" {
		want = "a " + te.Type.String()
	}
	tag := map[reflect.Kind]string{reflect.Bool: "!!bool", reflect.String: "!!str"}[te.Type.Kind()]
	var path []string // te's JSON path, less the embedded desire's Go name
	for _, p := range strings.Split(te.Field, ".") {
		if f, ok := reflect.TypeFor[modelsFile]().FieldByName(p); !ok || !f.Anonymous {
			path = append(path, p)
		}
	}
	var doc yaml3.Node
	if yaml3.Unmarshal(raw, &doc) == nil && len(doc.Content) > 0 {
		var found *yaml3.Node
		var walk func(n *yaml3.Node, path []string) bool
		walk = func(n *yaml3.Node, path []string) bool {
			switch n.Kind {
			case yaml3.SequenceNode:
				for _, c := range n.Content {
					if walk(c, path) {
						return true
					}
				}
			case yaml3.MappingNode:
				for i := 0; i+1 < len(n.Content); i += 2 {
					if !strings.EqualFold(n.Content[i].Value, path[0]) {
						continue
					}
					if len(path) > 1 {
						if walk(n.Content[i+1], path[1:]) {
							return true
						}
						continue
					}
					if found == nil {
						found = n.Content[i]
					}
					if v := n.Content[i+1]; tag == "" || v.Tag != tag {
						found = n.Content[i]
						return true
					}
				}
			}
			return false
		}
		walk(doc.Content[0], path)
		if found != nil {
			return fmt.Sprintf("line %d: key %q: want %s, not a %s", found.Line, found.Value, want, te.Value)
		}
	}
	return fmt.Sprintf("key %q: want %s, not a %s", strings.Join(path, "."), want, te.Value)
}

// watchModelsDir reloads the models dir when anything in it changes
// (debounced), and polls for the dir itself when it does not exist yet.
func (m modelsDir) watch(ctx context.Context) {
	d := m.d
	dir := d.cfg.ModelsDir
	if dir == "" {
		return
	}
	for ctx.Err() == nil {
		w, err := fsnotify.NewWatcher()
		if err != nil {
			d.log.Error("models dir watcher", "err", err)
			return
		}
		if err := w.Add(dir); err != nil {
			w.Close()
			select { // the dir may appear later (a config package installs it)
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Second):
			}
			if _, serr := os.Stat(dir); serr == nil {
				m.load()
			}
			continue
		}
		m.load()
		m.loop(ctx, w)
		w.Close()
	}
}

func (m modelsDir) loop(ctx context.Context, w *fsnotify.Watcher) {
	d := m.d
	var debounce <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if ev.Name == d.cfg.ModelsDir && ev.Has(fsnotify.Remove|fsnotify.Rename) {
				m.load()
				return // re-add the watch
			}
			debounce = time.After(200 * time.Millisecond)
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			d.log.Warn("models dir watcher", "err", err)
		case <-debounce:
			m.load()
		}
	}
}
