package cachestore

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
)

// DigestPrefix is the only algorithm the store addresses content by.
const DigestPrefix = "sha256:"

// ParseDigest checks that d is "sha256:" followed by 64 lowercase hex
// characters and returns the hex part. A bare 64-hex string is accepted too
// and returned unchanged, so users may paste either form.
func ParseDigest(d string) (string, error) {
	h := strings.TrimPrefix(d, DigestPrefix)
	if len(h) != 64 {
		return "", fmt.Errorf("%q: %w: want sha256:<64 hex>", d, ErrInvalidDigest)
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return "", fmt.Errorf("%q: %w: want sha256:<64 lowercase hex>", d, ErrInvalidDigest)
		}
	}
	return h, nil
}

// NormalizeDigest returns d in its canonical "sha256:<hex>" form.
func NormalizeDigest(d string) (string, error) {
	h, err := ParseDigest(d)
	if err != nil {
		return "", err
	}
	return DigestPrefix + h, nil
}

// DigestBytes returns the canonical digest of b.
func DigestBytes(b []byte) string {
	sum := sha256.Sum256(b)
	return DigestPrefix + hex.EncodeToString(sum[:])
}
