package cachestore

import (
	"context"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// FuzzIndexRecords: whatever bytes a version, manifest or blob record
// holds (a damaged or hostile index), reading, checking and collecting
// the store answers with errors, never a panic, and never touches a path
// outside the root.
func FuzzIndexRecords(f *testing.F) {
	f.Add([]byte(`{"name":"m","kind":"model","revision":"r","state":"Ready","bytes":1}`), []byte(`[{"path":"a","digest":"sha256:`+string(make([]byte, 0))+`","size":1}]`), []byte(`{"size":1}`), "r")
	f.Add([]byte(`{"kind":"kernelcache","state":"Ready"}`), []byte(`[{"path":"../../etc/passwd","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000","size":3}]`), []byte(`{}`), "../x")
	f.Add([]byte(`not json`), []byte(`{}`), []byte(`[]`), "")
	f.Add([]byte(`{"kind":"nonsense","state":"Ready"}`), []byte(`null`), []byte(`{"size":-1}`), "current")
	f.Fuzz(func(t *testing.T, version, manifest, blob []byte, rev string) {
		if rev == "" || len(rev) > 200 {
			rev = "r"
		}
		root := t.TempDir()
		ctx := context.Background()
		s, _, err := Open(ctx, root)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		s.db.Update(func(tx *bolt.Tx) error {
			ab, err := tx.Bucket(bucketArtifacts).CreateBucketIfNotExists([]byte("m"))
			if err != nil {
				return err
			}
			ab.Put(keyCurrent, []byte(rev))
			vb, _ := ab.CreateBucketIfNotExists(bucketVersions)
			mb, _ := ab.CreateBucketIfNotExists(bucketManifests)
			vb.Put([]byte(rev), version)
			mb.Put([]byte(rev), manifest)
			return tx.Bucket(bucketBlobs).Put([]byte("sha256:"+"00000000000000000000000000000000000000000000000000000000000000ff"), blob)
		})
		s.List()
		s.Get("m")
		s.Summary("m")
		s.Fsck()
		s.GCDryRun(ctx)
		s.Usage()
		if _, err := filepath.Rel(root, s.TreePath(KindModel, "m", "")); err != nil {
			t.Fatal(err)
		}
	})
}
