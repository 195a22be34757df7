package daemon

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
	"sigs.k8s.io/yaml"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers"
)

// modelsFile is one YAML file of the models dir: one desire, or a list
// under "models".
type modelsFile struct {
	api.Desire `json:",inline"`
	Models     []api.Desire `json:"models,omitempty"`
}

// maxModelsFile bounds what one models.d file may hold; more is refused
// before anything is parsed.
const maxModelsFile = 1 << 20

// loadModelsDir reads every *.yaml / *.yml regular file. A bad file, and
// anything there that is not a regular file (a symlink, a FIFO, a device,
// a directory), is reported by name (log and status) and skipped; the
// others still count.
func (d *Daemon) loadModelsDir() {
	dir := d.cfg.ModelsDir
	desires := map[string]api.Desire{}
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
			list, err := d.parseModelsFile(path)
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
	d.desireMu.Lock()
	defer d.desireMu.Unlock()
	d.mu.Lock()
	d.fileDesires, d.fileErrors = desires, problems
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

func (d *Daemon) parseModelsFile(path string) ([]api.Desire, error) {
	raw, err := readModelsFile(path)
	if err != nil {
		return nil, err
	}
	var mf modelsFile
	if err := yaml.UnmarshalStrict(raw, &mf); err != nil {
		return nil, fmt.Errorf("%s: %v (want name:, uri: and optional digest:, pin:, state:, include:, exclude: — or a list under models:)", path, err)
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
		if ds.Stage || len(ds.Retain) > 0 || ds.Revision != "" || ds.Policy != "" {
			return nil, fmt.Errorf("%s: model %s: stage, retain, revision and policy are set by the cluster sync (a ModelCache's rollout), not in models.d; remove them", path, ds.Name)
		}
		v, err := d.validateDesire(ds)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		v.Origin = "file:" + path
		out = append(out, v)
	}
	return out, nil
}

// watchModelsDir reloads the models dir when anything in it changes
// (debounced), and polls for the dir itself when it does not exist yet.
func (d *Daemon) watchModelsDir(ctx context.Context) {
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
				d.loadModelsDir()
			}
			continue
		}
		d.loadModelsDir()
		d.watchLoop(ctx, w)
		w.Close()
	}
}

func (d *Daemon) watchLoop(ctx context.Context, w *fsnotify.Watcher) {
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
				d.loadModelsDir()
				return // re-add the watch
			}
			debounce = time.After(200 * time.Millisecond)
		case err, ok := <-w.Errors:
			if !ok {
				return
			}
			d.log.Warn("models dir watcher", "err", err)
		case <-debounce:
			d.loadModelsDir()
		}
	}
}
