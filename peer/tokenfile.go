package peer

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcache/modelcache/fetchers"
)

// maxTokenBytes bounds a token file: a projected service-account token
// is a few KiB.
const maxTokenBytes = 64 << 10

// TokenFile is a token kept in a file that may change under the daemon
// (kubelet rotates a projected service-account token by swapping a
// symlink; an operator replaces a shared token file). Token stats the
// file on each call and reads it again only when its inode, size or
// modification time changed. Safe for concurrent use; the zero value is
// not usable: use NewTokenFile.
type TokenFile struct {
	path string
	mu   sync.Mutex
	key  fileKey
	tok  string
	err  error
}

type fileKey struct {
	ino, dev uint64
	size     int64
	mtime    time.Time
}

// NewTokenFile returns a TokenFile for path; nothing is read yet.
func NewTokenFile(path string) *TokenFile { return &TokenFile{path: path} }

// Path is the file's path.
func (t *TokenFile) Path() string { return t.path }

// Token returns the file's content without surrounding white space. An
// empty file, a file of several lines, a missing file or one that is not
// a regular file is an error naming the path (never the content).
func (t *TokenFile) Token() (string, error) {
	fi, err := os.Stat(t.path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	k := fileKey{size: fi.Size(), mtime: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		k.ino, k.dev = st.Ino, uint64(st.Dev)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if k == t.key && (t.tok != "" || t.err != nil) {
		return t.tok, t.err
	}
	t.key, t.tok, t.err = k, "", nil
	b, err := fetchers.ReadConfigFile(t.path, maxTokenBytes)
	switch tok := strings.TrimSpace(string(b)); {
	case err != nil:
		t.err = fmt.Errorf("token file: %w", err)
	case tok == "":
		t.err = fmt.Errorf("token file %s: %w", t.path, errEmptyToken)
	case strings.ContainsAny(tok, " \t\r\n"):
		t.err = fmt.Errorf("token file %s: %w", t.path, errTokenLines)
	default:
		t.tok = tok
	}
	return t.tok, t.err
}

var (
	errEmptyToken = errors.New("empty; write the token (one line) into it")
	errTokenLines = errors.New("holds white space inside the token; a token file holds one token on one line")
)
