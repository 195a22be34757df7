package fetchers

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

type tentry struct {
	name, link string
	typ        byte
	mode       int64
	body       string
}

func mktar(t *testing.T, es ...tentry) []byte {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, e := range es {
		typ := e.typ
		if typ == 0 {
			typ = tar.TypeReg
		}
		mode := e.mode
		if mode == 0 {
			mode = 0o644
		}
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Linkname: e.link, Typeflag: typ, Mode: mode, Size: int64(len(e.body))}); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, e.body)
	}
	tw.Close()
	return b.Bytes()
}

func untarAll(data []byte, lim TarLimits) (map[string]string, []string, error) {
	files := map[string]string{}
	var wh []string
	err := Untar(bytes.NewReader(data), lim, func(e TarEntry, r io.Reader) error {
		if e.Link != "" {
			files[e.Path] = files[e.Link]
			return nil
		}
		b, _ := io.ReadAll(r)
		files[e.Path] = string(b)
		return nil
	}, func(p string, opaque bool) error {
		if opaque {
			p += "/*"
		}
		wh = append(wh, p)
		return nil
	})
	return files, wh, err
}

func TestUntarGood(t *testing.T) {
	data := mktar(t,
		tentry{name: "./", typ: tar.TypeDir},
		tentry{name: "models/", typ: tar.TypeDir},
		tentry{name: "models/config.json", body: "{}"},
		tentry{name: "./models/w.bin", body: "weights"},
		tentry{name: "models/alias.bin", typ: tar.TypeSymlink, link: "w.bin"},
		tentry{name: "models/hard.bin", typ: tar.TypeLink, link: "models/w.bin"},
		tentry{name: "etc/passwd", body: "outside the subtree"},
		tentry{name: "models/.wh.old.bin"},
		tentry{name: "models/sub/.wh..wh..opq"},
	)
	files, wh, err := untarAll(data, TarLimits{Subtree: "/models"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"config.json": "{}", "w.bin": "weights", "alias.bin": "weights", "hard.bin": "weights"}
	if len(files) != len(want) {
		t.Fatalf("files %v, want %v", files, want)
	}
	for k, v := range want {
		if files[k] != v {
			t.Fatalf("%s = %q, want %q", k, files[k], v)
		}
	}
	if strings.Join(wh, ",") != "old.bin,sub/*" {
		t.Fatalf("whiteouts %v", wh)
	}
}

func TestUntarHostile(t *testing.T) {
	for _, tc := range []struct {
		name string
		es   []tentry
		lim  TarLimits
		want string
	}{
		{"absolute", []tentry{{name: "/etc/passwd", body: "x"}}, TarLimits{}, "absolute"},
		{"dotdot", []tentry{{name: "a/../../etc/passwd", body: "x"}}, TarLimits{}, `".."`},
		{"symlink out", []tentry{{name: "a/link", typ: tar.TypeSymlink, link: "../../etc/passwd"}}, TarLimits{}, "leaves the archive"},
		{"symlink absolute", []tentry{{name: "link", typ: tar.TypeSymlink, link: "/etc/passwd"}}, TarLimits{}, "absolute"},
		{"symlink to nothing", []tentry{{name: "link", typ: tar.TypeSymlink, link: "later.bin"}, {name: "later.bin", body: "x"}}, TarLimits{}, "not an earlier regular file"},
		{"hardlink out", []tentry{{name: "h", typ: tar.TypeLink, link: "../x"}}, TarLimits{}, "leaves the archive"},
		{"link out of subtree", []tentry{{name: "etc/x", body: "s"}, {name: "models/l", typ: tar.TypeLink, link: "etc/x"}}, TarLimits{Subtree: "models"}, "leaves the models tree"},
		{"device", []tentry{{name: "dev", typ: tar.TypeChar}}, TarLimits{}, "device node"},
		{"fifo", []tentry{{name: "f", typ: tar.TypeFifo}}, TarLimits{}, "fifo"},
		{"setuid", []tentry{{name: "x", body: "#!", mode: 0o4755}}, TarLimits{}, "setuid"},
		{"too many", []tentry{{name: "a", body: "1"}, {name: "b", body: "2"}, {name: "c", body: "3"}}, TarLimits{MaxEntries: 2}, "more than 2 entries"},
		{"too big", []tentry{{name: "a", body: "12345"}}, TarLimits{MaxEntrySize: 4}, "beyond the limit"},
		{"total", []tentry{{name: "a", body: "123"}, {name: "b", body: "123"}}, TarLimits{MaxTotal: 5}, "larger than 5"},
	} {
		_, _, err := untarAll(mktar(t, tc.es...), tc.lim)
		if !errors.Is(err, ErrHostileArchive) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want ErrHostileArchive containing %q", tc.name, err, tc.want)
		}
	}
	if _, _, err := untarAll([]byte("this is not a tar archive at all, it is text padded to be long enough to need a header..........................................................................................................................................................................................................................................................................................................................................................................................................................................................."), TarLimits{}); err == nil {
		t.Error("garbage accepted as an archive")
	}
}
