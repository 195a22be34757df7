package http

import (
	"bytes"
	"context"
	"errors"
	"io"
	nethttp "net/http"
	"net/http/httptest"
	"strings"
	"sync"
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
	var ranges, ifRanges []string
	mod := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	srv := httptest.NewServer(nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		ranges = append(ranges, r.Header.Get("Range"))
		ifRanges = append(ifRanges, r.Header.Get("If-Range"))
		nethttp.ServeContent(w, r, "m.bin", mod, bytes.NewReader(body))
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
	if ranges[len(ranges)-1] != "bytes=4321-" || ifRanges[len(ifRanges)-1] != mod.Format(nethttp.TimeFormat) {
		t.Fatalf("range header %q, If-Range %q", ranges[len(ranges)-1], ifRanges[len(ifRanges)-1])
	}
}

func TestServerIgnoringRange(t *testing.T) {
	body := []byte("abcdefghijklmnopqrstuvwxyz")
	srv := httptest.NewServer(nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		w.Write(body) // 200 whatever the Range
	}))
	defer srv.Close()
	f := New()
	// With a digest to guard the result, the skipped prefix is checked at commit.
	rc, err := f.Open(context.Background(), fetchers.File{Locator: srv.URL + "/x", Size: int64(len(body)), Digest: "sha256:" + strings.Repeat("0", 64)}, 10)
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
	f := New(WithHTTP(fetchers.WithIdleTimeout(100 * time.Millisecond)))
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

// versioned serves one file whose content and validator the test switches,
// as a server does when the file is replaced between two requests.
type versioned struct {
	mu       sync.Mutex
	body     []byte
	etag     string // set as ETag when not empty
	modified time.Time
	ifRange  []string
}

func (v *versioned) set(body []byte, etag string, modified time.Time) {
	v.mu.Lock()
	v.body, v.etag, v.modified = body, etag, modified
	v.mu.Unlock()
}

func (v *versioned) ServeHTTP(w nethttp.ResponseWriter, r *nethttp.Request) {
	v.mu.Lock()
	body, etag, mod := v.body, v.etag, v.modified
	v.ifRange = append(v.ifRange, r.Header.Get("If-Range"))
	v.mu.Unlock()
	if etag != "" {
		w.Header().Set("ETag", etag)
	}
	nethttp.ServeContent(w, r, "m.bin", mod, bytes.NewReader(body))
}

func TestResolveRecordsValidator(t *testing.T) {
	mod := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		etag string
		mod  time.Time
		want string
	}{
		{`"v0"`, mod, `"v0"`},                           // a strong ETag wins
		{`W/"v0"`, mod, mod.Format(nethttp.TimeFormat)}, // a weak one is no range validator
		{"", mod, mod.Format(nethttp.TimeFormat)},
		{"", time.Time{}, ""},
	} {
		v := &versioned{}
		v.set([]byte("0123456789"), tc.etag, tc.mod)
		srv := httptest.NewServer(v)
		res, err := New().Resolve(context.Background(), fetchers.Source{URI: srv.URL + "/m.bin"})
		srv.Close()
		if err != nil {
			t.Fatal(err)
		}
		if got := res.Files[0].Validator; got != tc.want || res.Files[0].Etag != tc.want {
			t.Errorf("ETag %q Last-Modified %v: validator %q etag %q, want %q", tc.etag, tc.mod, got, res.Files[0].Etag, tc.want)
		}
	}
}

// A resume names the resolved version with If-Range; when the server has
// another version by then, Open says the offset is no longer valid rather
// than continuing the new version's bytes after the old one's.
func TestResumeAgainstChangedFile(t *testing.T) {
	v0, v1 := bytes.Repeat([]byte("a"), 10000), bytes.Repeat([]byte("b"), 10000)
	mod0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	mod1 := mod0.Add(time.Hour)
	for _, tc := range []struct {
		name       string
		etag0, et1 string
	}{
		{"etag", `"v0"`, `"v1"`},
		{"last-modified", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &versioned{}
			v.set(v0, tc.etag0, mod0)
			srv := httptest.NewServer(v)
			defer srv.Close()
			f := New()
			res, err := f.Resolve(context.Background(), fetchers.Source{URI: srv.URL + "/m.bin"})
			if err != nil || res.Files[0].Validator == "" {
				t.Fatalf("resolve: %+v %v", res, err)
			}
			fl := res.Files[0]
			// Same version: a 206 from the offset, asked with If-Range.
			rc, err := f.Open(context.Background(), fl, 4000)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(rc)
			rc.Close()
			if !bytes.Equal(got, v0[4000:]) {
				t.Fatal("resume of an unchanged file returned the wrong bytes")
			}
			if last := v.ifRange[len(v.ifRange)-1]; last != fl.Validator {
				t.Fatalf("If-Range %q, want the resolved validator %q", last, fl.Validator)
			}
			// The file changes: the same resume must not hand out v1's tail.
			v.set(v1, tc.et1, mod1)
			rc, err = f.Open(context.Background(), fl, 4000)
			if err == nil {
				got, _ := io.ReadAll(rc)
				rc.Close()
				t.Fatalf("resume after the file changed returned %d bytes (%q...) instead of ErrCannotResume", len(got), got[:min(8, len(got))])
			}
			if !errors.Is(err, fetchers.ErrCannotResume) || fetchers.IsPermanent(err) {
				t.Fatalf("resume after the file changed: %v, want a non-permanent ErrCannotResume", err)
			}
			// From byte 0 the new version is whole.
			rc, err = f.Open(context.Background(), fl, 0)
			if err != nil {
				t.Fatal(err)
			}
			got, _ = io.ReadAll(rc)
			rc.Close()
			if !bytes.Equal(got, v1) {
				t.Fatal("a read from 0 after the change is not the new version")
			}
		})
	}
}

func TestResumeWithoutValidatorOrDigest(t *testing.T) {
	v := &versioned{}
	v.set([]byte("0123456789"), "", time.Time{})
	srv := httptest.NewServer(v)
	defer srv.Close()
	f := New()
	fl := fetchers.File{Locator: srv.URL + "/m.bin", Size: 10}
	if _, err := f.Open(context.Background(), fl, 4); !errors.Is(err, fetchers.ErrCannotResume) {
		t.Fatalf("resume with nothing to tell versions apart: %v, want ErrCannotResume", err)
	}
	fl.Digest = "sha256:" + strings.Repeat("0", 64) // the digest guards the splice
	rc, err := f.Open(context.Background(), fl, 4)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if string(got) != "456789" {
		t.Fatalf("got %q", got)
	}
}

// A server that ignores Range but still has the resolved version is read
// from the start and skipped, as before.
func TestServerIgnoringRangeSameVersion(t *testing.T) {
	body := []byte("abcdefghijklmnopqrstuvwxyz")
	srv := httptest.NewServer(nethttp.HandlerFunc(func(w nethttp.ResponseWriter, r *nethttp.Request) {
		w.Header().Set("ETag", `"same"`)
		w.Write(body)
	}))
	defer srv.Close()
	rc, err := New().Open(context.Background(), fetchers.File{Locator: srv.URL + "/x", Size: int64(len(body)), Validator: `"same"`}, 10)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if string(got) != string(body[10:]) {
		t.Fatalf("got %q", got)
	}
}
