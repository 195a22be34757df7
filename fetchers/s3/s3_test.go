package s3

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/fetchers/s3/s3test"
	"github.com/modelcache/modelcache/internal/testenv"
)

func TestParseURI(t *testing.T) {
	for _, tc := range []struct {
		uri, bucket, prefix string
		ok                  bool
	}{
		{"s3://models/llama/3", "models", "llama/3", true},
		{"s3://models", "models", "", true},
		{"s3:///x", "", "", false},
		{"s3://b/a/../../x", "", "", false},
		{"http://b/x", "", "", false},
	} {
		b, p, err := ParseURI(tc.uri)
		if (err == nil) != tc.ok || b != tc.bucket || p != tc.prefix {
			t.Errorf("ParseURI(%q) = %q %q %v", tc.uri, b, p, err)
		}
	}
}

func TestAgainstARealS3Server(t *testing.T) {
	srv := s3test.Start(t)
	srv.Bucket(t, "models")
	big := bytes.Repeat([]byte("0123456789abcdef"), 5<<16) // 5 MiB: parallel ranges of 1 MiB
	srv.Put(t, "models", "llama/config.json", []byte(`{"model_type":"llama"}`), false)
	srv.Put(t, "models", "llama/w.safetensors", big, true)
	srv.Put(t, "models", "llama/sub/tok.json", []byte(`{}`), false)
	srv.Put(t, "models", "llama2/other.bin", []byte("not ours"), false)
	srv.Put(t, "models", "llama/", nil, false) // a directory marker

	f := mustNew(t, WithHTTP(fetchers.WithConnections(3), fetchers.WithChunk(1<<20)))
	res, err := f.Resolve(context.Background(), fetchers.Source{URI: "s3://models/llama"})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]fetchers.File{}
	for _, fl := range res.Files {
		got[fl.Path] = fl
	}
	if len(got) != 3 || got["w.safetensors"].Size != int64(len(big)) || !strings.HasPrefix(res.Revision, "s3-") {
		t.Fatalf("resolve: %+v", res)
	}
	if fl := got["config.json"]; fl.Check == nil || fl.Digest != "" {
		t.Fatalf("a single-part object without a sha256 checksum must be checked by its ETag MD5: %+v", fl)
	}
	t.Logf("w.safetensors digest from x-amz-checksum-sha256: %q", got["w.safetensors"].Digest)
	rc, err := f.Open(context.Background(), got["w.safetensors"], 1000)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(b, big[1000:]) {
		t.Fatal("ranged read differs")
	}
	if err := got["config.json"].Check(strings.NewReader(`{"model_type":"evil"}`)); err == nil {
		t.Fatal("the ETag MD5 check passed wrong bytes")
	}

	// A changed object is a new revision.
	srv.Put(t, "models", "llama/config.json", []byte(`{"model_type":"llama","v":2}`), false)
	res2, err := f.Resolve(context.Background(), fetchers.Source{URI: "s3://models/llama"})
	if err != nil || res2.Revision == res.Revision {
		t.Fatalf("revision after a change: %v %v", res2.Revision, err)
	}
	// The object changed after the listing: Open refuses the new bytes.
	if rc, err := f.Open(context.Background(), got["config.json"], 0); err == nil {
		b, _ := io.ReadAll(rc)
		t.Fatalf("read %q from an object that changed since the listing", b)
	}

	// A multipart object: its ETag "<hex>-N" is recognised, not taken for an MD5.
	mp, err := srv.Client.CreateMultipartUpload(context.Background(), &s3.CreateMultipartUploadInput{Bucket: aws.String("models"), Key: aws.String("mp/w.bin")})
	if err != nil {
		t.Fatal(err)
	}
	part := bytes.Repeat([]byte{7}, 5<<20)
	var parts []types.CompletedPart
	for i := int32(1); i <= 2; i++ {
		up, err := srv.Client.UploadPart(context.Background(), &s3.UploadPartInput{Bucket: aws.String("models"), Key: aws.String("mp/w.bin"), UploadId: mp.UploadId, PartNumber: aws.Int32(i), Body: bytes.NewReader(part)})
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, types.CompletedPart{ETag: up.ETag, PartNumber: aws.Int32(i)})
	}
	if _, err := srv.Client.CompleteMultipartUpload(context.Background(), &s3.CompleteMultipartUploadInput{Bucket: aws.String("models"), Key: aws.String("mp/w.bin"), UploadId: mp.UploadId, MultipartUpload: &types.CompletedMultipartUpload{Parts: parts}}); err != nil {
		t.Fatal(err)
	}
	mres, err := f.Resolve(context.Background(), fetchers.Source{URI: "s3://models/mp/"})
	if err != nil || len(mres.Files) != 1 || mres.Files[0].Check != nil || !strings.HasSuffix(mres.Files[0].Etag, "-2") {
		t.Fatalf("multipart: %+v %v", mres, err)
	}

	// Errors name the bucket and key.
	if _, err := f.Resolve(context.Background(), fetchers.Source{URI: "s3://nosuchbucket/x"}); !errors.Is(err, fetchers.ErrNotFound) || !strings.Contains(err.Error(), "nosuchbucket") {
		t.Fatalf("no such bucket: %v", err)
	}
	if _, err := f.Resolve(context.Background(), fetchers.Source{URI: "s3://models/absent/"}); !errors.Is(err, fetchers.ErrNotFound) {
		t.Fatalf("empty prefix: %v", err)
	}
	t.Setenv("AWS_SECRET_ACCESS_KEY", "wrong")
	if _, err := mustNew(t, WithHTTP(fetchers.WithConnections(1))).Resolve(context.Background(), fetchers.Source{URI: "s3://models/llama"}); !errors.Is(err, fetchers.ErrUnauthorized) {
		t.Fatalf("wrong secret: %v", err)
	}
}

// TestVersionedBucketPinsTheVersion: on a versioned bucket the listing
// records version ids, and a read after the object was overwritten still
// returns the version that was resolved.
func TestVersionedBucketPinsTheVersion(t *testing.T) {
	srv := s3test.StartVersioned(t)
	srv.Bucket(t, "versioned")
	if _, err := srv.Client.PutBucketVersioning(context.Background(), &s3.PutBucketVersioningInput{Bucket: aws.String("versioned"),
		VersioningConfiguration: &types.VersioningConfiguration{Status: types.BucketVersioningStatusEnabled}}); err != nil {
		t.Fatal(err)
	}
	srv.Put(t, "versioned", "m/w.bin", []byte("version one"), true)
	f := mustNew(t, WithHTTP(fetchers.WithConnections(1)))
	res, err := f.Resolve(context.Background(), fetchers.Source{URI: "s3://versioned/m/"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(res.Files[0].Locator, "v=") || strings.Contains(res.Files[0].Locator, "v=&") {
		t.Fatalf("no version id recorded: %s", res.Files[0].Locator)
	}
	srv.Put(t, "versioned", "m/w.bin", []byte("version two!"), true)
	rc, err := f.Open(context.Background(), res.Files[0], 0)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "version one" {
		t.Fatalf("read %q; the resolved version is pinned", b)
	}
	res2, _ := f.Resolve(context.Background(), fetchers.Source{URI: "s3://versioned/m/"})
	if res2.Revision == res.Revision {
		t.Fatal("a new object version must be a new revision")
	}
}

// TestRedirectToInternalRefused: an endpoint (127.0.0.2 stands in for a
// remote one) that answers 307 to an address of this node is not
// followed; the SDK's own policy (307 and 308 only) stays.
func TestRedirectToInternalRefused(t *testing.T) {
	var asked atomic.Int64
	inside := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { asked.Add(1) }))
	defer inside.Close()
	ep := testenv.ServeOn(t, "127.0.0.2", http.RedirectHandler(inside.URL+"/models", http.StatusTemporaryRedirect))
	for k, v := range map[string]string{"AWS_ENDPOINT_URL": ep.URL, "AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret",
		"AWS_REGION": "us-east-1", "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_PROFILE": "",
		"AWS_EC2_METADATA_DISABLED": "true", "AWS_MAX_ATTEMPTS": "1"} {
		t.Setenv(k, v)
	}
	remote := func(ip netip.Addr) bool { return ip != netip.MustParseAddr("127.0.0.2") && fetchers.IsInternal(ip) }
	f := mustNew(t, WithHTTP(fetchers.WithConnections(1), fetchers.WithChunk(1<<20), fetchers.WithInternal(remote)))
	_, err := f.Resolve(context.Background(), fetchers.Source{URI: "s3://models/llama"})
	if !errors.Is(err, fetchers.ErrInternalAddress) || !strings.Contains(err.Error(), "refused") {
		t.Fatalf("Resolve through a 307 to loopback: %v; want the redirect refused", err)
	}
	if n := asked.Load(); n != 0 {
		t.Fatalf("the internal server was asked %d times", n)
	}
}

// mustNew is New that fails the test on an error.
func mustNew(t *testing.T, opts ...Option) *Fetcher {
	t.Helper()
	f, err := New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	return f
}
