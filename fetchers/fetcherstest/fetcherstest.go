// Package fetcherstest holds what the tests of the fetchers share.
package fetcherstest

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/modelcache/modelcache/fetchers"
)

// FetchFirst resolves uri with f and reads the first file it lists, whole,
// failing t unless that file's bytes are want.
func FetchFirst(t testing.TB, f fetchers.Fetcher, uri string, want []byte) {
	t.Helper()
	res, err := f.Resolve(context.Background(), fetchers.Source{URI: uri})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := f.Open(context.Background(), res.Files[0], 0)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("%s: read %d bytes (%v); want the file's %d", uri, len(got), err, len(want))
	}
}
