package bundle

import (
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// TestBundleDeploysTheImageBuilt: the bundle make bundle writes runs the
// image make image built, and names the Placeholder nowhere; so do the
// examples' init containers.
func TestBundleDeploysTheImageBuilt(t *testing.T) {
	const img = "registry.example.com/modelcached:0.1.0-9-gabc1234"
	b, err := Render("../../deploy/daemonset", img)
	if err != nil {
		t.Fatal(err)
	}
	y := string(b)
	if !strings.Contains(y, "image: "+img+"\n") || strings.Contains(y, Placeholder) || strings.Contains(y, requiredPrefix) {
		t.Fatalf("the bundle does not run %s only:\n%s", img, y)
	}
	for _, kind := range []string{"DaemonSet", "ValidatingAdmissionPolicy", "CustomResourceDefinition", "CSIDriver"} {
		if !strings.Contains(y, "kind: "+kind+"\n") {
			t.Fatalf("not the whole DaemonSet bundle: no %s", kind)
		}
	}
	// The PV policy whose parameters are all ModelCaches: the empty
	// selector survives the rendering (without it the binding names no
	// parameter and the API server refuses it).
	if !strings.Contains(y, "name: modelcached-persistentvolumes-public\n") || !strings.Contains(y, "  paramRef:\n    parameterNotFoundAction: Allow\n    selector: {}\n") {
		t.Fatalf("the bundle lacks the binding of modelcached-persistentvolumes-public to every ModelCache:\n%s", y)
	}
	ex, err := Render("../../deploy/daemonset/examples", img)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ex), "image: "+img+"\n") || strings.Contains(string(ex), Placeholder) {
		t.Fatalf("the examples do not run %s:\n%s", img, ex)
	}
	for _, bad := range []string{"", "modelcached latest", "modelcached", Placeholder + ":v1"} {
		if _, err := Render("../../deploy/daemonset", bad); err == nil {
			t.Errorf("IMAGE %q was taken", bad)
		} else if bad == "" && !strings.Contains(err.Error(), "make bundle IMAGE=") {
			t.Errorf("no IMAGE: %v; want the command that sets it", err)
		}
	}
	if _, err := Render("../../deploy/crds", img); err == nil || !strings.Contains(err.Error(), "no replacement") {
		t.Fatalf("a kustomization without the image: %v", err)
	}
}

// TestKustomizeRefusesWithoutImage: kubectl apply -k deploy/daemonset (and
// its examples) cannot render a bundle that runs an image nobody built: it
// fails and says how to set the image; the base an overlay starts from
// names only the Placeholder no registry serves.
func TestKustomizeRefusesWithoutImage(t *testing.T) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	for _, dir := range []string{"../../deploy/daemonset", "../../deploy/daemonset/examples"} {
		_, err := k.Run(filesys.MakeFsOnDisk(), dir)
		if err == nil || !strings.Contains(err.Error(), "the image is a required value: make bundle IMAGE=") {
			t.Errorf("kustomize build %s: %v; want a refusal naming make bundle IMAGE=", dir, err)
		}
	}
	res, err := k.Run(filesys.MakeFsOnDisk(), "../../deploy/daemonset/base")
	if err != nil {
		t.Fatal(err)
	}
	y, _ := res.AsYaml()
	if !strings.Contains(string(y), "image: "+Placeholder+"\n") || strings.Contains(string(y), "ghcr.io") {
		t.Fatalf("the base names an image other than the Placeholder:\n%s", y)
	}
}

// TestOverlaySetsTheImage: an overlay of deploy/daemonset/base (the
// real-node test's, as docs/operator.md shows) runs the image its images:
// entry names.
func TestOverlaySetsTheImage(t *testing.T) {
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), "../../test/node/overlay")
	if err != nil {
		t.Fatal(err)
	}
	y, _ := res.AsYaml()
	if !strings.Contains(string(y), "image: ghcr.io/modelcache/modelcached:node-test\n") || strings.Contains(string(y), Placeholder) {
		t.Fatalf("the overlay does not set the image:\n%s", y)
	}
}
