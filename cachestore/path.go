package cachestore

import (
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"
)

// Limits on names and paths. They bound what hostile input can make the
// store create, and keep every path well under PATH_MAX.
const (
	MaxPathLen     = 1024 // bytes in a manifest path
	MaxSegmentLen  = 255  // bytes in one path segment (NAME_MAX)
	MaxPathDepth   = 64   // segments in a manifest path
	MaxNameLen     = 128  // bytes in an artifact name or revision
	MaxEntries     = 1 << 20
	currentLink    = "current"
	manifestFormat = "modelcache.manifest.v1"
)

// ValidatePath reports whether p may appear in a manifest: a relative,
// slash-separated, clean path with no empty, "." or ".." segment, no NUL or
// backslash, valid UTF-8, and within the length limits. It is the one
// place every file name from every source passes through before the store
// writes anything.
func ValidatePath(p string) error {
	bad := func(why string) error {
		return fmt.Errorf("path %q: %w: %s", p, ErrInvalidPath, why)
	}
	switch {
	case p == "":
		return bad("empty")
	case len(p) > MaxPathLen:
		return bad(fmt.Sprintf("longer than %d bytes", MaxPathLen))
	case !utf8.ValidString(p):
		return bad("not valid UTF-8")
	case strings.ContainsRune(p, 0):
		return bad("contains NUL")
	case strings.ContainsRune(p, '\\'):
		return bad("contains a backslash; use / as the separator")
	case strings.HasPrefix(p, "/"):
		return bad("absolute; paths must be relative to the artifact root")
	}
	segs := strings.Split(p, "/")
	if len(segs) > MaxPathDepth {
		return bad(fmt.Sprintf("deeper than %d segments", MaxPathDepth))
	}
	for _, s := range segs {
		switch {
		case s == "":
			return bad("empty segment (double or trailing slash)")
		case s == ".":
			return bad(`"." segment`)
		case s == "..":
			return bad(`".." segment escapes the artifact root`)
		case len(s) > MaxSegmentLen:
			return bad(fmt.Sprintf("segment longer than %d bytes", MaxSegmentLen))
		}
	}
	return nil
}

// ValidateName reports whether n may name an artifact or a revision: one
// path segment of [A-Za-z0-9._-], starting with a letter or digit, at most
// MaxNameLen bytes, and not the reserved word "current".
func ValidateName(n string) error {
	bad := func(why string) error {
		return fmt.Errorf("name %q: %w: %s", n, ErrInvalidName, why)
	}
	if n == "" {
		return bad("empty")
	}
	if len(n) > MaxNameLen {
		return bad(fmt.Sprintf("longer than %d bytes", MaxNameLen))
	}
	if n == currentLink {
		return bad(`"current" is reserved`)
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if i == 0 && !alnum {
			return bad("must start with a letter or digit")
		}
		if !alnum && c != '.' && c != '_' && c != '-' {
			return bad(fmt.Sprintf("character %q not allowed; use letters, digits, '.', '_' or '-'", c))
		}
	}
	return nil
}

// Entry is one file of an artifact version.
type Entry struct {
	Path   string `json:"path"`
	Digest string `json:"digest"`
	Size   int64  `json:"size"`
	Mode   uint32 `json:"mode"` // permission bits at the source (0644, 0755); trees are read-only
	// Etag is the source's name for the content (a hub's LFS sha256 or git
	// blob sha1): the HF cache view's blob name. Not part of the digest.
	Etag string `json:"etag,omitempty"`
	// Streamed says the source named no digest for the file: Digest is the
	// sha256 of the bytes as they streamed, checked against nothing but
	// the size (where the source gave one). Not part of the digest.
	Streamed bool `json:"streamed,omitempty"`
	// Peers are the peer daemons (base URLs) that sent bytes of the file
	// to the pull that committed the version (fan-out); none: the origin
	// sent them all, or the store held the blob already. Not part of the
	// digest: the bytes are checked alike whoever sent them.
	Peers []string `json:"peers,omitempty"`
	// Validator is the source's name for the version of the file it
	// read (fetchers.File.Validator: a file:// file's device, inode, size
	// and times; an HTTP strong ETag): a later pull of the same source
	// that sees the same validator reuses the blob instead of reading the
	// file again. Not part of the digest.
	Validator string `json:"validator,omitempty"`
	// Transport is how the source sent the file (the daemon's
	// api.File.Transport: "xet", "resolve"), opaque to the store. Not part
	// of the digest.
	Transport string `json:"transport,omitempty"`
}

// Manifest is the file list of an artifact version.
type Manifest []Entry

// Validate sorts m by path in place and checks every entry: a valid path, a
// valid digest, a non-negative size, no duplicate path, and no path that is
// a prefix directory of another (a file "a" and a file "a/b").
func (m Manifest) Validate() error {
	if len(m) > MaxEntries {
		return fmt.Errorf("manifest: %d entries, more than %d", len(m), MaxEntries)
	}
	for i := range m {
		if err := ValidatePath(m[i].Path); err != nil {
			return err
		}
		d, err := NormalizeDigest(m[i].Digest)
		if err != nil {
			return fmt.Errorf("path %q: %w", m[i].Path, err)
		}
		m[i].Digest = d
		if m[i].Size < 0 {
			return fmt.Errorf("path %q: negative size %d", m[i].Path, m[i].Size)
		}
		m[i].Mode &= 0o777
		if m[i].Mode == 0 {
			m[i].Mode = 0o644
		}
	}
	sort.Slice(m, func(i, j int) bool { return m[i].Path < m[j].Path })
	files := make(map[string]bool, len(m))
	for _, e := range m {
		if files[e.Path] {
			return fmt.Errorf("path %q: %w: duplicate entry", e.Path, ErrInvalidPath)
		}
		files[e.Path] = true
	}
	for _, e := range m {
		for dir := parentDir(e.Path); dir != ""; dir = parentDir(dir) {
			if files[dir] {
				return fmt.Errorf("path %q: %w: %q is a file and cannot also be a directory", e.Path, ErrInvalidPath, dir)
			}
		}
	}
	return nil
}

func parentDir(p string) string {
	i := strings.LastIndexByte(p, '/')
	if i < 0 {
		return ""
	}
	return p[:i]
}

// Digest returns the manifest digest: sha256 over the canonical encoding
// of the sorted manifest, one line per entry, "<path>\x00<digest>\x00<size>\n",
// after a header line naming the format. Modes are not part of it: the
// digest is the "folder checksum" of the bytes a reader sees. Call Validate
// first; Digest assumes a sorted, valid manifest.
func (m Manifest) Digest() string {
	var b strings.Builder
	b.WriteString(manifestFormat)
	b.WriteByte('\n')
	for _, e := range m {
		fmt.Fprintf(&b, "%s\x00%s\x00%d\n", e.Path, e.Digest, e.Size)
	}
	return DigestBytes([]byte(b.String()))
}

// Bytes is the sum of the entry sizes.
func (m Manifest) Bytes() int64 {
	var n int64
	for _, e := range m {
		n += e.Size
	}
	return n
}
