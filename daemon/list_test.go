package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/modelcache/modelcache/api"
)

// TestListStreamedAndRows: the list crosses the socket as the bytes
// writeJSON would send, element by element; fields=row carries only the
// table's fields, the same values; a bad fields value is refused.
func TestListStreamedAndRows(t *testing.T) {
	src := filepath.Join(t.TempDir(), "a&b") // writeJSON escapes & as \u0026
	os.Mkdir(src, 0o755)
	os.WriteFile(filepath.Join(src, "config.json"), []byte(`{"x":1}`), 0o644)
	h := start(t, testConfig(t))
	defer h.stop()
	ctx := context.Background()
	for _, n := range []string{"a", "b", "c"} {
		if _, err := h.pull(api.PullRequest{Name: n, URI: "file://" + src}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.c.Lease(ctx, "c", "job-1", time.Hour); err != nil {
		t.Fatal(err)
	}

	sock := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", h.cfg.Socket)
	}}}
	get := func(path string) (int, []byte) {
		resp, err := sock.Get("http://x" + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}

	_, raw := get("/v1/artifacts")
	list, err := viewsOf(h.d).list()
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	json.NewEncoder(&want).Encode(list)
	if !bytes.Contains(raw, []byte(`a\u0026b`)) {
		t.Fatalf("the source path with & is not in the list as writeJSON escapes it: %s", raw)
	}
	if !bytes.Equal(raw, want.Bytes()) {
		t.Fatalf("GET /v1/artifacts sent\n%s\nwant what one json.Encoder writes\n%s", raw, want.Bytes())
	}
	if _, empty := get("/v1/artifacts?fields=row"); !bytes.Contains(empty, []byte(`"name":"c"`)) || bytes.Contains(empty, []byte("manifestDigest")) {
		t.Fatalf("fields=row: %s", empty)
	}

	// Desired and never stored (after the byte comparison above: they
	// are retried as the test runs), one name sorting first and one last:
	// the views the list makes from desires alone.
	for _, n := range []string{"0-missing", "z-missing"} {
		if _, err := h.pull(api.PullRequest{Name: n, URI: "http://127.0.0.1:1/absent"}); err == nil {
			t.Fatalf("pull %s from a closed port succeeded", n)
		}
	}

	full, err := h.c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := h.c.ListRows(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(full) != 5 || len(rows) != len(full) {
		t.Fatalf("List %d, ListRows %d artifacts; want 5", len(full), len(rows))
	}
	for i, n := range []string{"0-missing", "a", "b", "c", "z-missing"} {
		if full[i].Name != n || rows[i].Name != n {
			t.Errorf("artifact %d: List %s, ListRows %s; want %s (sorted by name)", i, full[i].Name, rows[i].Name, n)
		}
	}
	for i := range full {
		want := full[i].Row()
		if strings.HasSuffix(want.Name, "-missing") {
			// Retried as the test runs: phase, message and progress move
			// between the two calls; what the desire says does not.
			if rows[i].URI != want.URI || rows[i].Entry != want.Entry || rows[i].Revision != "" || rows[i].Created != nil {
				t.Errorf("row %d: %+v, want the desire's %+v", i, rows[i], want)
			}
			continue
		}
		if !reflect.DeepEqual(rows[i], want) {
			t.Errorf("row %d: %+v, want %+v", i, rows[i], want)
		}
	}
	if len(rows[3].InUse) != 1 || rows[3].Created == nil || rows[3].Revision == "" || rows[3].Phase != api.PhaseReady {
		t.Errorf("row of the leased artifact: %+v", rows[3])
	}
	if rows[0].Phase == api.PhaseReady || rows[0].Message == "" || rows[0].URI == "" || rows[0].Entry != api.EntryAdHoc {
		t.Errorf("row of a desired artifact that never arrived: %+v", rows[0])
	}

	if code, body := get("/v1/artifacts?fields=all"); code != http.StatusBadRequest || !strings.Contains(string(body), "row") {
		t.Fatalf("fields=all: %d %s, want 400 naming the one value", code, body)
	}
}
