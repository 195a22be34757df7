package hf

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	nethttp "net/http"
	"strings"
	"sync"
	"testing"

	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
	"github.com/modelcache/modelcache/fetchers/hf/xet"
	"github.com/modelcache/modelcache/fetchers/hf/xet/xettest"
)

type routes struct {
	mu  sync.Mutex
	all []Route
}

func (r *routes) add(x Route) { r.mu.Lock(); r.all = append(r.all, x); r.mu.Unlock() }

// last is the last route reported for path.
func (r *routes) last(path string) Route {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.all) - 1; i >= 0; i-- {
		if r.all[i].Path == path {
			return r.all[i]
		}
	}
	return Route{}
}

func xetHub(t *testing.T) (*hubtest.Hub, *xettest.CAS) {
	hub := hubtest.New()
	t.Cleanup(hub.Close)
	return hub, hub.EnableXet()
}

func newXetFetcher(t *testing.T, hub *hubtest.Hub, rs *routes, opts ...Option) *Fetcher {
	f, err := New(append([]Option{WithEndpoint(hub.URL()), WithToken(""), WithTokenFile(t.TempDir() + "/none"), WithRouteReport(rs.add)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// pull reads every file as the daemon's ingest does: from offset 0,
// sha256 checked before the bytes count (and the reader told so, as the
// daemon's commit does), a refused file opened again (as the daemon's
// retry does). It returns the files' bytes and how
// each was sent (the reader's Transport, which the daemon records).
func pull(t *testing.T, f *Fetcher, uri string) (map[string][]byte, map[string]string) {
	t.Helper()
	ctx := context.Background()
	res, err := f.Resolve(ctx, fetchers.Source{URI: uri})
	if err != nil {
		t.Fatal(err)
	}
	out, via := map[string][]byte{}, map[string]string{}
	for _, fl := range res.Files {
		for attempt := 0; ; attempt++ {
			rc, err := f.Open(ctx, fl, 0)
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(rc)
			rc.Close()
			if err != nil {
				t.Fatalf("%s: %v", fl.Path, err)
			}
			if tr, ok := rc.(interface{ Transport() string }); ok {
				via[fl.Path] = tr.Transport()
			}
			sum := sha256.Sum256(b)
			if fl.Digest == "" || fl.Digest == "sha256:"+hex.EncodeToString(sum[:]) {
				out[fl.Path] = b
				if c, ok := rc.(interface{ Committed(string) }); ok && fl.Digest != "" {
					c.Committed(fl.Digest) // as the daemon does once the blob is committed
				}
				break
			}
			if attempt == 2 {
				t.Fatalf("%s: digest refused %d times", fl.Path, attempt+1)
			}
		}
	}
	return out, via
}

func TestXetPath(t *testing.T) {
	hub, cas := xetHub(t)
	files := map[string][]byte{"model.safetensors": xettest.Model(1, 3<<20, 128<<10), "config.json": []byte(`{"a":1}`)}
	hub.Commit("org/m", files, "main")
	rs := &routes{}
	got, via := pull(t, newXetFetcher(t, hub, rs), "hf://org/m")
	if via["model.safetensors"] != RouteXet || via["config.json"] != RouteResolve {
		t.Errorf("transports %v", via)
	}
	for p, b := range files {
		if !bytes.Equal(got[p], b) {
			t.Errorf("%s: bytes differ", p)
		}
	}
	if r := rs.last("model.safetensors"); r.Via != RouteXet || !r.Done || r.Fetched == 0 {
		t.Errorf("model: route %+v, want a finished xet read", r)
	}
	if r := rs.last("config.json"); r.Via != RouteResolve || r.Reason != "not an LFS file" {
		t.Errorf("config: route %+v", r)
	}
	if cas.XorbGets.Load() == 0 || hub.ResolveGets.Load() > 1 {
		t.Errorf("xorb requests %d, bridge GETs %d (the config only)", cas.XorbGets.Load(), hub.ResolveGets.Load())
	}
	// Resume: from an offset, only the rest comes.
	res, _ := newXetFetcher(t, hub, rs).Resolve(context.Background(), fetchers.Source{URI: "hf://org/m"})
	for _, fl := range res.Files {
		if fl.Path != "model.safetensors" {
			continue
		}
		rc, err := newXetFetcher(t, hub, rs).Open(context.Background(), fl, 1<<20+3)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(b, files[fl.Path][1<<20+3:]) {
			t.Fatalf("resume: %d bytes, %v", len(b), err)
		}
		if r := rs.last(fl.Path); r.Via != RouteXet || r.Offset != 1<<20+3 {
			t.Errorf("resume route %+v", r)
		}
	}
}

// TestXetReuse: a second revision with 10% of its tensors changed fetches
// only the chunks the node's ChunkStore lacks.
func TestXetReuse(t *testing.T) {
	hub, cas := xetHub(t)
	const tensor = 256 << 10
	v1 := xettest.Model(2, 6<<20, tensor)
	v2 := xettest.Mutate(v1, 3, 0.10, tensor)
	hub.Commit("org/m", map[string][]byte{"w.bin": v1}, "v1")
	hub.Commit("org/m", map[string][]byte{"w.bin": v2}, "v2")
	store := xettest.NewMemStore()
	rs := &routes{}
	f := newXetFetcher(t, hub, rs, WithChunkStore(store))
	if got, _ := pull(t, f, "hf://org/m@v1"); !bytes.Equal(got["w.bin"], v1) {
		t.Fatal("rev 1 differs")
	}
	s1 := sha256.Sum256(v1)
	store.Commit(hex.EncodeToString(s1[:]), v1) // the daemon commits the blob
	before := cas.Sent.Load()
	if got, _ := pull(t, f, "hf://org/m@v2"); !bytes.Equal(got["w.bin"], v2) {
		t.Fatal("rev 2 differs")
	}
	r := rs.last("w.bin")
	ratio := float64(cas.Sent.Load()-before) / float64(len(v2))
	t.Logf("rev 2: %d of %d bytes fetched (%.3f), %d reused", cas.Sent.Load()-before, len(v2), ratio, r.Reused)
	if r.Via != RouteXet || ratio > 0.15 || r.Reused < int64(len(v2))*8/10 {
		t.Errorf("rev 2: route %+v, fetched %.3f of its size (want <= 0.15)", r, ratio)
	}
}

// TestXetFallbacks: whatever the fetcher does not understand goes to the
// bridge, and the bytes are right.
func TestXetFallbacks(t *testing.T) {
	data := xettest.Model(4, 1<<20, 128<<10)
	for _, tc := range []struct {
		name, reason string
		setup        func(*hubtest.Hub, *xettest.CAS)
		opts         []Option
	}{
		{"turned off", "xet turned off", nil, []Option{WithXet(false)}},
		{"no Xet headers", "X-Xet-Hash", func(h *hubtest.Hub, _ *xettest.CAS) { h.Xet = nil }, nil},
		{"no token endpoint", "xet read token", func(h *hubtest.Hub, _ *xettest.CAS) {
			h.Hook = func(w nethttp.ResponseWriter, r *nethttp.Request) bool {
				if strings.Contains(r.URL.Path, "/xet-read-token/") {
					nethttp.NotFound(w, r)
					return true
				}
				return false
			}
		}, nil},
		{"token refused", "xet read token", func(h *hubtest.Hub, _ *xettest.CAS) {
			h.Hook = func(w nethttp.ResponseWriter, r *nethttp.Request) bool {
				if strings.Contains(r.URL.Path, "/xet-read-token/") {
					w.WriteHeader(nethttp.StatusForbidden)
					return true
				}
				return false
			}
		}, nil},
		{"new chunk encoding", "xet failed", func(_ *hubtest.Hub, c *xettest.CAS) { c.Schemes = []xet.Scheme{9} }, nil},
		{"every range short", "xet failed", func(_ *hubtest.Hub, c *xettest.CAS) { c.ShortRanges.Store(1000) }, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hub, cas := xetHub(t)
			if tc.setup != nil {
				tc.setup(hub, cas)
			}
			hub.Commit("org/m", map[string][]byte{"w.bin": data}, "main")
			rs := &routes{}
			got, via := pull(t, newXetFetcher(t, hub, rs, tc.opts...), "hf://org/m")
			if !bytes.Equal(got["w.bin"], data) || via["w.bin"] != RouteResolve {
				t.Fatalf("bytes equal %v, transport %q", bytes.Equal(got["w.bin"], data), via["w.bin"])
			}
			if r := rs.last("w.bin"); r.Via != RouteResolve || !strings.Contains(r.Reason, tc.reason) {
				t.Errorf("route %+v, want the bridge because %q", r, tc.reason)
			}
		})
	}
}

// TestXetInjections: failures mid-file are retried over Xet, and a wrong
// chunk that decodes cleanly never makes a wrong file: its digest is
// refused and the file comes again from the bridge.
func TestXetInjections(t *testing.T) {
	data := xettest.Model(5, 2<<20, 128<<10)
	for name, spoil := range map[string]func(*xettest.CAS){
		"short range": func(c *xettest.CAS) { c.ShortRanges.Store(1) },
		"expired URL": func(c *xettest.CAS) { c.ExpireAt.Store(1) },
		"wrong chunk": func(c *xettest.CAS) { c.Schemes = []xet.Scheme{xet.None}; c.WrongChunks.Store(1) },
	} {
		t.Run(name, func(t *testing.T) {
			hub, cas := xetHub(t)
			spoil(cas)
			hub.Commit("org/m", map[string][]byte{"w.bin": data}, "main")
			rs := &routes{}
			if got, _ := pull(t, newXetFetcher(t, hub, rs), "hf://org/m"); !bytes.Equal(got["w.bin"], data) {
				t.Fatal("bytes differ")
			}
			r := rs.last("w.bin")
			if name == "wrong chunk" {
				if r.Via != RouteResolve {
					t.Errorf("after a refused digest: route %+v, want the bridge", r)
				}
				return
			}
			if r.Via != RouteXet || cas.Refused.Load()+cas.Reconstructions.Load() < 2 {
				t.Errorf("route %+v, refused %d", r, cas.Refused.Load())
			}
		})
	}
}

// TestXetTokenLinkStaysOnTheHub: the hub's token goes only to its own
// origin, whatever Link rel="xet-auth" names.
func TestXetTokenLinkStaysOnTheHub(t *testing.T) {
	hub, cas := xetHub(t)
	data := xettest.Model(6, 256<<10, 64<<10)
	hub.Commit("org/m", map[string][]byte{"w.bin": data}, "main")
	evil := false
	other := hubtest.New() // another origin, which must never be asked
	defer other.Close()
	other.Hook = func(w nethttp.ResponseWriter, r *nethttp.Request) bool { evil = true; return false }
	sum := sha256.Sum256(data)
	id := hub.XetID(hex.EncodeToString(sum[:]))
	hub.Hook = func(w nethttp.ResponseWriter, r *nethttp.Request) bool {
		if r.Method != nethttp.MethodHead || !strings.Contains(r.URL.Path, "/resolve/") {
			return false
		}
		w.Header().Set("X-Xet-Hash", id)
		w.Header().Set("Link", `<`+other.URL()+`/api/models/org/m/xet-read-token/main>; rel="xet-auth"`)
		w.WriteHeader(nethttp.StatusFound)
		return true
	}
	rs := &routes{}
	if got, _ := pull(t, newXetFetcher(t, hub, rs), "hf://org/m"); !bytes.Equal(got["w.bin"], data) {
		t.Fatal("bytes differ")
	}
	if evil || rs.last("w.bin").Via != RouteXet || cas.TokensIssued.Load() != 1 {
		t.Errorf("asked the other origin %v; route %+v", evil, rs.last("w.bin"))
	}
}
