// Command mkbundle writes a kustomization of deploy/ (the DaemonSet
// bundle, or its examples) with its image set to the one `make image`
// built (package internal/bundle), so that `make bundle IMAGE=…` deploys
// exactly that image.
//
//	mkbundle -image registry.example.com/modelcached:v1 -out bin/modelcache.yaml deploy/daemonset
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/modelcache/modelcache/internal/bundle"
)

func main() {
	image := flag.String("image", "", "the image reference make image built and the nodes pull (IMAGE)")
	out := flag.String("out", "", "where to write the bundle")
	flag.Parse()
	if *out == "" || flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: mkbundle -image REF -out FILE KUSTOMIZATION_DIR")
		os.Exit(2)
	}
	b, err := bundle.Render(flag.Arg(0), *image)
	if err == nil {
		err = os.WriteFile(*out, b, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkbundle:", err)
		os.Exit(1)
	}
}
