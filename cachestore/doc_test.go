package cachestore

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestDocDrawsSchema holds the drawing of the index in doc.go to what the
// code stores: every bucket and key name declared in the package, every
// JSON field of every stored record, and the key prefix the daemon gives
// cluster desires.
func TestDocDrawsSchema(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	drawing := schemaDrawing(t, string(src))

	// Buckets and keys: the []byte names declared in the package's files.
	buckets, keys := indexNames(t)
	if len(buckets) < 6 || len(keys) < 2 {
		t.Fatalf("found buckets %v and keys %v in the package; the test no longer reads the declarations", buckets, keys)
	}
	for _, b := range buckets {
		if !regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(b) + `/`).MatchString(drawing) {
			t.Errorf("doc.go does not draw bucket %q (want a line %q)", b, b+"/")
		}
	}
	for _, k := range keys {
		if !regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(k) + `\s+->`).MatchString(drawing) {
			t.Errorf("doc.go does not draw key %q (want a line %q)", k, k+" -> …")
		}
	}

	// Records: each JSON field inside its record's part of the drawing.
	for _, r := range []struct {
		typ        reflect.Type
		start, end string
		skip       string // a field stored elsewhere
	}{
		{reflect.TypeOf(blobRecord{}), "JSON blobRecord{", "}", ""},
		{reflect.TypeOf(Version{}), "JSON Version", "metadata: Metadata{", "manifest"},
		{reflect.TypeOf(Metadata{}), "metadata: Metadata{", "}", ""},
		{reflect.TypeOf(Entry{}), "JSON Manifest [", "]", ""},
		{reflect.TypeOf(xetPlace{}), "JSON xetPlace{", "}", ""},
		{reflect.TypeOf(xetRef{}), "JSON [xetRef{", "}", ""},
	} {
		part := between(t, drawing, r.start, r.end)
		fields := jsonFields(r.typ)
		if len(fields) == 0 {
			t.Fatalf("%s: no JSON fields found", r.typ)
		}
		for _, f := range fields {
			if f == r.skip {
				continue
			}
			if !regexp.MustCompile(`\b` + regexp.QuoteMeta(f) + `\b`).MatchString(part) {
				t.Errorf("doc.go draws %s without its stored field %q", r.typ.Name(), f)
			}
		}
	}
	if !strings.Contains(drawing, "manifests/") {
		t.Error("doc.go does not say where a version's manifest is stored")
	}

	// The desires bucket's key prefix for cluster desires, which the
	// daemon owns: read from its source, wherever in daemon/ it lives.
	prefix := clusterKeyPrefix(t)
	if !strings.Contains(drawing, prefix+"<name>") {
		t.Errorf("doc.go does not draw the desires key %q", prefix+"<name>")
	}
}

// schemaDrawing is the indented block of the "Index schema" section.
func schemaDrawing(t *testing.T, src string) string {
	i := strings.Index(src, "// # Index schema")
	if i < 0 {
		t.Fatal("doc.go has no \"# Index schema\" section")
	}
	rest := src[i+1:]
	if j := strings.Index(rest, "\n// # "); j >= 0 {
		rest = rest[:j]
	}
	var b strings.Builder
	for _, line := range strings.Split(rest, "\n") {
		if l, ok := strings.CutPrefix(line, "//\t"); ok {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	if b.Len() == 0 {
		t.Fatal("doc.go's index schema section has no indented drawing")
	}
	return b.String()
}

func between(t *testing.T, s, start, end string) string {
	t.Helper()
	i := strings.Index(s, start)
	if i < 0 {
		t.Fatalf("doc.go's drawing lacks %q", start)
	}
	s = s[i+len(start):]
	j := strings.Index(s, end)
	if j < 0 {
		t.Fatalf("doc.go's drawing: no %q after %q", end, start)
	}
	return s[:j]
}

func jsonFields(typ reflect.Type) []string {
	var out []string
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	return out
}

// indexNames reads the package's declarations of the form
// bucketX = []byte("x") and keyX = []byte("x").
func indexNames(t *testing.T) (buckets, keys []string) {
	fset := token.NewFileSet()
	files, _ := filepath.Glob("*.go")
	for _, fn := range files {
		if strings.HasSuffix(fn, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, fn, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for i, id := range vs.Names {
				if i >= len(vs.Values) {
					break
				}
				call, ok := vs.Values[i].(*ast.CallExpr)
				if !ok || len(call.Args) != 1 {
					continue
				}
				if at, ok := call.Fun.(*ast.ArrayType); !ok || at.Len != nil || !isIdent(at.Elt, "byte") {
					continue
				}
				lit, ok := call.Args[0].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				v, _ := strconv.Unquote(lit.Value)
				switch {
				case strings.HasPrefix(id.Name, "bucket"):
					buckets = append(buckets, v)
				case strings.HasPrefix(id.Name, "key"):
					keys = append(keys, v)
				}
			}
			return true
		})
	}
	return buckets, keys
}

func isIdent(e ast.Expr, name string) bool {
	id, ok := e.(*ast.Ident)
	return ok && id.Name == name
}

// clusterKeyPrefix finds `clusterKey = "…"` in the daemon's sources.
func clusterKeyPrefix(t *testing.T) string {
	re := regexp.MustCompile(`\bclusterKey\s*=\s*"([^"]*)"`)
	files, _ := filepath.Glob(filepath.Join("..", "daemon", "*.go"))
	for _, fn := range files {
		b, err := os.ReadFile(fn)
		if err != nil {
			t.Fatal(err)
		}
		if m := re.FindSubmatch(b); m != nil {
			return string(m[1])
		}
	}
	t.Fatal("no clusterKey = \"…\" in daemon/*.go: the daemon's key prefix for cluster desires moved; update this test and doc.go")
	return ""
}
