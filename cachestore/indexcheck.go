package cachestore

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// damaged is the error for an index.db that cannot be trusted: it names
// the file, what is wrong, and the remedy.
func damaged(path, detail string) error {
	return fmt.Errorf("%s: %w (%s); the store's trees and blobs are untouched: stop modelcached, "+
		"move the file aside (mv %s %s.damaged) and start modelcached again, which rebuilds the index "+
		"from the trees and blobs on disk (see \"A damaged or lost index\" in docs/configuration.md)",
		path, ErrIndexDamaged, detail, path, path)
}

// guard runs fn with memory faults turned into panics (a truncated or
// garbled file is mmapped: a read past its end faults) and turns a panic
// (a fault, or one of bbolt's assertions on a corrupt page) into
// ErrIndexDamaged instead of a crash.
func guard(path string, fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = damaged(path, fmt.Sprintf("bbolt: %v", r))
		}
	}()
	return fn()
}

// boltOpen is bolt.Open under guard. When bolt.Open panics half-way, the
// file it opened (and its lock) is closed here, since no DB came back.
func boltOpen(path string, o bolt.Options) (*bolt.DB, error) {
	var f *os.File
	o.OpenFile = func(name string, flag int, mode os.FileMode) (*os.File, error) {
		var err error
		f, err = os.OpenFile(name, flag, mode)
		return f, err
	}
	var db *bolt.DB
	err := guard(path, func() error {
		var err error
		db, err = bolt.Open(path, 0o600, &o)
		return err
	})
	switch {
	case errors.Is(err, ErrIndexDamaged):
		if f != nil {
			f.Close()
		}
		return nil, err
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum), errors.Is(err, berrors.ErrVersionMismatch):
		return nil, damaged(path, err.Error())
	}
	return db, err
}

// openIndex opens index.db for writing. An existing file is checked first
// on a read-only handle: the pages its meta page claims must be in the
// file (a truncated index would fault or trip bbolt's assertions), every
// bucket must be walkable, and bbolt's own consistency check must pass;
// otherwise the error wraps ErrIndexDamaged and says what to do. fresh
// reports an index that has no schema yet: a new file, or one that was
// emptied or deleted under a store that may still hold trees.
func openIndex(path string, timeout time.Duration) (db *bolt.DB, fresh bool, err error) {
	if fi, err := os.Stat(path); err == nil && fi.Size() > 0 {
		if err := checkIndex(path, fi.Size(), timeout); err != nil {
			return nil, false, err
		}
	}
	db, err = boltOpen(path, bolt.Options{Timeout: timeout})
	if err != nil {
		return nil, false, err
	}
	err = guard(path, func() error {
		return db.View(func(tx *bolt.Tx) error {
			fresh = tx.Bucket(bucketMeta) == nil && tx.Bucket(bucketArtifacts) == nil
			return nil
		})
	})
	if err != nil {
		db.Close()
		return nil, false, err
	}
	return db, fresh, nil
}

func checkIndex(path string, size int64, timeout time.Duration) error {
	db, err := boltOpen(path, bolt.Options{Timeout: timeout, ReadOnly: true})
	if err != nil {
		return err
	}
	defer db.Close()
	return guard(path, func() error {
		return db.View(func(tx *bolt.Tx) error {
			if tx.Size() > size {
				return damaged(path, fmt.Sprintf("truncated: %d bytes on disk, its pages reach byte %d", size, tx.Size()))
			}
			if err := walkBuckets(tx); err != nil {
				return damaged(path, err.Error())
			}
			var problems []string
			n := 0
			for err := range tx.Check() {
				if n++; n <= 3 {
					problems = append(problems, err.Error())
				}
			}
			if n > 3 {
				problems = append(problems, fmt.Sprintf("and %d more", n-3))
			}
			if len(problems) > 0 {
				return damaged(path, "bbolt check: "+strings.Join(problems, "; "))
			}
			return nil
		})
	})
}

// walkBuckets reads every bucket and key, so that a page that is not
// what its parent says faults or panics here, under guard.
func walkBuckets(tx *bolt.Tx) error {
	var walk func(b *bolt.Bucket, depth int) error
	walk = func(b *bolt.Bucket, depth int) error {
		if depth > 16 {
			return errors.New("buckets nested deeper than this index ever writes")
		}
		return b.ForEach(func(k, v []byte) error {
			if v == nil {
				if c := b.Bucket(k); c != nil {
					return walk(c, depth+1)
				}
			}
			return nil
		})
	}
	return tx.ForEach(func(_ []byte, b *bolt.Bucket) error { return walk(b, 1) })
}
