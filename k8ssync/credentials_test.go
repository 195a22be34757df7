package k8ssync

import (
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestCredentialsOfTheDaemonsNamespace: a Secret of the daemon's
// namespace is used as named, and what it fetches may be mounted by that
// namespace and the ModelCache's allowedNamespaces (deduplicated); no
// secretRef is no credentials (public); spec.public opens what the
// daemon namespace's Secret fetches; a Secret of another namespace
// without the grants listed is refused, naming the migration.
func TestCredentialsOfTheDaemonsNamespace(t *testing.T) {
	s := &Syncer{cfg: Config{Namespace: "modelcache-system"}}
	mc := &ModelCache{ObjectMeta: metav1.ObjectMeta{Name: "m"}, Spec: ModelCacheSpec{Source: "hf://org/m",
		SecretRef: &SecretRef{Namespace: "modelcache-system", Name: "hf"}, AllowedNamespaces: []string{"ml", "", "ml", "eval"}}}
	u, ok := s.credentialsOf(mc)
	if !ok || u.refused != "" || u.key() != "modelcache-system/hf" || !slices.Equal(u.allowed, []string{"eval", "ml", "modelcache-system"}) {
		t.Fatalf("%+v %v", u, ok)
	}
	// spec.public: the operator's own Secret, and the artifacts public.
	mc.Spec.Public = true
	if u, ok := s.credentialsOf(mc); !ok || u.refused != "" || u.key() != "modelcache-system/hf" || u.allowed != nil {
		t.Fatalf("spec.public with the daemon namespace's Secret: %+v %v; want it used and no allow-list", u, ok)
	}
	// spec.public lends nothing to another namespace's Secret: without a grant it is refused as before.
	mc.Spec.SecretRef = &SecretRef{Namespace: "team-a", Name: "hf"}
	if u, _ := s.credentialsOf(mc); u.allowed != nil || u.refused == "" {
		t.Fatalf("spec.public with another namespace's Secret: %+v", u)
	}
	mc.Spec.Public = false
	mc.Spec.SecretRef = nil
	if u, ok := s.credentialsOf(mc); ok || u.allowed != nil {
		t.Fatalf("no secretRef: %+v %v", u, ok)
	}
	mc.Spec.SecretRef = &SecretRef{Namespace: "team-a", Name: "hf"}
	u, ok = s.credentialsOf(mc)
	if !ok || u.allowed != nil || !strings.Contains(u.refused, "create one there with modelCache: m, secretName: hf, sources: [hf://org/m]") {
		t.Fatalf("another namespace's Secret: %+v %v", u, ok)
	}
}

// TestUngrantedSources: a grant admits a source as written or pinned at a
// revision of it, nothing else.
func TestUngrantedSources(t *testing.T) {
	commit := strings.Repeat("a", 40)
	granted := []string{"hf://team-a/m", "oci://registry.example.com/k/m:sm90"}
	for _, c := range []struct {
		src  string
		want bool
	}{
		{"hf://team-a/m", true},
		{"hf://team-a/m@" + commit, true},
		{"hf://team-a/other", false},
		{"hf://attacker/m@" + commit, false},
		{"https://attacker.example/steal.bin", false},
		{"oci://registry.example.com/k/m@sha256:" + strings.Repeat("b", 64), true},
		{"oci://evil.example.com/k/m@sha256:" + strings.Repeat("b", 64), false},
	} {
		if got := len(ungranted(granted, []string{c.src})) == 0; got != c.want {
			t.Errorf("%s: granted %v, want %v", c.src, got, c.want)
		}
	}
}
