package modelcache_test

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// The size rules of the module's non-test code: a file a reader can hold
// in mind, a function that reads as one step, a type that is one
// component rather than the whole program. A table of commands is data,
// not a function: split it by command.
const (
	maxFileLines   = 500
	maxFuncLines   = 100
	maxTypeMethods = 40
)

// sizeAllowed lists the offenders allowed to stay. The test fails when
// one of them is no longer over its limit, so the list only shrinks.
// Keys are as sizeOffenders writes them: "file DIR/NAME.go", "func DIR
// RECV.NAME" and "type DIR.TYPE".
var sizeAllowed = map[string]bool{
	// The content store: 58 methods on one type, used through the small
	// role interfaces of cachestore/roles.go (Puller, Viewer, Pruner); the
	// daemon's records are a type of their own (cachestore.Records).
	"type cachestore.Store": true,
}

// TestSizes fails naming each non-test file of the module over
// maxFileLines lines, each function (or method) over maxFuncLines lines
// from its func keyword to its closing brace, and each type with more
// than maxTypeMethods methods declared in its package's non-test files.
// Generated files (a "Code generated … DO NOT EDIT." line) and testdata
// and vendor directories are not the module's own writing and are skipped.
func TestSizes(t *testing.T) {
	found := sizeOffenders(t)
	var keys []string
	for k := range found {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !sizeAllowed[k] {
			t.Errorf("%s: split it by concern", found[k])
		}
	}
	var gone []string
	for k := range sizeAllowed {
		if _, ok := found[k]; !ok {
			gone = append(gone, k)
		}
	}
	sort.Strings(gone)
	for _, k := range gone {
		t.Errorf("%q is no longer over its limit: delete it from sizeAllowed", k)
	}
}

// sizeOffenders walks the module as goDirs does and maps each offender's
// key (see sizeAllowed) to a message naming it, its size and its limit.
func sizeOffenders(t *testing.T) map[string]string {
	dirs := goDirs(t)
	if len(dirs) < 20 {
		t.Fatalf("found only %d package directories (%v); the walk no longer sees the module", len(dirs), dirs)
	}
	found := map[string]string{}
	methods := map[string]int{} // "DIR.TYPE" → methods declared
	for dir, files := range dirs {
		if dir == "vendor" || strings.HasPrefix(dir, "vendor"+string(filepath.Separator)) {
			continue
		}
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			path := filepath.Join(dir, name)
			src, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, src, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			if ast.IsGenerated(f) {
				continue
			}
			rel := filepath.ToSlash(path)
			if n := bytes.Count(src, []byte("\n")); n > maxFileLines {
				found["file "+rel] = fmt.Sprintf("%s has %d lines (at most %d)", rel, n, maxFileLines)
			}
			for _, d := range f.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				name := fd.Name.Name
				if recv := recvType(fd); recv != "" {
					name = recv + "." + name
					methods[filepath.ToSlash(dir)+"."+recv]++
				}
				n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
				if n > maxFuncLines {
					found["func "+filepath.ToSlash(dir)+" "+name] = fmt.Sprintf("%s:%d: %s has %d lines (at most %d)",
						rel, fset.Position(fd.Pos()).Line, name, n, maxFuncLines)
				}
			}
		}
	}
	for typ, n := range methods {
		if n > maxTypeMethods {
			found["type "+typ] = fmt.Sprintf("type %s has %d methods (at most %d)", typ, n, maxTypeMethods)
		}
	}
	return found
}

// recvType names a method's receiver type without its pointer and type
// parameters; "" for a function.
func recvType(fd *ast.FuncDecl) string {
	if fd.Recv == nil || len(fd.Recv.List) == 0 {
		return ""
	}
	e := fd.Recv.List[0].Type
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.ParenExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return fmt.Sprintf("%T", e)
		}
	}
}
