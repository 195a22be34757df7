package cachestore

import "errors"

// Sentinel errors. They are wrapped with the identifier first, e.g.
// fmt.Errorf("blob %s: %w", d, ErrNotFound); test with errors.Is.
var (
	ErrNotFound       = errors.New("not found")
	ErrDigestMismatch = errors.New("digest mismatch")
	ErrSizeMismatch   = errors.New("size mismatch")
	ErrInvalidPath    = errors.New("invalid path")
	ErrInvalidName    = errors.New("invalid name")
	ErrInvalidDigest  = errors.New("invalid digest")
	ErrPinned         = errors.New("pinned")
	ErrLocked         = errors.New("in use by another writer")
	// ErrInvalidXet: a Xet chunk term out of bounds (a xorb hash that is
	// not 64 lowercase hex, a chunk range or length too large, bytes
	// beyond the blob).
	ErrInvalidXet   = errors.New("invalid xet term")
	ErrSchemaTooNew = errors.New("index schema is newer than this binary supports")
	// ErrIndexDamaged: index.db cannot be read safely (truncated, garbled,
	// or failing bbolt's consistency check). The message says what to do.
	ErrIndexDamaged = errors.New("index damaged")
)
