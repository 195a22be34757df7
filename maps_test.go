package modelcache_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestPackageMapsNameTheirFiles holds each package's map to its directory,
// in the manner of cachestore's TestDocDrawsSchema. The map is the package
// comment: doc.go's when the package has one, else the one file that
// carries a package comment. It must name every non-test .go file of the
// package but the one it lives in (build-constrained files included), and
// every *.go file it names must exist: a bare name in the package's
// directory, a name with a slash (daemon/admission.go) from the module
// root or the package's directory. A directory whose .go files are all
// tests has no map to keep.
func TestPackageMapsNameTheirFiles(t *testing.T) {
	dirs := goDirs(t)
	if len(dirs) < 20 {
		t.Fatalf("found only %d package directories (%v); the walk no longer sees the module", len(dirs), dirs)
	}
	goFile := regexp.MustCompile(`[A-Za-z0-9_./-]*[A-Za-z0-9_]\.go\b`)
	var names []string
	for dir := range dirs {
		names = append(names, dir)
	}
	sort.Strings(names)
	for _, dir := range names {
		files := dirs[dir]
		var sources []string
		for _, f := range files {
			if !strings.HasSuffix(f, "_test.go") {
				sources = append(sources, f)
			}
		}
		if len(sources) == 0 {
			continue
		}
		mapFile, text := packageMap(t, dir, sources)
		if mapFile == "" {
			t.Errorf("%s: no package comment: write one (doc.go for a package of several files) that names its files", dir)
			continue
		}
		named := map[string]bool{}
		for _, m := range goFile.FindAllString(text, -1) {
			if strings.Contains(m, "://") {
				continue
			}
			m = strings.TrimPrefix(m, "./")
			named[m] = true
			if !strings.Contains(m, "/") {
				if !exists(filepath.Join(dir, m)) {
					t.Errorf("%s/%s names %s, which is not in %s/", dir, mapFile, m, dir)
				}
				continue
			}
			if !exists(m) && !exists(filepath.Join(dir, m)) {
				t.Errorf("%s/%s names %s, which is in neither the module root nor %s/", dir, mapFile, m, dir)
			}
		}
		for _, f := range sources {
			if f != mapFile && !named[f] {
				t.Errorf("%s/%s does not name %s: add a line saying what it holds", dir, mapFile, f)
			}
		}
	}
}

// goDirs maps each directory of the module holding .go files (but
// testdata, hidden and underscore directories, which the go tool skips)
// to the names of those files.
func goDirs(t *testing.T) map[string][]string {
	dirs := map[string][]string{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != "." && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".go") && !strings.HasPrefix(name, ".") && !strings.HasPrefix(name, "_") {
			dir := filepath.Dir(path)
			dirs[dir] = append(dirs[dir], name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, files := range dirs {
		sort.Strings(files)
	}
	return dirs
}

// packageMap returns the file holding the package's map and the map's
// text: doc.go's package comment if there is a doc.go, else the package
// comment of the only file that has one.
func packageMap(t *testing.T, dir string, sources []string) (file, text string) {
	fset := token.NewFileSet()
	docs := map[string]string{}
	for _, f := range sources {
		pf, err := parser.ParseFile(fset, filepath.Join(dir, f), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		if pf.Doc != nil {
			docs[f] = pf.Doc.Text()
		}
	}
	if d, ok := docs["doc.go"]; ok {
		return "doc.go", d
	}
	if len(docs) > 1 {
		var names []string
		for f := range docs {
			names = append(names, f)
		}
		sort.Strings(names)
		t.Errorf("%s: package comments in %v: keep the map in one file (doc.go)", dir, names)
		return "", ""
	}
	for f, d := range docs {
		return f, d
	}
	return "", ""
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
