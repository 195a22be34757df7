// Package s3test starts a real S3-compatible server for tests: versitygw
// (github.com/versity/versitygw) serving a temp directory on loopback.
// .ci/run installs it with go install; under CI=true a missing binary is a
// failure, elsewhere the test is skipped.
package s3test

import (
	"bytes"
	"context"
	"github.com/modelcache/modelcache/internal/testenv"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// Credentials of the test server's root user.
const (
	AccessKey = "modelcache-test"
	SecretKey = "modelcache-test-secret-key"
)

// Server is a running versitygw.
type Server struct {
	Endpoint string // http://127.0.0.1:PORT
	Client   *s3.Client
}

// Start runs versitygw until the test ends, and sets the AWS_* environment
// of the test to reach it.
func Start(t testing.TB) *Server { return start(t, false) }

// StartVersioned is Start with bucket versioning available.
func StartVersioned(t testing.TB) *Server { return start(t, true) }

func start(t testing.TB, versioning bool) *Server {
	t.Helper()
	bin := testenv.Require(t, "versitygw", "go install github.com/versity/versitygw/cmd/versitygw@v1.8.0")
	addr, err := testenv.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	args := []string{"--port", addr, "posix"}
	if versioning {
		args = append(args, "--versioning-dir", t.TempDir())
	}
	cmd := exec.Command(bin, append(args, dir)...)
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY="+AccessKey, "ROOT_SECRET_KEY="+SecretKey)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if err := testenv.WaitTCP(addr, 20*time.Second); err != nil {
		t.Fatalf("versitygw: %v", err)
	}
	ep := "http://" + addr
	for k, v := range map[string]string{"AWS_ENDPOINT_URL": ep, "AWS_ACCESS_KEY_ID": AccessKey, "AWS_SECRET_ACCESS_KEY": SecretKey,
		"AWS_REGION": "us-east-1", "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_PROFILE": ""} {
		t.Setenv(k, v)
	}
	c := s3.New(s3.Options{
		Region: "us-east-1", BaseEndpoint: aws.String(ep), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, ""),
	})
	return &Server{Endpoint: ep, Client: c}
}

// Put stores an object; withSHA256 asks the server to keep its
// x-amz-checksum-sha256.
func (s *Server) Put(t testing.TB, bucket, key string, body []byte, withSHA256 bool) {
	t.Helper()
	in := &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: bytes.NewReader(body)}
	if withSHA256 {
		in.ChecksumAlgorithm = "SHA256"
	}
	if _, err := s.Client.PutObject(context.Background(), in); err != nil {
		t.Fatalf("put s3://%s/%s: %v", bucket, key, err)
	}
}

// Bucket creates a bucket.
func (s *Server) Bucket(t testing.TB, name string) {
	t.Helper()
	if _, err := s.Client.CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(name)}); err != nil {
		t.Fatalf("create bucket %s: %v", name, err)
	}
}
