// Package bundle renders a kustomization of deploy/ (the DaemonSet
// bundle, deploy/daemonset, or its examples) with its image set to the one
// `make image` built. The image is a required value: those kustomizations
// take it from a ConfigMap that only Render supplies (a replacement whose
// source is named "the image is a required value: …"), so `kubectl apply
// -k` on them refuses to render, and their objects name the placeholder
// modelcached.invalid/modelcached, which no registry serves.
package bundle

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"sigs.k8s.io/kustomize/api/konfig"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Placeholder is the image the kustomizations' objects name until set.
const Placeholder = "modelcached.invalid/modelcached"

// requiredPrefix starts the name of the ConfigMap a kustomization takes
// its image from (the replacement's source; nothing in the tree has it).
const requiredPrefix = "the image is a required value"

// checkImage refuses what is not an image reference a node could pull,
// and the Placeholder.
func checkImage(image string) error {
	if image == "" {
		return fmt.Errorf("the image is a required value: make bundle IMAGE=registry.example.com/modelcached:v1 (the IMAGE make image built and the nodes pull)")
	}
	if _, err := name.ParseReference(image); err != nil || !strings.Contains(image, "/") {
		return fmt.Errorf("IMAGE %q: want a reference such as registry.example.com/modelcached:v1", image)
	}
	if strings.HasPrefix(image, Placeholder) {
		return fmt.Errorf("IMAGE %q is the Placeholder; name the image make image built", image)
	}
	return nil
}

// Render builds the kustomization in dir (below a directory named deploy,
// which is copied whole into memory: bases such as ../crds must resolve)
// with the required image supplied, and checks that every object that
// named the Placeholder now names image.
func Render(dir, image string) ([]byte, error) {
	if err := checkImage(image); err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	root := abs
	for filepath.Base(root) != "deploy" {
		if root == filepath.Dir(root) {
			return nil, fmt.Errorf("%s is not below a directory named deploy", dir)
		}
		root = filepath.Dir(root)
	}
	mem := filesys.MakeFsInMemory()
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return mem.WriteFile(p, b)
	})
	if err != nil {
		return nil, err
	}
	if err := supplyImage(mem, abs, image); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(mem, abs)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	y, err := res.AsYaml()
	if err != nil {
		return nil, err
	}
	if bytes.Contains(y, []byte(Placeholder)) {
		return nil, fmt.Errorf("kustomize build %s: an object still names %s; its replacement does not reach it", dir, Placeholder)
	}
	if !bytes.Contains(y, []byte("image: "+image+"\n")) {
		return nil, fmt.Errorf("kustomize build %s: no object runs %s", dir, image)
	}
	return y, nil
}

// supplyImage adds to the kustomization in dir the ConfigMap its
// required-image replacement reads, marked local-config so that it is not
// part of the output.
func supplyImage(mem filesys.FileSystem, dir, image string) error {
	kf := filepath.Join(dir, konfig.DefaultKustomizationFileName())
	b, err := mem.ReadFile(kf)
	if err != nil {
		return err
	}
	var k types.Kustomization
	if err := yaml.Unmarshal(b, &k); err != nil {
		return err
	}
	source := ""
	for _, r := range k.Replacements {
		if r.Source != nil && r.Source.Kind == "ConfigMap" && strings.HasPrefix(r.Source.Name, requiredPrefix) {
			source = r.Source.Name
		}
	}
	if source == "" {
		return fmt.Errorf("no replacement takes %q from a ConfigMap named %q…; is it the DaemonSet bundle or its examples?", "data.image", requiredPrefix)
	}
	cm := map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": source, "annotations": map[string]any{konfig.IgnoredByKustomizeAnnotation: "true"}},
		"data":     map[string]any{"image": image},
	}
	cb, err := yaml.Marshal(cm)
	if err != nil {
		return err
	}
	if err := mem.WriteFile(filepath.Join(dir, "mkbundle-image.yaml"), cb); err != nil {
		return err
	}
	k.Resources = append(k.Resources, "mkbundle-image.yaml")
	kb, err := yaml.Marshal(k)
	if err != nil {
		return err
	}
	return mem.WriteFile(kf, kb)
}
