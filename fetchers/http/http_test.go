package http

import (
	"bytes"
	"context"
	"errors"
	"io"
	nethttp "net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/modelcache/modelcache/fetchers"
)

func TestParseURI(t *testing.T) {
	hex := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		uri, name, digest string
		ok                bool
	}{
		{"https://h/m/model.bin#sha256=" + hex, "model.bin", "sha256:" + hex, true},
		{"http://h/a/b.json", "b.json", "", true},
		{"https://h/", "", "", false},
		{"https://h/x#md5=abc", "", "", false},
		{"https://h/x#sha256=abc", "", "", false},
		{"ftp://h/x", "", "", false},
	} {
		_, name, d, err := ParseURI(tc.uri)
		if (err == nil) != tc.ok || name != tc.name || d != tc.digest {
			t.Errorf("ParseURI(%q) = %q %q %v", tc.uri, name, d, err)
		}
		if err != nil && !errors.Is(err, fetchers.ErrBadSource) {
			t.Errorf("ParseURI(%q): %v is not ErrBadSource", tc.uri, err)
		}
	}
}

func TestResolveAndRangeResume(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789"), 1000)
	var ranges []string
	srv := httptest.NewServer(nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		ranges = append(ranges, r.Header.Get("Range"))
		nethttp.ServeContent(w, r, "m.bin", time.Time{}, bytes.NewReader(body))
	}))
	defer srv.Close()
	f := New()
	res, err := f.Resolve(context.Background(), fetchers.Source{URI: srv.URL + "/m.bin"})
	if err != nil || len(res.Files) != 1 || res.Files[0].Size != int64(len(body)) || res.Revision != "" {
		t.Fatalf("resolve: %+v %v", res, err)
	}
	rc, err := f.Open(context.Background(), res.Files[0], 4321)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(got, body[4321:]) {
		t.Fatal("ranged read returned the wrong bytes")
	}
	if ranges[len(ranges)-1] != "bytes=4321-" {
		t.Fatalf("range header %q", ranges[len(ranges)-1])
	}
}

func TestServerIgnoringRange(t *testing.T) {
	body := []byte("abcdefghijklmnopqrstuvwxyz")
	srv := httptest.NewServer(nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		w.Write(body) // 200 whatever the Range
	}))
	defer srv.Close()
	f := New()
	rc, err := f.Open(context.Background(), fetchers.File{Locator: srv.URL + "/x", Size: int64(len(body))}, 10)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	if string(got) != string(body[10:]) {
		t.Fatalf("got %q", got)
	}
}

func TestStatusErrors(t *testing.T) {
	srv := httptest.NewServer(nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		switch r.URL.Path {
		case "/busy":
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(nethttp.StatusTooManyRequests)
		case "/gone":
			w.WriteHeader(nethttp.StatusNotFound)
		case "/private":
			w.WriteHeader(nethttp.StatusForbidden)
		case "/boom":
			w.WriteHeader(nethttp.StatusBadGateway)
		}
	}))
	defer srv.Close()
	f := New()
	open := func(p string) error {
		_, err := f.Open(context.Background(), fetchers.File{Locator: srv.URL + p, Size: -1}, 0)
		return err
	}
	var ra *fetchers.RetryAfterError
	if err := open("/busy"); !errors.As(err, &ra) || ra.After != 2*time.Second || fetchers.IsPermanent(err) {
		t.Errorf("429: %v", err)
	}
	if err := open("/gone"); !errors.Is(err, fetchers.ErrNotFound) || !fetchers.IsPermanent(err) {
		t.Errorf("404: %v", err)
	}
	if err := open("/private"); !errors.Is(err, fetchers.ErrUnauthorized) || !fetchers.IsPermanent(err) {
		t.Errorf("403: %v", err)
	}
	if err := open("/boom"); err == nil || fetchers.IsPermanent(err) {
		t.Errorf("502 must be retryable: %v", err)
	}
	if _, err := f.Resolve(context.Background(), fetchers.Source{URI: srv.URL + "/gone"}); !errors.Is(err, fetchers.ErrNotFound) {
		t.Errorf("resolve 404: %v", err)
	}
}

func TestIdleTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		w.Header().Set("Content-Length", "100")
		w.Write([]byte("0123456789"))
		w.(nethttp.Flusher).Flush()
		<-release // drip nothing more
	}))
	defer srv.Close()
	defer close(release)
	f := New(WithIdleTimeout(100 * time.Millisecond))
	rc, err := f.Open(context.Background(), fetchers.File{Locator: srv.URL + "/slow", Size: 100}, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	_, err = io.ReadAll(rc)
	if !errors.Is(err, fetchers.ErrIdle) {
		t.Fatalf("slow drip: %v, want ErrIdle", err)
	}
}
