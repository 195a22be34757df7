// Command mkbundle writes the DaemonSet bundle (deploy/daemonset, built
// with kustomize) with its image set to the one `make image` built, so
// that `make bundle` deploys exactly that image and not the bundle's
// placeholder tag (the bundle names ghcr.io/modelcache/modelcached:latest,
// which this repository never builds).
//
//	mkbundle -image ghcr.io/modelcache/modelcached:TAG -out bin/modelcache.yaml deploy/daemonset
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"strings"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// placeholder is the image the bundle's kustomization names.
const placeholder = "ghcr.io/modelcache/modelcached:latest"

func main() {
	image := flag.String("image", "", "the image reference make image built (IMAGE)")
	out := flag.String("out", "", "where to write the bundle")
	flag.Parse()
	if *image == "" || *out == "" || flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: mkbundle -image REF -out FILE KUSTOMIZATION_DIR")
		os.Exit(2)
	}
	b, err := bundle(flag.Arg(0), *image)
	if err == nil {
		err = os.WriteFile(*out, b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkbundle:", err)
		os.Exit(1)
	}
}

// bundle builds the kustomization in dir and sets every container image
// the bundle names as its placeholder to image.
func bundle(dir, image string) ([]byte, error) {
	if strings.ContainsAny(image, " \t\n\"'") || !strings.Contains(image, "/") {
		return nil, fmt.Errorf("-image %q: want a reference such as registry.example.com/modelcached:v1", image)
	}
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	y, err := res.AsYaml()
	if err != nil {
		return nil, err
	}
	from, to := []byte("image: "+placeholder+"\n"), []byte("image: "+image+"\n")
	if n := bytes.Count(y, from); n == 0 {
		return nil, fmt.Errorf("kustomize build %s names no %s image; is it the DaemonSet bundle?", dir, placeholder)
	}
	return bytes.ReplaceAll(y, from, to), nil
}
