package k8ssync

import (
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestCRDSchemasMatchGoTypes keeps deploy/crds in step with the Go types:
// every JSON field of a type is a property of its oschema and the other
// way round, all the way down.
func TestCRDSchemasMatchGoTypes(t *testing.T) {
	for file, typ := range map[string]reflect.Type{
		"../deploy/crds/modelcache.io_modelcaches.yaml":           reflect.TypeOf(ModelCache{}),
		"../deploy/crds/modelcache.io_modelcachenodes.yaml":       reflect.TypeOf(ModelCacheNode{}),
		"../deploy/crds/modelcache.io_modelcachecredentials.yaml": reflect.TypeOf(ModelCacheCredentials{}),
	} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var crd struct {
			Spec struct {
				Versions []struct {
					Schema struct {
						OpenAPIV3Schema oschema `json:"openAPIV3Schema"`
					} `json:"schema"`
				} `json:"versions"`
			} `json:"spec"`
		}
		if err := yaml.UnmarshalStrict(b, &crd); err != nil {
			// Fields of the CRD this test does not model are fine.
			if err := yaml.Unmarshal(b, &crd); err != nil {
				t.Fatal(err)
			}
		}
		root := crd.Spec.Versions[0].Schema.OpenAPIV3Schema
		for _, top := range []string{"spec", "status"} {
			f, ok := typ.FieldByName(strings.ToUpper(top[:1]) + top[1:])
			if !ok {
				continue
			}
			compare(t, file+": "+top, root.Properties[top], f.Type)
		}
	}
}

type oschema struct {
	Type       string             `json:"type"`
	Properties map[string]oschema `json:"properties"`
	Items      *oschema           `json:"items"`
}

func compare(t *testing.T, where string, s oschema, typ reflect.Type) {
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	switch {
	case typ.Kind() == reflect.Slice && typ.Elem().Kind() != reflect.Uint8:
		if s.Items == nil {
			t.Errorf("%s: a list in Go, no items in the oschema", where)
			return
		}
		compare(t, where+"[]", *s.Items, typ.Elem())
		return
	case typ.Kind() != reflect.Struct || typ.PkgPath() != reflect.TypeOf(ModelCache{}).PkgPath() && !strings.Contains(typ.PkgPath(), "modelcache/api"):
		return // scalars, metav1 types (conditions, selectors) and maps
	}
	fields := map[string]reflect.Type{}
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		fields[name] = f.Type
	}
	var goOnly, schemaOnly []string
	for n, ft := range fields {
		p, ok := s.Properties[n]
		if !ok {
			goOnly = append(goOnly, n)
			continue
		}
		compare(t, where+"."+n, p, ft)
	}
	for n := range s.Properties {
		if _, ok := fields[n]; !ok {
			schemaOnly = append(schemaOnly, n)
		}
	}
	sort.Strings(goOnly)
	sort.Strings(schemaOnly)
	if len(goOnly) > 0 || len(schemaOnly) > 0 {
		t.Errorf("%s: fields only in Go %v, only in the CRD %v", where, goOnly, schemaOnly)
	}
}
