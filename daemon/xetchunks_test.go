package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/daemon/sources"
	"github.com/modelcache/modelcache/fetchers"
	"github.com/modelcache/modelcache/fetchers/hf/xet"
)

// TestHFXetOptions: the node's --xet and a desire's xet decide together;
// off gives no chunk store, on the node's.
func TestHFXetOptions(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		node bool
		xet  *bool
		want bool
	}{
		{true, nil, true}, {true, &yes, true}, {true, &no, false},
		{false, nil, false}, {false, &yes, false}, {false, &no, false},
	} {
		on, cs := hfXetOptions(tc.node, nil)(api.Desire{Name: "m", URI: "hf://org/repo", Xet: tc.xet})
		if on != tc.want || (cs != nil) != tc.want {
			t.Errorf("--xet=%v, desire xet %v: enabled %v, chunk store %v; want enabled %v with a store only then", tc.node, tc.xet, on, cs, tc.want)
		}
	}
	if !DefaultConfig().Xet {
		t.Error("--xet is off by default")
	}
}

// TestXetChunkStoreAdapter: Remember takes the oid (bare sha256 hex) to
// the blob the store commits under sha256:<oid>; Chunks answers once that
// blob is committed, never before; a bad oid records nothing.
func TestXetChunkStoreAdapter(t *testing.T) {
	ctx := context.Background()
	st, _, err := cachestore.Open(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var cs xet.ChunkStore = xetChunks{store: st}
	chunks := [][]byte{bytes.Repeat([]byte("a"), 300), bytes.Repeat([]byte("b"), 200)}
	file := append(append([]byte("hdr"), chunks[0]...), chunks[1]...)
	oid := strings.TrimPrefix(cachestore.DigestBytes(file), cachestore.DigestPrefix)
	xorb := strings.Repeat("ab", 32)
	placed := []xet.Placed{{Xorb: xorb, First: 4, End: 6, Offset: 3, ChunkLens: []uint32{300, 200}}}

	if err := cs.Remember(ctx, "not-an-oid", placed); !errors.Is(err, cachestore.ErrInvalidDigest) {
		t.Fatalf("a bad oid: %v", err)
	}
	if err := cs.Remember(ctx, oid, placed); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := cs.Chunks(ctx, xorb, 4, 6); ok {
		t.Fatal("answered before the blob was committed")
	}
	if _, err := st.Ingest(ctx, "t", bytes.NewReader(file), int64(len(file)), cachestore.DigestPrefix+oid); err != nil {
		t.Fatal(err)
	}
	r, lens, ok := cs.Chunks(ctx, xorb, 5, 6)
	if !ok || len(lens) != 1 || lens[0] != 200 {
		t.Fatalf("once the blob is committed: %v, lengths %v", ok, lens)
	}
	got, _ := io.ReadAll(r)
	r.Close()
	if !bytes.Equal(got, chunks[1]) {
		t.Fatalf("chunk 5: %q", got)
	}
}

// TestXetDesireField: xet: false reaches the desire from a models.d file
// and turns Xet off for it; unset stays nil (Xet on).
func TestXetDesireField(t *testing.T) {
	d := &Daemon{}
	var err error
	if d.sources, err = sources.New(sources.Config{}, nil, func() map[string]api.Desire { return nil }); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "m.yaml")
	os.WriteFile(path, []byte("models:\n- name: whole\n  uri: hf://org/a\n  xet: false\n- name: chunked\n  uri: hf://org/b\n"), 0o644)
	list, err := modelsDir{d}.parse(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, ds := range list {
		if got := ds.Xet != nil && !*ds.Xet; got != (ds.Name == "whole") {
			t.Errorf("%s: xet %v", ds.Name, ds.Xet)
		}
		if on, _ := hfXetOptions(true, nil)(ds); on != (ds.Name == "chunked") {
			t.Errorf("%s: Xet enabled %v", ds.Name, on)
		}
	}
}

// transportSource is a fetcher whose readers say how they sent a file, as
// the hf fetcher's do.
type transportSource struct {
	body      []byte
	transport string
}

func (transportSource) Resolve(context.Context, fetchers.Source) (*fetchers.Resolved, error) {
	return nil, errors.New("not used")
}

func (s transportSource) Open(_ context.Context, _ fetchers.File, off int64) (io.ReadCloser, error) {
	return transportReader{io.NopCloser(bytes.NewReader(s.body[off:])), s.transport}, nil
}

type transportReader struct {
	io.ReadCloser
	t string
}

func (r transportReader) Transport() string { return r.t }

// TestDownloadRecordsTransport: a reader that says how its file came
// (xet, resolve) has it recorded for the file's manifest entry; anything
// else a source says is dropped.
func TestDownloadRecordsTransport(t *testing.T) {
	ctx := context.Background()
	d, err := New(ctx, testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	defer d.store.Close()
	for i, tr := range []string{api.TransportXet, api.TransportResolve, "carrier pigeon"} {
		body := data(1000, byte(i))
		p := &pull{d: d, ds: api.Desire{Name: "m"}, src: source{scheme: "hf", ref: "t"}, prog: &progress{started: time.Now()},
			backoff: fetchers.Backoff{Initial: time.Millisecond, Max: time.Millisecond, Attempts: 1}, f: transportSource{body, tr}}
		path := fmt.Sprintf("f%d.bin", i)
		fl := fetchers.File{Path: path, Size: int64(len(body)), Digest: sha(body)}
		if _, _, err := p.download(ctx, "t:"+path, fl, d.store.NewLease(), nil); err != nil {
			t.Fatal(err)
		}
		want := tr
		if i == 2 {
			want = ""
		}
		if got := p.prog.transportOf(path); got != want {
			t.Errorf("%s: transport %q, want %q", tr, got, want)
		}
	}
}
