package s3

import (
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/fetchers/fetcherstest"
	"github.com/modelcache/modelcache/internal/testenv"
)

// TestCredentialsStayAtTheEndpoint: an endpoint that answers every
// request with a 307 to another origin (another host, 127.0.0.2, or
// another port of its own) gets the signed requests (Authorization and
// the session token); the other origin gets the same requests unsigned.
func TestCredentialsStayAtTheEndpoint(t *testing.T) {
	const body = "weights"
	const session = "SESSION-TOKEN-0123456789"
	for _, ip := range []string{"127.0.0.2", "127.0.0.1"} {
		t.Run("to "+ip, func(t *testing.T) {
			other := testenv.ServeOrigin(t, ip, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("ETag", `"0123456789abcdef0123456789abcdef"`)
				switch {
				case r.URL.Query().Get("list-type") == "2":
					w.Header().Set("Content-Type", "application/xml")
					fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>models</Name><Prefix>llama</Prefix><KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated><Contents><Key>llama/w.bin</Key><Size>%d</Size></Contents></ListBucketResult>`, len(body))
				case r.URL.Path == "/models/llama/w.bin":
					w.Header().Set("Content-Length", fmt.Sprint(len(body)))
					if r.Method == http.MethodGet {
						io.WriteString(w, body)
					}
				default:
					http.NotFound(w, r)
				}
			}))
			ep := testenv.ServeOrigin(t, "127.0.0.1", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, other.URL+r.URL.RequestURI(), http.StatusTemporaryRedirect)
			}))
			for k, v := range map[string]string{"AWS_ENDPOINT_URL": ep.URL, "AWS_REGION": "us-east-1", "AWS_CONFIG_FILE": "/nonexistent",
				"AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_PROFILE": "", "AWS_EC2_METADATA_DISABLED": "true", "AWS_MAX_ATTEMPTS": "1"} {
				t.Setenv(k, v)
			}
			f := mustNew(t, WithHTTP(fetchers.WithConnections(1), fetchers.WithChunk(1<<20)), WithStaticCredentials("AKIDEXAMPLE", "SECRET-KEY-0123456789", session))
			fetcherstest.FetchFirst(t, f, "s3://models/llama", []byte(body))
			if !ep.Saw("/models/llama/w.bin Authorization=AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/") || !ep.Saw("X-Amz-Security-Token="+session) {
				t.Fatalf("the endpoint had no signed request: %q", ep.Seen())
			}
			if !other.Saw("/models/llama/w.bin") || other.Saw("Authorization") || other.Saw(session) {
				t.Fatalf("the other origin at %s saw %q; want the requests unsigned", other.URL, other.Seen())
			}
		})
	}
}
