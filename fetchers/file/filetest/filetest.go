// Package filetest builds, for tests, the local trees that file:// must
// refuse to read.
package filetest

import (
	"os"
	"path/filepath"
	"testing"
)

// Kubelet's projected service-account volume as ProjectedVolume lays it
// out: HiddenDir is the timestamped directory no error may name, Token
// the 0600 token's content.
const (
	HiddenDir = "..2026_11_25_00_00_00.123456789"
	Token     = "eyJhbGciOi.a-pods-service-account-token"
)

// ProjectedVolume writes under pods (kubelet's pods directory) what
// kubelet writes for a pod's projected service-account token:
// <uid>/volumes/kubernetes.io~projected/<name>/ holding HiddenDir with the
// 0600 token and the namespace, ..data linking to HiddenDir, and token and
// namespace linking through ..data. It returns the volume's directory.
func ProjectedVolume(t testing.TB, pods string) string {
	t.Helper()
	vol := filepath.Join(pods, "0f1e2d3c-uid", "volumes", "kubernetes.io~projected", "kube-api-access-abcde")
	ts := filepath.Join(vol, HiddenDir)
	if err := os.MkdirAll(ts, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"token": Token, "namespace": "team-a"} {
		if err := os.WriteFile(filepath.Join(ts, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("..data/"+name, filepath.Join(vol, name)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(HiddenDir, filepath.Join(vol, "..data")); err != nil {
		t.Fatal(err)
	}
	return vol
}
