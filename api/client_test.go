package api

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// serveOnce answers every request on a unix socket with body, and count
// in HeaderCount unless empty.
func serveOnce(t *testing.T, body, count string) *Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if count != "" {
			w.Header().Set(HeaderCount, count)
		}
		w.Write([]byte(body))
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return &Client{Socket: sock}
}

// TestListRowsDecodes: the array decoder (jsonv2, element by element)
// reads what the daemon's encoding/json writes, every field of a row
// included, and names what is wrong with a body it cannot read.
func TestListRowsDecodes(t *testing.T) {
	created := time.Date(2026, 11, 23, 15, 4, 5, 123456789, time.UTC)
	expires := created.Add(time.Minute)
	want := []ArtifactRow{
		{Name: "a", Phase: PhaseReady, URI: "hf://org/a", Revision: "abc", Bytes: 42, Pinned: true, Created: &created, Entry: EntryDeclared,
			InUse: []Holder{{Kind: "pod", ID: "ns/p", Revision: "abc", Expires: &expires}},
			Next:  &NextRevision{URI: "hf://org/a@def", Revision: "def", Phase: PhaseDownloading, Progress: &Progress{BytesDone: 1, BytesTotal: -1, Started: created}}},
		{Name: "b\u00e9\u4e16", Phase: PhaseFailed, Message: "boom \"quoted\" \\ \n", Progress: &Progress{BytesDone: 5, BytesTotal: 10, FilesDone: 1, FilesTotal: 2, BytesPerSecond: 1.5}},
	}
	body, err := json.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	// Enough rows to cross the decoder's chunk boundaries (64, 128, …).
	many := make([]ArtifactRow, 300)
	for i := range many {
		many[i] = want[i%2]
	}
	manyBody, _ := json.Marshal(many)
	for _, tc := range []struct {
		body  string
		count string // HeaderCount: sizes memory only, whether right, wrong or absurd
		want  []ArtifactRow
		err   string
	}{
		{body: string(body), want: want},
		{body: string(manyBody), want: many},
		{body: string(manyBody), count: "300", want: many},
		{body: string(manyBody), count: "2", want: many},
		{body: string(manyBody), count: "99999999999", want: many},
		{body: string(body), count: "-5", want: want},
		{body: " [ ] ", count: "0", want: []ArtifactRow{}},
		{body: " [ ] ", want: []ArtifactRow{}},
		{body: "null", want: nil},
		{body: `{"name":"a"}`, err: "want an array"},
		{body: string(body[:len(body)-20]), err: "decode GET /v1/artifacts?fields=row"},
		{body: `[{"name":"a","bytes":"many"}]`, err: "bytes"},
	} {
		got, err := serveOnce(t, tc.body, tc.count).ListRows(context.Background())
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("body %.40q: err %v, want one naming %q", tc.body, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("body %.40q: %v", tc.body, err)
		}
		if !reflect.DeepEqual(got, tc.want) || (got == nil) != (tc.want == nil) {
			t.Fatalf("body %.40q:\ngot  %+v\nwant %+v", tc.body, got, tc.want)
		}
	}
}
