package main

import (
	"strings"
	"testing"
)

// TestBundleDeploysTheImageBuilt: the bundle make bundle writes runs the
// image make image built, and names the placeholder nowhere.
func TestBundleDeploysTheImageBuilt(t *testing.T) {
	const img = "registry.example.com/modelcached:0.1.0-9-gabc1234"
	b, err := bundle("../../deploy/daemonset", img)
	if err != nil {
		t.Fatal(err)
	}
	y := string(b)
	if !strings.Contains(y, "image: "+img+"\n") || strings.Contains(y, placeholder) {
		t.Fatalf("the bundle does not run %s only:\n%s", img, y)
	}
	if !strings.Contains(y, "kind: DaemonSet") || !strings.Contains(y, "kind: ValidatingAdmissionPolicy") {
		t.Fatal("not the whole DaemonSet bundle")
	}
	if _, err := bundle("../../deploy/daemonset", "modelcached latest"); err == nil {
		t.Fatal("a reference with a space was taken")
	}
	if _, err := bundle("../../deploy/crds", img); err == nil || !strings.Contains(err.Error(), "names no") {
		t.Fatalf("a kustomization without the image: %v", err)
	}
}
