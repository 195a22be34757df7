package sources

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/fetchers/hf"
)

// credentialKeys are the keys a credentials file (and a ModelCache's
// Secret) may hold.
var credentialKeys = map[string]bool{
	"HF_TOKEN": true, "AWS_ACCESS_KEY_ID": true, "AWS_SECRET_ACCESS_KEY": true, "AWS_SESSION_TOKEN": true, "HTTP_AUTHORIZATION": true,
	"NGC_API_KEY": true,
}

// Ambient names the credentials the daemon's own environment holds, one
// name per source kind (never a value): HF_TOKEN (the variable or the
// hub's token file), NGC_API_KEY (or NGC_CLI_API_KEY, NGC_API_KEY_FILE),
// AWS_ACCESS_KEY_ID (or AWS_PROFILE, AWS_WEB_IDENTITY_TOKEN_FILE).
func Ambient() []string {
	var out []string
	if hf.HasToken() {
		out = append(out, "HF_TOKEN")
	}
	set := func(keys ...string) bool {
		for _, k := range keys {
			if os.Getenv(k) != "" {
				return true
			}
		}
		return false
	}
	if set("NGC_API_KEY", "NGC_CLI_API_KEY", "NGC_API_KEY_FILE") {
		out = append(out, "NGC_API_KEY")
	}
	if set("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE") {
		out = append(out, "AWS_ACCESS_KEY_ID")
	}
	return out
}

// ReadCredentialsFile reads a models.d desire's credentialsFile: KEY=VALUE
// lines (blank lines, # comments, an "export " prefix and quotes allowed),
// a regular file of at most 64 KiB. Errors are parseCredentials'.
func ReadCredentialsFile(path string) (map[string]string, error) {
	b, err := fetchers.ReadConfigFile(path, 64<<10)
	if err != nil {
		return nil, err
	}
	return parseCredentials(path, b)
}

// Why a credentials line is refused. The messages are fixed text: an
// error names the file, the line number and, only where it looks like a
// key name, the key; never a value nor the line (errors reach modelctl
// list, the log and the node's status, which every local user reads).
var (
	credentialKeyList  = strings.Join(slices.Sorted(maps.Keys(credentialKeys)), ", ")
	credWant           = "want KEY=VALUE with KEY one of " + credentialKeyList
	credNotKeyValue    = "not KEY=VALUE (the line is not shown: it may hold a secret); " + credWant
	credHiddenKey      = "the text before '=' is not a known key (not shown: it may be a secret); " + credWant
	credUnknownKey     = "unknown key %q; " + credWant
	credColonNotEquals = "%s followed by ':'; write %s=<value> (the value is not shown)"
	credUnclosedQuote  = "%s: the value's opening quote is not closed (the value is not shown)"
)

// plausibleKey reports whether s looks like the name of a key rather
// than a value: an upper-case identifier (letters, digits, underscores;
// a letter first) of at most 64 characters, with an underscore if it has
// digits (an upper-case token such as a base32 secret has digits and no
// underscore).
func plausibleKey(s string) bool {
	if s == "" || len(s) > 64 || s[0] < 'A' || s[0] > 'Z' {
		return false
	}
	digits := false
	for _, c := range []byte(s) {
		switch {
		case c >= 'A' && c <= 'Z', c == '_':
		case c >= '0' && c <= '9':
			digits = true
		default:
			return false
		}
	}
	return !digits || strings.Contains(s, "_")
}

// isValueIn reports whether k overlaps a value of the file b (the text
// after the first '=' or ':' of any line): k is in the value, or a value
// of at least 4 bytes is in k. Such a k is not shown even when it looks
// like a key name.
func isValueIn(k string, b []byte) bool {
	for _, line := range strings.Split(string(b), "\n") {
		for _, sep := range "=:" {
			if _, v, ok := strings.Cut(line, string(sep)); ok {
				if v = strings.TrimSpace(v); strings.Contains(v, k) || (len(v) >= 4 && strings.Contains(k, v)) {
					return true
				}
			}
		}
	}
	return false
}

// parseCredentials parses the content of the credentials file at path
// (see ReadCredentialsFile). An error names path, the line number and,
// when it is a plausible key name (plausibleKey) that is no part of a
// value, the key; never a value nor a line that does not parse.
func parseCredentials(path string, b []byte) (map[string]string, error) {
	out := map[string]string{}
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		rest := strings.TrimPrefix(line, "export ")
		if j := strings.IndexAny(rest, "=:"); j >= 0 && rest[j] == ':' && credentialKeys[strings.TrimSpace(rest[:j])] {
			k := strings.TrimSpace(rest[:j])
			return nil, fmt.Errorf("%s line %d: "+credColonNotEquals, path, i+1, k, k)
		}
		k, v, ok := strings.Cut(rest, "=")
		k = strings.TrimSpace(k)
		switch {
		case !ok:
			return nil, fmt.Errorf("%s line %d: %s", path, i+1, credNotKeyValue)
		case credentialKeys[k]:
		case plausibleKey(k) && !isValueIn(k, b):
			return nil, fmt.Errorf("%s line %d: "+credUnknownKey, path, i+1, k)
		default:
			return nil, fmt.Errorf("%s line %d: %s", path, i+1, credHiddenKey)
		}
		v = strings.TrimSpace(v)
		if v != "" && (v[0] == '"' || v[0] == '\'') {
			if len(v) < 2 || v[len(v)-1] != v[0] {
				return nil, fmt.Errorf("%s line %d: "+credUnclosedQuote, path, i+1, k)
			}
			v = v[1 : len(v)-1]
		}
		out[k] = v
	}
	return out, nil
}
