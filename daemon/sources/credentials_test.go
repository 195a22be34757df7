package sources

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCredentialsFileErrorsShowNoValue: a credentials file that does not
// parse is refused with its path, the line number and, where it looks
// like one, the key; never the line's value nor a line that is not
// KEY=VALUE (on main the line was quoted whole, and the error reaches
// modelctl list, the log and the node's status).
func TestCredentialsFileErrorsShowNoValue(t *testing.T) {
	for _, tc := range []struct {
		content, want string
		secrets       []string
	}{
		{"HF_TOKEN=ok\nHTTP_AUTHORIZATION: Bearer TEAM-A-TOKEN-0123456789\n", "line 2: HTTP_AUTHORIZATION followed by ':'", []string{"TEAM-A-TOKEN", "Bearer"}},
		{"root:$6$SALTSALT$hashhashhash:19000:0:99999:7:::\n", "line 1: not KEY=VALUE", []string{"root", "SALTSALT", "hashhash", "19000"}},
		{"ghp_0123456789abcdefghij\n", "line 1: not KEY=VALUE", []string{"ghp_0123456789abcdefghij"}},
		{"# comment\n\nPASSWORD=hunter2\n", `line 3: unknown key "PASSWORD"`, []string{"hunter2"}},
		{"Bearer TEAM-A-TOKEN-abc=def==\n", "line 1: the text before '=' is not a known key", []string{"TEAM-A-TOKEN", "Bearer"}},
		{"JBSWY3DPEHPK3PXP=\n", "line 1: the text before '=' is not a known key", []string{"JBSWY3DPEHPK3PXP"}},
		{"HF_TOKEN=SECRET_PART_OF_IT\nSECRET_PART=1\n", "line 2: the text before '=' is not a known key", []string{"SECRET_PART"}},
		{"hf_token=abcdefgh\n", "line 1: the text before '=' is not a known key", []string{"abcdefgh"}},
		{"export HTTP_AUTHORIZATION=\"Bearer SECRET123\n", "line 1: HTTP_AUTHORIZATION: the value's opening quote is not closed", []string{"SECRET123", "Bearer"}},
		{"HF_TOKEN='\n", "line 1: HF_TOKEN: the value's opening quote is not closed", nil},
	} {
		p := filepath.Join(t.TempDir(), "team-a.env")
		if err := os.WriteFile(p, []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := ReadCredentialsFile(p)
		if err == nil {
			t.Fatalf("%q: accepted", tc.content)
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, p+" ") || !strings.Contains(msg, tc.want) {
			t.Errorf("%q: error %q; want the path and %q", tc.content, msg, tc.want)
		}
		for _, s := range tc.secrets {
			if strings.Contains(msg, s) {
				t.Errorf("%q: the error shows %q: %s", tc.content, s, msg)
			}
		}
	}
}
