package xet_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/modelcache/modelcache/fetchers/hf/xet"
	"github.com/modelcache/modelcache/fetchers/hf/xet/xettest"
)

type rig struct {
	cas  *xettest.CAS
	hub  *httptest.Server
	toks *xet.TokenSource
}

func newRig(t *testing.T) *rig {
	cas := xettest.New()
	hub := httptest.NewServer(cas.TokenHandler())
	t.Cleanup(func() { hub.Close(); cas.Close() })
	return &rig{cas, hub, &xet.TokenSource{URL: hub.URL, Client: http.DefaultClient}}
}

func (r *rig) read(t *testing.T, o xet.Options, offset int64) ([]byte, *xet.Stats, error) {
	t.Helper()
	o.Client, o.Tokens = http.DefaultClient, r.toks
	st := &xet.Stats{}
	rc := xet.Open(context.Background(), o, offset, st)
	b, err := io.ReadAll(rc)
	rc.Close()
	// As the daemon does once it committed a blob of the bytes' digest.
	rc.Committed("sha256:" + oid(b))
	return b, st, err
}

func oid(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func TestOpenExact(t *testing.T) {
	r := newRig(t)
	data := xettest.Model(1, 3<<20+12345, 200<<10)
	id := r.cas.Add(data)
	for _, v1 := range []bool{false, true} {
		r.cas.NoV2 = v1
		for _, off := range []int64{0, 1, 65536, 1<<20 + 7, int64(len(data)) - 1} {
			got, _, err := r.read(t, xet.Options{FileID: id, Size: int64(len(data)), Window: 700 << 10}, off)
			if err != nil || !bytes.Equal(got, data[off:]) {
				t.Fatalf("v1=%v offset %d: %d bytes (want %d), equal %v, %v", v1, off, len(got), len(data)-int(off), bytes.Equal(got, data[off:]), err)
			}
		}
	}
	if r.cas.TokensIssued.Load() != 1 {
		t.Errorf("%d tokens asked for; the first was valid for an hour", r.cas.TokensIssued.Load())
	}
}

// TestOpenReuse: a second revision with 10% of its tensors changed fetches
// only the chunks the store lacks.
func TestOpenReuse(t *testing.T) {
	r := newRig(t)
	const tensor = 256 << 10
	v1 := xettest.Model(2, 8<<20, tensor)
	v2 := xettest.Mutate(v1, 3, 0.10, tensor)
	id1, id2 := r.cas.Add(v1), r.cas.Add(v2)
	store := xettest.NewMemStore()
	got, st1, err := r.read(t, xet.Options{FileID: id1, Size: int64(len(v1)), Store: store, OID: oid(v1)}, 0)
	if err != nil || !bytes.Equal(got, v1) {
		t.Fatalf("rev 1: %v", err)
	}
	if st1.Reused.Load() != 0 || len(store.Placed(oid(v1))) == 0 {
		t.Fatalf("rev 1: reused %d, remembered %d terms", st1.Reused.Load(), len(store.Placed(oid(v1))))
	}
	store.Commit(oid(v1), v1)
	got, st2, err := r.read(t, xet.Options{FileID: id2, Size: int64(len(v2)), Store: store, OID: oid(v2)}, 0)
	if err != nil || !bytes.Equal(got, v2) {
		t.Fatalf("rev 2: %v", err)
	}
	ratio := float64(st2.Fetched.Load()) / float64(len(v2))
	t.Logf("rev 2: fetched %d of %d bytes (%.3f), reused %d, %d requests", st2.Fetched.Load(), len(v2), ratio, st2.Reused.Load(), st2.Requests.Load())
	if ratio > 0.15 {
		t.Errorf("rev 2 fetched %.3f of its size, want <= 0.15", ratio)
	}
}

// TestOpenFailures: a short range, an expired URL mid-file and an expired
// token are retried with a new reconstruction; the bytes stay exact.
func TestOpenFailures(t *testing.T) {
	r := newRig(t)
	data := xettest.Model(4, 2<<20, 100<<10)
	id := r.cas.Add(data)
	for name, spoil := range map[string]func(){
		"short range": func() { r.cas.ShortRanges.Store(1) },
		"expired URL": func() { r.cas.ExpireAt.Store(r.cas.XorbGets.Load() + 2) },
		"token":       func() { r.cas.ExpireTokens() },
	} {
		spoil()
		got, _, err := r.read(t, xet.Options{FileID: id, Size: int64(len(data)), Window: 512 << 10}, 0)
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s: equal %v, %v", name, bytes.Equal(got, data), err)
		}
	}
	if r.cas.Refused.Load() < 2 {
		t.Errorf("the CAS refused %d requests; the failures were not injected", r.cas.Refused.Load())
	}
	// A wrong chunk: the bytes either fail to decode (retried) or differ;
	// the caller's digest check is what stops the second kind.
	r.cas.WrongChunks.Store(1)
	got, _, err := r.read(t, xet.Options{FileID: id, Size: int64(len(data))}, 0)
	if err == nil && bytes.Equal(got, data) {
		t.Log("the flipped byte sat in a compressed chunk: decoding failed and the retry was clean")
	}
	// Persistent failures end in an error, not a short file.
	r.cas.ShortRanges.Store(100)
	if _, _, err := r.read(t, xet.Options{FileID: id, Size: int64(len(data)), Attempts: 2}, 0); err == nil {
		t.Error("every range short, yet no error")
	}
	r.cas.ShortRanges.Store(0)
}

func TestOpenRefusals(t *testing.T) {
	r := newRig(t)
	data := xettest.Model(5, 300<<10, 100<<10)
	id := r.cas.Add(data)
	// An unknown file (404) and a refused token are ErrUnsupported: fall back.
	if _, _, err := r.read(t, xet.Options{FileID: xet.ChunkHash(nil).String(), Size: 10}, 0); !errors.Is(err, xet.ErrUnsupported) {
		t.Errorf("unknown file: %v", err)
	}
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusForbidden) }))
	defer refusing.Close()
	o := xet.Options{FileID: id, Size: int64(len(data)), Client: http.DefaultClient, Tokens: &xet.TokenSource{URL: refusing.URL, Client: http.DefaultClient}}
	rc := xet.Open(context.Background(), o, 0, nil)
	if _, err := io.ReadAll(rc); !errors.Is(err, xet.ErrUnsupported) {
		t.Errorf("refused token: %v", err)
	}
	// A chunk scheme this client does not know.
	r.cas.Schemes = []xet.Scheme{7}
	id2 := r.cas.Add(xettest.Model(6, 300<<10, 100<<10))
	if _, _, err := r.read(t, xet.Options{FileID: id2, Size: 300 << 10}, 0); !errors.Is(err, xet.ErrUnsupported) {
		t.Errorf("scheme 7: %v", err)
	}
}

// TestTokenRefresh: a token is kept until 30 s before its exp (auth.md),
// then asked again.
func TestTokenRefresh(t *testing.T) {
	r := newRig(t)
	r.cas.TokenTTL = 2 * time.Minute
	now := time.Now()
	r.toks.Now = func() time.Time { return now }
	for i := 0; i < 3; i++ {
		if _, err := r.toks.Get(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if n := r.cas.TokensIssued.Load(); n != 1 {
		t.Fatalf("%d tokens for three calls within the first minute", n)
	}
	now = now.Add(95 * time.Second) // 25 s before exp
	if _, err := r.toks.Get(context.Background()); err != nil || r.cas.TokensIssued.Load() != 2 {
		t.Fatalf("25 s before exp: %d tokens, %v", r.cas.TokensIssued.Load(), err)
	}
}

// TestOpenRemembersOnlyACheckedWhole: terms are recorded under the OID
// only when the caller committed the bytes assembled from offset 0 under
// it; a file whose digest differs (a CAS that lies, a wrong OID) or a
// read resumed past 0 teaches the store nothing.
func TestOpenRemembersOnlyACheckedWhole(t *testing.T) {
	r := newRig(t)
	data := xettest.Model(4, 2<<20, 128<<10)
	id := r.cas.Add(data)
	for _, c := range []struct {
		name   string
		oid    string
		offset int64
		want   bool
	}{
		{"whole, right digest", oid(data), 0, true},
		{"whole, another digest", oid(append([]byte{1}, data...)), 0, false},
		{"resumed", oid(data), 4096, false},
	} {
		store := xettest.NewMemStore()
		got, _, err := r.read(t, xet.Options{FileID: id, Size: int64(len(data)), Store: store, OID: c.oid}, c.offset)
		if err != nil || !bytes.Equal(got, data[c.offset:]) {
			t.Fatalf("%s: %d bytes, %v", c.name, len(got), err)
		}
		if n := len(store.Placed(c.oid)); (n > 0) != c.want {
			t.Errorf("%s: %d terms remembered, want any: %v", c.name, n, c.want)
		}
	}
}

// TestOpenRemembersReused: a file assembled partly from held chunks
// records those too under its own OID, so a third revision finds them in
// the second's blob after the first's blob is gone.
func TestOpenRemembersReused(t *testing.T) {
	r := newRig(t)
	const tensor = 256 << 10
	v1 := xettest.Model(7, 8<<20, tensor)
	v2 := xettest.Mutate(v1, 8, 0.10, tensor)
	v3 := xettest.Mutate(v2, 9, 0.10, tensor)
	id1, id2, id3 := r.cas.Add(v1), r.cas.Add(v2), r.cas.Add(v3)
	store := xettest.NewMemStore()
	for _, v := range []struct {
		id   string
		data []byte
	}{{id1, v1}, {id2, v2}} {
		got, _, err := r.read(t, xet.Options{FileID: v.id, Size: int64(len(v.data)), Store: store, OID: oid(v.data)}, 0)
		if err != nil || !bytes.Equal(got, v.data) {
			t.Fatalf("%d bytes, %v", len(got), err)
		}
		store.Commit(oid(v.data), v.data)
	}
	var covered int64
	for _, p := range store.Placed(oid(v2)) {
		for _, l := range p.ChunkLens {
			covered += int64(l)
		}
	}
	if covered < int64(len(v2)) {
		t.Fatalf("rev 2 remembered terms over %d of its %d bytes: the reused chunks are missing", covered, len(v2))
	}
	store.Evict(oid(v1))
	got, st, err := r.read(t, xet.Options{FileID: id3, Size: int64(len(v3)), Store: store, OID: oid(v3)}, 0)
	if err != nil || !bytes.Equal(got, v3) {
		t.Fatalf("rev 3: %d bytes, %v", len(got), err)
	}
	ratio := float64(st.Fetched.Load()) / float64(len(v3))
	t.Logf("rev 3 with rev 1 evicted: fetched %.3f of its size, reused %d bytes", ratio, st.Reused.Load())
	if ratio > 0.25 {
		t.Errorf("rev 3 fetched %.3f of its size with rev 2 held, want <= 0.25", ratio)
	}
}
