package cachestore

import (
	"context"
	"encoding/binary"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestMigrationV1 opens an empty index and checks that migration 0→1 made
// every bucket and recorded the version.
func TestMigrationV1(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "index.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := migrate(db, migrations[:1]); err != nil {
		t.Fatal(err)
	}
	db.View(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketMeta, bucketBlobs, bucketArtifacts, bucketDesires} {
			if tx.Bucket(b) == nil {
				t.Errorf("bucket %s missing after migration 1", b)
			}
		}
		if v := schemaVersion(tx); v != 1 {
			t.Errorf("schema version %d, want 1", v)
		}
		return nil
	})
}

// TestMigrationsRunInOrderOnce runs a list with a later migration against an
// index at version 1: only the new one runs, once, and a second Open is a
// no-op.
func TestMigrationsRunInOrderOnce(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "index.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := migrate(db, migrations); err != nil {
		t.Fatal(err)
	}
	var order []int
	list := append(append([]migration(nil), migrations...),
		func(tx *bolt.Tx) error { order = append(order, 2); return nil },
		func(tx *bolt.Tx) error { order = append(order, 3); return nil })
	for i := 0; i < 2; i++ {
		if err := migrate(db, list); err != nil {
			t.Fatal(err)
		}
	}
	if len(order) != 2 || order[0] != 2 || order[1] != 3 {
		t.Fatalf("migrations ran %v, want the two new ones once, in order", order)
	}
	// A failing migration leaves the version where it was.
	boom := errors.New("boom")
	list = append(list, func(tx *bolt.Tx) error { return boom })
	if err := migrate(db, list); !errors.Is(err, boom) {
		t.Fatalf("failing migration: %v", err)
	}
	db.View(func(tx *bolt.Tx) error {
		if v := schemaVersion(tx); v != uint64(len(migrations)+2) {
			t.Errorf("version after a failed migration: %d, want %d", v, len(migrations)+2)
		}
		return nil
	})
}

// TestMigrationV2SplitsManifests writes an index as schema 1 had it (the
// manifest inside the version record) and checks that migration 2 moves
// the manifest into its own bucket without losing anything.
func TestMigrationV2SplitsManifests(t *testing.T) {
	root := t.TempDir()
	db, err := bolt.Open(filepath.Join(root, "index.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := migrate(db, migrations[:1]); err != nil {
		t.Fatal(err)
	}
	d := DigestBytes([]byte("w"))
	v1 := `{"name":"m","kind":"model","source":"file:///m","revision":"r1","manifest":[{"path":"w.bin","digest":"` + d + `","size":1,"mode":420}],"manifestDigest":"sha256:x","state":"Ready","pinned":true,"bytes":1}`
	db.Update(func(tx *bolt.Tx) error {
		ab, _ := tx.Bucket(bucketArtifacts).CreateBucket([]byte("m"))
		vb, _ := ab.CreateBucket(bucketVersions)
		ab.Put(keyCurrent, []byte("r1"))
		return vb.Put([]byte("r1"), []byte(v1))
	})
	if err := migrate(db, migrations[:2]); err != nil {
		t.Fatal(err)
	}
	db.View(func(tx *bolt.Tx) error {
		ab := tx.Bucket(bucketArtifacts).Bucket([]byte("m"))
		if raw := ab.Bucket(bucketVersions).Get([]byte("r1")); strings.Contains(string(raw), `"manifest":`) {
			t.Errorf("summary still holds the manifest: %s", raw)
		}
		if raw := ab.Bucket(bucketManifests).Get([]byte("r1")); !strings.Contains(string(raw), "w.bin") {
			t.Errorf("manifest not moved: %s", raw)
		}
		a, err := readArtifact("m", ab, true)
		if err != nil || len(a.Versions) != 1 || len(a.Versions[0].Manifest) != 1 || !a.Versions[0].Pinned || a.Current != "r1" {
			t.Errorf("after migration: %+v %v", a, err)
		}
		if v := schemaVersion(tx); v != 2 {
			t.Errorf("schema %d, want 2", v)
		}
		return nil
	})
}

// TestSchemaTooNew refuses an index written by a newer binary.
func TestSchemaTooNew(t *testing.T) {
	root := t.TempDir()
	db, err := bolt.Open(filepath.Join(root, "index.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bolt.Tx) error {
		b, _ := tx.CreateBucketIfNotExists(bucketMeta)
		var buf [8]byte
		binary.BigEndian.PutUint64(buf[:], SchemaVersion()+1)
		return b.Put(keyVersion, buf[:])
	})
	db.Close()
	_, _, err = Open(context.Background(), root)
	if !errors.Is(err, ErrSchemaTooNew) {
		t.Fatalf("open of a newer index: %v, want ErrSchemaTooNew", err)
	}
}

// TestSecondOpenIsLocked: two daemons on one root cannot both open it.
func TestSecondOpenIsLocked(t *testing.T) {
	root := t.TempDir()
	s, _, err := Open(context.Background(), root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, _, err = Open(context.Background(), root, WithLockTimeout(50e6))
	if err == nil || !strings.Contains(err.Error(), "another modelcached") {
		t.Fatalf("second open: %v", err)
	}
}

// TestMigrationV4XetBuckets takes an index at schema 3 to 4: the chunk
// index's buckets appear, empty, and what was there stays.
func TestMigrationV4XetBuckets(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "index.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := migrate(db, migrations[:3]); err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketHolds).Put([]byte("csi:v"), []byte("{}")) })
	if err := migrate(db, migrations[:4]); err != nil {
		t.Fatal(err)
	}
	db.View(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketXet, bucketXetBlobs} {
			if bk := tx.Bucket(b); bk == nil || bk.Stats().KeyN != 0 {
				t.Errorf("bucket %s missing or not empty after migration 4", b)
			}
		}
		if tx.Bucket(bucketHolds).Get([]byte("csi:v")) == nil {
			t.Error("migration 4 lost a hold")
		}
		if v := schemaVersion(tx); v != 4 {
			t.Errorf("schema %d, want 4", v)
		}
		return nil
	})
}
