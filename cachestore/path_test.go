package cachestore

import (
	"errors"
	"strings"
	"testing"
)

func TestValidatePath(t *testing.T) {
	for _, tc := range []struct {
		path string
		ok   bool
	}{
		{"config.json", true},
		{"a/b/c.safetensors", true},
		{"dir.with.dots/..file", true},
		{"unicodé/模型.bin", true},
		{"", false},
		{"/etc/passwd", false},
		{"../escape", false},
		{"a/../../b", false},
		{"a/..", false},
		{"./a", false},
		{"a/./b", false},
		{"a//b", false},
		{"a/", false},
		{"a\x00b", false},
		{`a\..\b`, false},
		{"\xff\xfe", false},
		{strings.Repeat("a", 256), false},
		{strings.Repeat("a/", 64) + "b", false},
		{strings.Repeat("abcdefgh/", 120), false},
	} {
		err := ValidatePath(tc.path)
		if (err == nil) != tc.ok {
			t.Errorf("ValidatePath(%q) = %v, want ok=%v", tc.path, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalidPath) {
			t.Errorf("ValidatePath(%q) = %v, not ErrInvalidPath", tc.path, err)
		}
	}
}

func TestValidateName(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"llama-3.1-8b", true},
		{"Qwen2_5", true},
		{"0abc", true},
		{"", false},
		{"current", false},
		{".hidden", false},
		{"-x", false},
		{"a/b", false},
		{"..", false},
		{"a b", false},
		{strings.Repeat("x", 129), false},
	} {
		if err := ValidateName(tc.name); (err == nil) != tc.ok {
			t.Errorf("ValidateName(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

func TestManifestValidate(t *testing.T) {
	d := DigestBytes([]byte("x"))
	for _, tc := range []struct {
		name string
		m    Manifest
		want string
	}{
		{"duplicate", Manifest{{Path: "a", Digest: d}, {Path: "a", Digest: d}}, "duplicate"},
		{"file and dir", Manifest{{Path: "a", Digest: d}, {Path: "a/b", Digest: d}}, "cannot also be a directory"},
		{"bad digest", Manifest{{Path: "a", Digest: "md5:abc"}}, "invalid digest"},
		{"negative size", Manifest{{Path: "a", Digest: d, Size: -1}}, "negative size"},
		{"escaping", Manifest{{Path: "../a", Digest: d}}, "escapes"},
	} {
		err := tc.m.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}

func TestManifestDigestCanonical(t *testing.T) {
	a := DigestBytes([]byte("a"))
	b := DigestBytes([]byte("b"))
	m1 := Manifest{{Path: "x", Digest: a, Size: 1}, {Path: "y/z", Digest: b, Size: 1, Mode: 0o755}}
	m2 := Manifest{{Path: "y/z", Digest: "sha256:" + b[7:], Size: 1}, {Path: "x", Digest: a, Size: 1}}
	if err := m1.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := m2.Validate(); err != nil {
		t.Fatal(err)
	}
	if m1.Digest() != m2.Digest() {
		t.Fatal("the manifest digest depends on entry order or mode")
	}
	// The encoding is a contract users compare against (--digest): pin it.
	// Computed independently: python3 hashlib over the documented encoding.
	const want = "sha256:4612843389063dbcbfdbd0f27d9c0aafacd3078ae9ceef2f4fdc354647e809ee"
	if got := m1.Digest(); got != want {
		t.Fatalf("manifest digest %s, want %s", got, want)
	}
	m2[0].Size = 2
	if m1.Digest() == m2.Digest() {
		t.Fatal("the manifest digest ignores sizes")
	}
}
