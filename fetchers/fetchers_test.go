package fetchers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"golang.org/x/time/rate"
	"io"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"
)

func TestGlob(t *testing.T) {
	for _, tc := range []struct {
		pat, path string
		want      bool
	}{
		{"*.safetensors", "model-00001.safetensors", true},
		{"*.safetensors", "sub/model.safetensors", true}, // fnmatch: * crosses '/'
		{"*.json", "model.safetensors", false},
		{"config.json", "config.json", true},
		{"config.json", "sub/config.json", false},
		{"onnx/", "onnx/model.onnx", true},
		{"onnx/*", "onnx/a/b", true},
		{"model-0000?.bin", "model-00001.bin", true},
		{"[!a]*", "bert", true},
		{"[!a]*", "albert", false},
		{"a.b", "axb", false}, // '.' is literal
	} {
		g, err := CompileGlob(tc.pat)
		if err != nil {
			t.Fatal(err)
		}
		if got := g.Match(tc.path); got != tc.want {
			t.Errorf("glob %q on %q = %v, want %v", tc.pat, tc.path, got, tc.want)
		}
	}
	if _, err := CompileGlob("[abc"); err == nil {
		t.Error("unclosed class accepted")
	}
}

func TestFilter(t *testing.T) {
	files := []File{{Path: "config.json"}, {Path: "model.safetensors"}, {Path: "pytorch_model.bin"}, {Path: "onnx/model.onnx"}}
	got, err := Filter(files, []string{"*.json", "*.safetensors"}, []string{"config.json"})
	if err != nil || len(got) != 1 || got[0].Path != "model.safetensors" {
		t.Fatalf("filter = %v, %v", got, err)
	}
	if _, err := Filter(files, []string{"*.gguf"}, nil); err == nil {
		t.Fatal("an include that keeps nothing must be an error")
	}
	all, _ := Filter(files, nil, nil)
	if len(all) != len(files) {
		t.Fatal("no globs must keep every file")
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if d := ParseRetryAfter("7", now); d != 7*time.Second {
		t.Errorf("seconds: %v", d)
	}
	if d := ParseRetryAfter(now.Add(90*time.Second).Format(http.TimeFormat), now); d != 90*time.Second {
		t.Errorf("http date: %v", d)
	}
	if d := ParseRetryAfter("soon", now); d != 0 {
		t.Errorf("garbage: %v", d)
	}
}

func TestBackoffHonoursRetryAfterAndPermanent(t *testing.T) {
	var waits []time.Duration
	b := Backoff{Initial: time.Second, Max: 8 * time.Second, Attempts: 5, MaxRetryAfter: time.Minute,
		Sleep: func(ctx context.Context, d time.Duration) error { waits = append(waits, d); return nil }}
	calls := 0
	err := b.Do(context.Background(), func(n int) error {
		calls++
		switch n {
		case 1:
			return &RetryAfterError{Status: 429, After: 3 * time.Second}
		case 2:
			return &RetryAfterError{Status: 503, After: time.Hour} // capped
		case 3:
			return errors.New("reset")
		}
		return nil
	}, nil)
	if err != nil || calls != 4 {
		t.Fatalf("Do = %v after %d calls", err, calls)
	}
	if waits[0] != 3*time.Second || waits[1] != time.Minute {
		t.Fatalf("waits %v: want 3s (Retry-After), 1m (capped)", waits)
	}
	if waits[2] < 2*time.Second || waits[2] > 4*time.Second {
		t.Fatalf("third wait %v: want exponential 4s with jitter in [2s,4s]", waits[2])
	}
	calls = 0
	err = b.Do(context.Background(), func(int) error { calls++; return Permanent(fmt.Errorf("404: %w", ErrNotFound)) }, nil)
	if calls != 1 || !errors.Is(err, ErrNotFound) {
		t.Fatalf("permanent error retried %d times: %v", calls, err)
	}
	calls = 0
	always := errors.New("always")
	err = b.Do(context.Background(), func(int) error { calls++; return always }, nil)
	if calls != 5 || err != always {
		t.Fatalf("attempts: %d calls, %v; want the last error as it was (the pull counts attempts)", calls, err)
	}
	// A host DNS denies is not asked again within the attempt.
	calls = 0
	nx := &url.Error{Op: "Get", URL: "https://nosuch.invalid/x", Err: &net.OpError{Op: "dial", Err: &net.DNSError{Err: "no such host", Name: "nosuch.invalid", IsNotFound: true}}}
	err = b.Do(context.Background(), func(int) error { calls++; return nx }, nil)
	if calls != 1 || !UnknownHost(err) {
		t.Fatalf("unknown host asked %d times: %v", calls, err)
	}
}

func TestScheme(t *testing.T) {
	r := Registry{"file": nil}
	if _, err := r.For("s3://bucket/x"); !errors.Is(err, ErrUnsupported) {
		t.Fatalf("unknown scheme: %v", err)
	}
	if _, err := Scheme("/just/a/path"); !errors.Is(err, ErrBadSource) {
		t.Fatalf("no scheme: %v", err)
	}
}

func TestRateLimited(t *testing.T) {
	src := bytes.NewReader(make([]byte, 1000))
	l := rate.NewLimiter(100, 100) // 100 B/s: 1000 bytes need ~9 s
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	n, err := io.Copy(io.Discard, RateLimited(ctx, src, l))
	if err == nil || n >= 1000 {
		t.Fatalf("read %d bytes past a 100 B/s limit within 200ms (err %v)", n, err)
	}
	if r := RateLimited(ctx, src, nil); r != io.Reader(src) {
		t.Fatal("a nil limiter must leave the reader alone")
	}
}
