package cachestore

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/google/renameio/v2"
	bolt "go.etcd.io/bbolt"
)

// Records keeps the daemon's own records: metadata, kept apart from the
// content (blobs, versions, trees) that Store keeps, in the manner of
// containerd's metadata store beside its content store. They live in the
// store's index file (buckets desires/ and holds/, doc.go), so one bbolt
// transaction log and one lock cover both; Store's methods never read
// them (Open only has Records put back the hold records a lost index
// took with it).
//
// Get it from Store.Records; it is valid until the Store is closed. Its
// methods are safe for concurrent use.
type Records struct {
	db   *bolt.DB
	root string
	log  *slog.Logger
}

// Records is the daemon's records in this store's index.
func (s *Store) Records() *Records { return s.records }

// PutDesire stores the daemon's opaque desired-state record for name.
func (r *Records) PutDesire(name string, raw []byte) error { return r.put(bucketDesires, name, raw) }

// DeleteDesire removes the desired-state record for name.
func (r *Records) DeleteDesire(name string) error { return r.delete(bucketDesires, name) }

// Desires returns every desired-state record.
func (r *Records) Desires() (map[string][]byte, error) { return r.all(bucketDesires) }

// Holds are the daemon's opaque records of something that holds versions
// beyond a restart (a pod's CSI volume). Each lives twice: in the index's
// holds bucket, and in holds/<sha256(key)>/record beside the blobs. The
// copy on disk is what brings the record back when the index is lost and
// rebuilt from the trees (which cannot tell who held what): Open puts
// every record found under holds/ that the index lacks back into it, and
// writes the file of any index record that lacks one. A hold may also own
// a composed tree (Store.HoldTree) in the same directory; it goes with
// DeleteHold.

const (
	holdRecordFile = "record"
	holdTreeDir    = "tree"
)

// holdFile is the on-disk copy of one hold record.
type holdFile struct {
	Key    string `json:"key"`
	Record []byte `json:"record"`
}

// holdDir is the directory of the hold under key: its record's copy and
// its composed tree.
func holdDir(root, key string) string {
	h := sha256.Sum256([]byte(key))
	return filepath.Join(root, dirHolds, hex.EncodeToString(h[:]))
}

// PutHold stores the daemon's opaque record of a hold under key: on disk
// under holds/ first, then in the index. It outlives restarts, and the
// loss of the index, until DeleteHold.
func (r *Records) PutHold(key string, raw []byte) error {
	if err := r.writeHoldFile(key, raw); err != nil {
		return fmt.Errorf("hold %q: %w", key, err)
	}
	return r.put(bucketHolds, key, raw)
}

func (r *Records) writeHoldFile(key string, raw []byte) error {
	dir := holdDir(r.root, key)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(holdFile{Key: key, Record: raw})
	if err != nil {
		return err
	}
	return renameio.WriteFile(filepath.Join(dir, holdRecordFile), b, 0o600, renameio.WithTempDir(filepath.Join(r.root, dirTmp)))
}

// DeleteHold removes the hold record under key, from the index and from
// disk, with the hold's composed tree if it has one; none there is no
// error. The caller has unmounted anything that showed the tree.
func (r *Records) DeleteHold(key string) error {
	if err := r.delete(bucketHolds, key); err != nil {
		return err
	}
	dir := holdDir(r.root, key)
	if _, err := os.Lstat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	removeTree(r.root, r.log, dir)
	return nil
}

// Holds returns every hold record by key.
func (r *Records) Holds() (map[string][]byte, error) { return r.all(bucketHolds) }

// syncHolds makes the index and holds/ agree (Open): a record on disk the
// index lacks goes back into the index, an index record without its file
// gets one, and a directory under holds/ with neither record nor tree
// (a crash inside PutHold) goes. It returns how many records it put back.
func (r *Records) syncHolds() (int, error) {
	inIndex, err := r.Holds()
	if err != nil {
		return 0, err
	}
	onDisk, err := r.holdFiles()
	if err != nil {
		return 0, err
	}
	restored := 0
	err = r.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketHolds)
		for k, raw := range onDisk {
			if _, ok := inIndex[k]; ok {
				continue
			}
			if err := b.Put([]byte(k), raw); err != nil {
				return err
			}
			restored++
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for k, raw := range inIndex {
		if _, ok := onDisk[k]; !ok {
			if err := r.writeHoldFile(k, raw); err != nil {
				r.log.Warn("writing the on-disk copy of a hold record", "key", k, "err", err)
			}
		}
	}
	if restored > 0 {
		r.log.Warn("put hold records back into the index from holds/", "restored", restored)
	}
	return restored, nil
}

// holdFiles reads the on-disk copies of the hold records by key. A
// directory with neither record nor tree is removed; an unreadable
// record, or one whose key does not hash to its directory, is skipped
// with a warning.
func (r *Records) holdFiles() (map[string][]byte, error) {
	base := filepath.Join(r.root, dirHolds)
	ents, err := os.ReadDir(base)
	if err != nil {
		return nil, err
	}
	onDisk := map[string][]byte{}
	for _, e := range ents {
		dir := filepath.Join(base, e.Name())
		b, err := os.ReadFile(filepath.Join(dir, holdRecordFile))
		if errors.Is(err, fs.ErrNotExist) {
			if _, terr := os.Lstat(filepath.Join(dir, holdTreeDir)); errors.Is(terr, fs.ErrNotExist) {
				os.RemoveAll(dir)
			} else {
				r.log.Warn("a hold's composed tree has no record; left in place in case something shows it (remove it once nothing mounts it)", "dir", dir)
			}
			continue
		}
		var hf holdFile
		if err == nil {
			err = json.Unmarshal(b, &hf)
		}
		if err == nil && holdDir(r.root, hf.Key) != dir {
			err = errors.New("its key does not hash to its directory's name")
		}
		if err != nil {
			r.log.Warn("ignoring an unreadable hold record", "file", filepath.Join(dir, holdRecordFile), "err", err)
			continue
		}
		onDisk[hf.Key] = hf.Record
	}
	return onDisk, nil
}

// put, delete and all keep the opaque records of a top-level bucket.
func (r *Records) put(bucket []byte, key string, raw []byte) error {
	return r.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put([]byte(key), raw) })
}

func (r *Records) delete(bucket []byte, key string) error {
	return r.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Delete([]byte(key)) })
}

func (r *Records) all(bucket []byte) (map[string][]byte, error) {
	out := map[string][]byte{}
	err := r.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucket).ForEach(func(k, v []byte) error {
			out[string(k)] = append([]byte(nil), v...)
			return nil
		})
	})
	return out, err
}
