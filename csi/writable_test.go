package csi

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/modelcache/modelcache/internal/testenv"
)

// keepingBackend keeps (records) what each writable layer's upper
// directory holds when the driver hands it over at unpublish.
type keepingBackend struct {
	memBackend
	kept map[string]map[string]string // volume → path → content
	held []bool                       // whether the volume was still held at the call
}

func (b *keepingBackend) KeepLayer(_ context.Context, id, upper string) error {
	files := map[string]string{}
	err := filepath.WalkDir(upper, func(p string, e os.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(upper, p)
		c, err := os.ReadFile(p)
		files[rel] = string(c)
		return err
	})
	b.kept[id] = files
	vols, _ := b.Holds()
	b.held = append(b.held, len(vols) == 1 && vols[0].ID == id)
	return err
}

// TestUnpublishHandsTheLayerToAKeeper: at unpublish of a writable
// volume the Backend that keeps layers (LayerKeeper) gets its upper
// directory, holding what the pod wrote and not the tree beneath, while
// the volume is still held and its overlay no longer mounted; the layer
// goes after. A Backend that keeps nothing sees the layer go all the same.
func TestUnpublishHandsTheLayerToAKeeper(t *testing.T) {
	if os.Geteuid() != 0 {
		testenv.Missing(t, "root (to mount CSI volumes)", "run the tests as root, as CI does")
	}
	for _, keeps := range []bool{true, false} {
		dir := t.TempDir()
		pods, tree := filepath.Join(dir, "pods"), filepath.Join(dir, "tree")
		target := filepath.Join(pods, "uid", "mount")
		for _, p := range []string{tree, filepath.Dir(target)} {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		os.WriteFile(filepath.Join(tree, "w.bin"), []byte("weights"), 0o444)
		t.Cleanup(func() {
			for _, m := range mountsUnder(t, dir) {
				unix.Unmount(m.point, unix.MNT_DETACH)
			}
		})
		kb := &keepingBackend{memBackend: memBackend{tree: tree}, kept: map[string]map[string]string{}}
		var b Backend = &kb.memBackend
		if keeps {
			b = kb
		}
		cfg := Config{Socket: filepath.Join(dir, "csi.sock"), PodsDir: pods, NodeID: "n"}
		d, err := New(cfg, b)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		req := publishReq("vol", target)
		req.Readonly = false
		req.VolumeContext[AttrKernelCacheWritable] = "4Mi"
		if _, err := d.NodePublishVolume(ctx, req); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(target, "k.cubin"), []byte("compiled"), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := d.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: "vol", TargetPath: target}); err != nil {
			t.Fatal(err)
		}
		if keeps {
			if got := kb.kept["vol"]; len(got) != 1 || got["k.cubin"] != "compiled" || len(kb.held) != 1 || !kb.held[0] {
				t.Fatalf("the keeper got %v (held: %v); want k.cubin alone, while the volume was held", got, kb.held)
			}
		} else if len(kb.kept) != 0 {
			t.Fatalf("a backend that keeps nothing was handed %v", kb.kept)
		}
		if _, err := os.Stat(d.LayerDir("vol")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the layer after unpublish: %v", err)
		}
		if held, _ := b.Holds(); len(held) != 0 {
			t.Fatalf("holds left: %+v", held)
		}
	}
}
