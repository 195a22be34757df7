package ngc

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/fetchers/ngc/ngctest"
)

// Tests of the adapter against NGC as its published description and
// NVIDIA's client say it answers (ngctest's package comment).

// TestPublicModelWithoutKeyUsesGuestPaths: without a key the model,
// version and listing come from the guest paths (the org paths answer 401
// without a token), and no token is asked for.
func TestPublicModelWithoutKeyUsesGuestPaths(t *testing.T) {
	r := newReg(t)
	fs := files(3)
	r.s.AddVersion("nvidia/nemo/pub", "2", fs, true, true)
	var mu sync.Mutex
	var paths []string
	r.s.Hook = func(w http.ResponseWriter, q *http.Request) bool {
		if strings.HasPrefix(q.URL.Path, "/v2/") {
			mu.Lock()
			paths = append(paths, q.URL.Path)
			mu.Unlock()
		}
		return false
	}
	f := r.fetcher("")
	res, err := f.Resolve(context.Background(), fetchers.Source{URI: "ngc://nvidia/nemo/pub"})
	if r.note(err) != nil || res.Revision != "2" || len(res.Files) != 3 {
		t.Fatalf("%+v %v", res, err)
	}
	for _, fl := range res.Files {
		if !bytes.Equal(r.readAll(f, fl, 0), fs[fl.Path]) {
			t.Fatalf("%s differs", fl.Path)
		}
	}
	for _, p := range paths {
		if !strings.HasPrefix(p, "/v2/models/nvidia/nemo/pub") && p != "/v2/org/nvidia/team/nemo/models/pub/2/files" {
			t.Errorf("a keyless pull asked %s; want the guest paths and the URL manifest only", p)
		}
	}
	if r.s.TokenRequests.Load() != 0 || r.s.StorageSawAuth.Load() {
		t.Fatal("a keyless pull asked for a token or sent credentials to storage")
	}
}

// TestTamperedFileKeepsTheListedDigest: storage serving other bytes of the
// right size leaves the listed sha256 as the file's digest, so the store
// refuses the bytes (the daemon's TestNGCResumeAndWrongDigest shows the
// refusal).
func TestTamperedFileKeepsTheListedDigest(t *testing.T) {
	r := newReg(t)
	b := bytes.Repeat([]byte("weights!"), 512)
	r.s.AddVersion("org/m", "1", map[string][]byte{"w.bin": b}, true, true)
	bad := append([]byte(nil), b...)
	bad[100] ^= 0xff
	r.s.SetFile("org/m", "1", "w.bin", bad)
	f := r.fetcher("")
	res, err := f.Resolve(context.Background(), fetchers.Source{URI: "ngc://org/m:1"})
	if r.note(err) != nil {
		t.Fatal(err)
	}
	got := r.readAll(f, res.Files[0], 0)
	sum := sha256.Sum256(got)
	if len(got) != len(b) || res.Files[0].Digest != "sha256:"+ngctest.Sum(b) || res.Files[0].Digest == "sha256:"+hex.EncodeToString(sum[:]) {
		t.Fatalf("listed digest %s, streamed bytes' sha256 %x: want the listing's, which the bytes do not match", res.Files[0].Digest, sum)
	}
}

// TestPresignedURLExpiresDuringPull: a download cut mid-file, whose
// presigned URL expired meanwhile, resumes with Range on a new URL from
// the URL manifest; storage never sees a credential.
func TestPresignedURLExpiresDuringPull(t *testing.T) {
	r := newReg(t)
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	r.s.AddVersion("acme/m", "1", map[string][]byte{"w.bin": big}, false, true)
	r.s.Keys[testKey] = []string{"group/ngc:acme"}
	var cut sync.Once
	r.s.Hook = func(w http.ResponseWriter, q *http.Request) bool {
		if !strings.HasPrefix(q.URL.Path, "/blob/") || q.Header.Get("Range") != "" {
			return false
		}
		done := false
		cut.Do(func() {
			done = true
			w.Header().Set("Content-Length", "1048576")
			w.WriteHeader(http.StatusOK)
			w.Write(big[:300<<10])
			w.(http.Flusher).Flush()
			r.s.ExpireURLs() // the URL expires while its bytes are read
			conn, _, _ := http.NewResponseController(w).Hijack()
			conn.Close()
		})
		return done
	}
	f := r.fetcher(testKey)
	res, err := f.Resolve(context.Background(), fetchers.Source{URI: "ngc://acme/m:1"})
	if r.note(err) != nil {
		t.Fatal(err)
	}
	rc, err := f.Open(context.Background(), res.Files[0], 0)
	if r.note(err) != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err == nil || len(got) >= len(big) {
		t.Fatalf("the cut stream read %d bytes, err %v; want it cut short", len(got), err)
	}
	rest := r.readAll(f, res.Files[0], int64(len(got)))
	if !bytes.Equal(append(got, rest...), big) {
		t.Fatal("the resumed file differs")
	}
	if r.s.ExpiredGets.Load() != 1 || r.s.ManifestRequests.Load() != 2 || r.s.RangeGets.Load() != 2 {
		t.Fatalf("%d expired, %d manifest answers, %d Range requests; want the expired URL refused once, a new one asked for, and the resume on it with Range",
			r.s.ExpiredGets.Load(), r.s.ManifestRequests.Load(), r.s.RangeGets.Load())
	}
	if r.s.StorageSawAuth.Load() {
		t.Fatal("a token reached storage")
	}
}

// TestLegacyV1Version: a V1 version's listing (filepath[] and presigned
// urls[], no sizes or checksums) is pulled, its sizes unknown.
func TestLegacyV1Version(t *testing.T) {
	r := newReg(t)
	fs := files(3)
	r.s.AddVersion("nvidia/old", "0.1", fs, true, false)
	r.s.SetLegacy("nvidia/old", "0.1")
	f := r.fetcher("")
	res, err := f.Resolve(context.Background(), fetchers.Source{URI: "ngc://nvidia/old:0.1"})
	if r.note(err) != nil || len(res.Files) != 3 {
		t.Fatalf("V1: %+v %v", res, err)
	}
	for _, fl := range res.Files {
		if fl.Size != -1 || fl.Digest != "" {
			t.Fatalf("%s: size %d digest %q; a V1 listing says neither", fl.Path, fl.Size, fl.Digest)
		}
		if !bytes.Equal(r.readAll(f, fl, 0), fs[fl.Path]) {
			t.Fatalf("%s differs", fl.Path)
		}
	}
}

// TestNoTeamIsNoTeam: ngc://org/no-team/model is the org's model.
func TestNoTeamIsNoTeam(t *testing.T) {
	r := newReg(t)
	r.s.AddVersion("nvidia/m", "1", files(1), true, true)
	res, err := r.fetcher("").Resolve(context.Background(), fetchers.Source{URI: "ngc://nvidia/no-team/m:1"})
	if r.note(err) != nil || len(res.Files) != 1 {
		t.Fatalf("no-team: %+v %v", res, err)
	}
}

// TestLicenceAndOrgContext: 412 (a licence to accept) and 400 "org
// context missing" are permanent errors that say what to do.
func TestLicenceAndOrgContext(t *testing.T) {
	r := newReg(t)
	r.s.AddVersion("nvidia/lic", "1", files(1), true, true)
	r.s.RequireLicence("nvidia/lic", true)
	f := r.fetcher("")
	_, err := f.Resolve(context.Background(), fetchers.Source{URI: "ngc://nvidia/lic:1"})
	if r.note(err); !fetchers.IsPermanent(err) || !errors.Is(err, fetchers.ErrUnauthorized) || !strings.Contains(err.Error(), "HTTP 412") || !strings.Contains(err.Error(), "accept its licence") {
		t.Fatalf("412: %v", err)
	}
	r.s.RequireLicence("nvidia/lic", false)
	r.s.Hook = func(w http.ResponseWriter, q *http.Request) bool {
		if strings.HasSuffix(q.URL.Path, "/files") {
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(`{"requestStatus":{"statusCode":"INVALID_REQUEST","statusDescription":"Org contex missing"}}`))
			return true
		}
		return false
	}
	_, err = f.Resolve(context.Background(), fetchers.Source{URI: "ngc://nvidia/lic:1"})
	if r.note(err); !fetchers.IsPermanent(err) || !strings.Contains(err.Error(), "org context missing") || !strings.Contains(err.Error(), `org "nvidia"`) {
		t.Fatalf("400 org context: %v", err)
	}
}

// TestManifestRefusedFallsBackToPerFile: where the URL manifest is
// refused, files come from the deprecated per-file path, and the log says
// so once per version.
func TestManifestRefusedFallsBackToPerFile(t *testing.T) {
	r := newReg(t)
	fs := files(3)
	r.s.AddVersion("acme/m", "1", fs, false, true)
	r.s.Keys[testKey] = []string{"group/ngc:acme"}
	r.s.RefuseManifest = true
	var logs bytes.Buffer
	f := r.fetcher(testKey, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	res, err := f.Resolve(context.Background(), fetchers.Source{URI: "ngc://acme/m:1"})
	if r.note(err) != nil {
		t.Fatal(err)
	}
	for _, fl := range res.Files {
		if !bytes.Equal(r.readAll(f, fl, 0), fs[fl.Path]) {
			t.Fatalf("%s differs", fl.Path)
		}
	}
	if n := r.s.PerFileRequests.Load(); n != 3 {
		t.Fatalf("%d per-file downloads; want 3", n)
	}
	if n := strings.Count(logs.String(), "refused the URL manifest"); n != 1 {
		t.Fatalf("%d log lines about the refused manifest; want 1:\n%s", n, logs.String())
	}
	if r.s.StorageSawAuth.Load() {
		t.Fatal("the token followed the per-file redirect to storage")
	}
}
