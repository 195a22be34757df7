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
		t.Fatalf("migrations ran %v, want [2 3] once", order)
	}
	// A failing migration leaves the version where it was.
	boom := errors.New("boom")
	list = append(list, func(tx *bolt.Tx) error { return boom })
	if err := migrate(db, list); !errors.Is(err, boom) {
		t.Fatalf("failing migration: %v", err)
	}
	db.View(func(tx *bolt.Tx) error {
		if v := schemaVersion(tx); v != 3 {
			t.Errorf("version after a failed migration: %d, want 3", v)
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
