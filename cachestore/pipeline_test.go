package cachestore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/cachestore"
)

// pipelineBlob is larger than a writer's buffers together (2 × 2 MiB
// at the default size) and ends off a 4 KiB boundary, so every buffer is
// reused and the tail leaves O_DIRECT.
func pipelineBlob() ([]byte, string) {
	b := make([]byte, 11<<20+123)
	rand.NewChaCha8([32]byte{7}).Read(b)
	sum := sha256.Sum256(b)
	return b, "sha256:" + hex.EncodeToString(sum[:])
}

// TestPipelineVerifiesBeforeVisible: through the pipeline (pooled
// buffers, hash and write on their own goroutines, O_DIRECT or buffered),
// a blob whose bytes do not match the expected digest is refused and
// leaves neither a blob nor partial data; the right bytes land intact;
// a writer closed halfway resumes from what is on disk; the stage times
// are counted. So for the default buffers (one huge page), the smallest,
// two huge pages, and a size that is no multiple of a huge page.
func TestPipelineVerifiesBeforeVisible(t *testing.T) {
	for _, tc := range []struct {
		name   string
		direct bool
		buf    int
	}{
		{"direct", true, cachestore.DefaultWriteBuffer},
		{"buffered", false, cachestore.DefaultWriteBuffer},
		{"direct-64KiB", true, cachestore.MinWriteBuffer},
		{"direct-4MiB", true, 4 << 20},
		{"direct-3MiB", true, 3 << 20},
	} {
		direct := tc.direct
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s, _, err := cachestore.Open(ctx, t.TempDir(), cachestore.WithDirectIO(direct), cachestore.WithWriteBuffer(tc.buf))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			b, want := pipelineBlob()
			evil := bytes.Clone(b)
			evil[len(evil)/2] ^= 1
			sum := sha256.Sum256(evil)
			evilDigest := "sha256:" + hex.EncodeToString(sum[:])

			_, err = s.Ingest(ctx, "evil", bytes.NewReader(evil), int64(len(evil)), want)
			if !errors.Is(err, cachestore.ErrDigestMismatch) {
				t.Fatalf("wrong bytes: %v, want ErrDigestMismatch", err)
			}
			if s.HasBlob(evilDigest) || s.HasBlob(want) {
				t.Fatal("a blob is visible for bytes that failed verification")
			}
			if in, _ := s.Ingests(); len(in) != 0 {
				t.Fatalf("partial data left after a mismatch: %v", in)
			}

			// Half, close, resume, the rest.
			w, err := s.Writer(ctx, cachestore.WriterOpts{Ref: "good", Size: int64(len(b))})
			if err != nil {
				t.Fatal(err)
			}
			half := 5<<20 + 17
			if _, err := w.ReadFrom(bytes.NewReader(b[:half])); err != nil {
				t.Fatal(err)
			}
			if err := w.Close(); err != nil {
				t.Fatal(err)
			}
			w, err = s.Writer(ctx, cachestore.WriterOpts{Ref: "good", Size: int64(len(b))})
			if err != nil {
				t.Fatal(err)
			}
			if got := w.Resumed(); got != int64(half)&^4095 {
				t.Fatalf("resumed at %d, want %d", got, half&^4095)
			}
			if _, err := w.ReadFrom(bytes.NewReader(b[w.Offset():])); err != nil {
				t.Fatal(err)
			}
			got, err := w.Commit(ctx, int64(len(b)), want)
			if err != nil || got != want {
				t.Fatalf("commit: %s %v, want %s", got, err, want)
			}
			st := w.Stages()
			if st.Hash <= 0 || st.Write <= 0 || st.Sync <= 0 {
				t.Fatalf("stages %+v: want hash, write and sync time counted", st)
			}
			p, err := s.BlobPath(want)
			if err != nil {
				t.Fatal(err)
			}
			on, err := os.ReadFile(p)
			if err != nil || !bytes.Equal(on, b) {
				t.Fatalf("blob on disk differs from the bytes sent (%v)", err)
			}
		})
	}
}

// TestWriteBufferSizeRefused: Open refuses a buffer size O_DIRECT or the
// memory bound cannot take, naming the size and what it wants, and
// creates nothing.
func TestWriteBufferSizeRefused(t *testing.T) {
	for _, n := range []int{0, -4096, 32 << 10, 1<<20 + 512, 128 << 20} {
		root := t.TempDir() + "/store"
		_, _, err := cachestore.Open(context.Background(), root, cachestore.WithWriteBuffer(n))
		if err == nil || !strings.Contains(err.Error(), strconv.Itoa(n)) || !strings.Contains(err.Error(), "multiple of 4 KiB") {
			t.Errorf("WithWriteBuffer(%d): %v, want an error naming the size and the rule", n, err)
		}
		if _, err := os.Stat(root); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("WithWriteBuffer(%d): the refused Open created the root (%v)", n, err)
		}
	}
}
