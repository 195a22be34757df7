package fetchers_test

import (
	"archive/tar"
	"bytes"
	"io"
	"path"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/fetchers"
)

func tarOf(entries ...*tar.Header) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range entries {
		tw.WriteHeader(h)
		if h.Typeflag == tar.TypeReg {
			tw.Write(bytes.Repeat([]byte{'x'}, int(h.Size)))
		}
	}
	tw.Close()
	return b.Bytes()
}

// FuzzUntar: whatever the archive, what Untar hands out is a clean
// relative path (and link target) inside the archive, and it never panics.
func FuzzUntar(f *testing.F) {
	for _, sub := range []bool{false, true} {
		f.Add(tarOf(&tar.Header{Name: "models/a.bin", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644}), sub)
		f.Add(tarOf(&tar.Header{Name: "../../etc/x", Typeflag: tar.TypeReg, Size: 1}), sub)
		f.Add(tarOf(&tar.Header{Name: "models/a", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"}), sub)
		f.Add(tarOf(&tar.Header{Name: "models/b", Typeflag: tar.TypeLink, Linkname: "../a"}), sub)
		f.Add(tarOf(&tar.Header{Name: "d/.wh..wh..opq", Typeflag: tar.TypeReg}, &tar.Header{Name: "d/.wh.x", Typeflag: tar.TypeReg}), sub)
		f.Add(tarOf(&tar.Header{Name: "dev", Typeflag: tar.TypeChar}, &tar.Header{Name: "s", Typeflag: tar.TypeReg, Mode: 0o4755}), sub)
		f.Add([]byte("not a tar"), sub)
	}
	{
		f.Fuzz(func(t *testing.T, data []byte, subtree bool) {
			lim := fetchers.TarLimits{MaxEntries: 1000, MaxEntrySize: 1 << 20}
			if subtree {
				lim.Subtree = "models"
			}
			bad := func(p string) bool {
				return p == "" || strings.HasPrefix(p, "/") || path.Clean(p) != p || p == ".." || strings.HasPrefix(p, "../") || strings.Contains(p, "\x00")
			}
			fetchers.Untar(bytes.NewReader(data), lim, func(e fetchers.TarEntry, body io.Reader) error {
				if bad(e.Path) || (e.Link != "" && bad(e.Link)) {
					t.Fatalf("Untar handed out %q (link %q)", e.Path, e.Link)
				}
				if e.Mode&0o7000 != 0 {
					t.Fatalf("Untar kept special mode bits %o on %q", e.Mode, e.Path)
				}
				if body != nil {
					io.Copy(io.Discard, body)
				}
				return nil
			}, func(p string, _ bool) error {
				if p != "." && bad(p) {
					t.Fatalf("whiteout of %q", p)
				}
				return nil
			})
		})
	}
}
