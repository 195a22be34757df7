package oci

import (
	"strings"
	"testing"
)

// TestDockerConfigErrorsShowNoValue: a pull secret that does not parse
// is refused without its content (the error reaches the node's status);
// encoding/json's messages name types, fields and one character, never a
// value, and this holds them to it.
func TestDockerConfigErrorsShowNoValue(t *testing.T) {
	for _, cfg := range []string{
		`{"auths":{"r.test":{"username":"u","password":12345678901}}}`,
		`{"auths":"SECRET-0123456789"}`,
		`{"auths":{"r.test":{"auth":"SECRET-0123456789!"}}}`,
		`{"auths":{"r.test":{"password":"x"}}, SECRET-0123456789}`,
		`SECRET-0123456789`,
	} {
		_, err := DockerConfigKeychain([]byte(cfg))
		if err == nil {
			t.Fatalf("%s: accepted", cfg)
		}
		if strings.Contains(err.Error(), "12345678901") || strings.Contains(err.Error(), "SECRET") {
			t.Errorf("%s: the error shows the content: %v", cfg, err)
		}
	}
}
