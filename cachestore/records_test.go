package cachestore

import (
	"bytes"
	"context"
	"maps"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Records reads and writes the desires and holds buckets of the index as
// raw bytes under their keys: what an index already holds reads back
// unchanged, what Records writes is where any binary of this schema looks,
// and both outlive a restart.
func TestRecordsKeepTheIndexFormat(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	s, _, err := Open(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	// A desire written straight into the bucket, as an index of a store
	// written before holds its desires.
	if err := s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketDesires).Put([]byte("old"), []byte(`{"name":"old"}`))
	}); err != nil {
		t.Fatal(err)
	}
	r := s.Records()
	if err := r.PutDesire("cluster:new", []byte(`{"name":"new"}`)); err != nil {
		t.Fatal(err)
	}
	if err := r.PutHold("csi:v", []byte(`{"pod":"ml/a"}`)); err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{"old": []byte(`{"name":"old"}`), "cluster:new": []byte(`{"name":"new"}`)}
	if got, err := r.Desires(); err != nil || !maps.EqualFunc(got, want, bytes.Equal) {
		t.Fatalf("desires: %q, %v; want %q", got, err, want)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	db, err := bolt.Open(filepath.Join(root, indexFile), 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.View(func(tx *bolt.Tx) error {
		if got := tx.Bucket(bucketDesires).Get([]byte("cluster:new")); string(got) != `{"name":"new"}` {
			t.Errorf("desires/cluster:new in the index: %q", got)
		}
		if got := tx.Bucket(bucketHolds).Get([]byte("csi:v")); string(got) != `{"pod":"ml/a"}` {
			t.Errorf("holds/csi:v in the index: %q", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()

	s, _, err = Open(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	r = s.Records()
	if err := r.DeleteDesire("old"); err != nil {
		t.Fatal(err)
	}
	delete(want, "old")
	if got, err := r.Desires(); err != nil || !maps.EqualFunc(got, want, bytes.Equal) {
		t.Fatalf("desires after a restart and a delete: %q, %v; want %q", got, err, want)
	}
	if got, err := r.Holds(); err != nil || string(got["csi:v"]) != `{"pod":"ml/a"}` || len(got) != 1 {
		t.Fatalf("holds after a restart: %q, %v", got, err)
	}
}
