package sources

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// FuzzCredentialsFile: a credentials file either parses or is refused
// with an error of a fixed form (the path, the line number, one of the
// fixed messages, and the key only where it is that line's key and looks
// like a key name), and no value of any line (the text after its first
// '=' or ':', 4 bytes or more) appears in the error but as part of the
// fixed text.
func FuzzCredentialsFile(f *testing.F) {
	for _, s := range []string{
		"HF_TOKEN=hf_abc\n", "export HTTP_AUTHORIZATION=\"Bearer TOKEN\"\n", "HTTP_AUTHORIZATION: Bearer TEAM-A-TOKEN\n",
		"root:$6$SALT$hash:19000:0:99999:7:::\n", "# c\n\nPASSWORD=hunter2\n", "Bearer abc=def==\n", "ghp_0123456789\n",
		"HF_TOKEN=SECRET_PART\nSECRET_PART=1\n", "AWS_ACCESS_KEY_ID=AKIA\nAWS_SECRET_ACCESS_KEY='s3cr3t'\n", "=value\n", "HF_TOKEN:HF_TOKEN\n",
	} {
		f.Add([]byte(s))
	}
	const path = "/etc/modelcache/creds.env"
	f.Fuzz(func(t *testing.T, b []byte) {
		_, err := parseCredentials(path, b)
		if err == nil {
			return
		}
		msg := err.Error()
		lines := strings.Split(string(b), "\n")
		rest, ok := strings.CutPrefix(msg, path+" line ")
		num, body, ok2 := strings.Cut(rest, ": ")
		n, nerr := strconv.Atoi(num)
		if !ok || !ok2 || nerr != nil || n < 1 || n > len(lines) {
			t.Fatalf("error %q: want %q, a line number, then the reason", msg, path+" line N: ")
		}
		key, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimSpace(lines[n-1]), "export "), "=")
		key = strings.TrimSpace(key)
		colonKey, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimSpace(lines[n-1]), "export "), ":")
		colonKey = strings.TrimSpace(colonKey)
		skeleton := body // the body with the key it names cut out
		switch {
		case body == credNotKeyValue || body == credHiddenKey:
		case body == fmt.Sprintf(credUnknownKey, key) && plausibleKey(key) && !credentialKeys[key]:
			skeleton = strings.Replace(body, `"`+key+`"`, "\x00", 1)
		case body == fmt.Sprintf(credColonNotEquals, colonKey, colonKey) && credentialKeys[colonKey]:
			skeleton = strings.ReplaceAll(body, colonKey, "\x00")
		case body == fmt.Sprintf(credUnclosedQuote, key) && credentialKeys[key]:
			skeleton = strings.Replace(body, key, "\x00", 1)
		default:
			t.Fatalf("error %q: not one of the fixed forms for line %d", msg, n)
		}
		fixed := path + " line " + num + ": " + skeleton + "\x00" + credentialKeyList
		for _, line := range lines {
			for _, sep := range []string{"=", ":"} {
				if _, v, ok := strings.Cut(line, sep); ok {
					if v = strings.TrimSpace(v); len(v) >= 4 && strings.Contains(msg, v) && !strings.Contains(fixed, v) {
						t.Fatalf("error %q shows the value %q", msg, v)
					}
				}
			}
		}
	})
}
