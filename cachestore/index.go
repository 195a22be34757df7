package cachestore

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

var (
	bucketMeta      = []byte("meta")
	bucketBlobs     = []byte("blobs")
	bucketArtifacts = []byte("artifacts")
	bucketDesires   = []byte("desires")
	bucketHolds     = []byte("holds")
	bucketVersions  = []byte("versions")
	bucketManifests = []byte("manifests")
	keyVersion      = []byte("version")
	keyClean        = []byte("clean")
	keyCurrent      = []byte("current")
)

// State of an artifact version as the index records it.
type State string

const (
	StateReady   State = "Ready"   // every byte present and verified; the tree exists
	StateMissing State = "Missing" // blobs lost or corrupt: the tree is gone, re-fetch wanted
	StateFailed  State = "Failed"  // a re-fetch failed; Message says why
)

// Version is one immutable revision of an artifact, as the index records it.
type Version struct {
	Name           string    `json:"name"`
	Kind           string    `json:"kind"`
	Source         string    `json:"source"`
	Revision       string    `json:"revision"`
	Manifest       Manifest  `json:"manifest,omitempty"` // stored apart from the summary since schema 2
	ManifestDigest string    `json:"manifestDigest"`
	State          State     `json:"state"`
	Message        string    `json:"message,omitempty"`
	Pinned         bool      `json:"pinned"`
	Created        time.Time `json:"created"`
	LastUsed       time.Time `json:"lastUsed"`
	Bytes          int64     `json:"bytes"`
	Spec           string    `json:"spec,omitempty"`
	// HFRepo and HFRef are set for hub sources: the repo id and the
	// revision asked for. Such versions also appear in the HF cache view.
	HFRepo string `json:"hfRepo,omitempty"`
	HFRef  string `json:"hfRef,omitempty"`
	// Metadata is what the model's files say of it (config.json,
	// safetensors headers), read at commit.
	Metadata *Metadata `json:"metadata,omitempty"`
	// Annotations is what the committer recorded (opaque to the store).
	Annotations json.RawMessage `json:"annotations,omitempty"`
}

// Artifact is a name with its versions, the current one first.
type Artifact struct {
	Name     string    `json:"name"`
	Current  string    `json:"current,omitempty"`
	Versions []Version `json:"versions"`
}

type blobRecord struct {
	Size    int64     `json:"size"`
	Created time.Time `json:"created"`
}

// migration takes the index from schema version i to i+1.
type migration func(tx *bolt.Tx) error

// migrations, in order: migrations[i] upgrades version i to i+1. Append;
// never edit or reorder one that has shipped.
var migrations = []migration{
	// 0 → 1: the initial buckets.
	func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketMeta, bucketBlobs, bucketArtifacts, bucketDesires} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	},
	// 1 → 2: manifests move out of the version records into
	// artifacts/<name>/manifests/<revision>, so listing artifacts reads
	// small summaries instead of every file list.
	func(tx *bolt.Tx) error {
		arts := tx.Bucket(bucketArtifacts)
		return arts.ForEachBucket(func(name []byte) error {
			ab := arts.Bucket(name)
			vb := ab.Bucket(bucketVersions)
			if vb == nil {
				return nil
			}
			var all []Version
			if err := vb.ForEach(func(k, raw []byte) error {
				var v Version
				if err := json.Unmarshal(raw, &v); err != nil {
					return fmt.Errorf("%s@%s: %w", name, k, err)
				}
				all = append(all, v)
				return nil
			}); err != nil {
				return err
			}
			for i := range all {
				if err := putVersion(ab, &all[i]); err != nil {
					return err
				}
			}
			return nil
		})
	},
	// 2 → 3: holds, the daemon's records of what holds a version across
	// restarts (a pod's CSI volume).
	func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucketHolds)
		return err
	},
	// 3 → 4: the chunk index of Hugging Face Xet files (xetchunks.go):
	// xet/ by xorb, xetblobs/ by blob. Starts empty: the files already
	// held were fetched whole, not as chunks.
	func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketXet, bucketXetBlobs} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	},
}

// SchemaVersion is the index schema this binary writes.
func SchemaVersion() uint64 { return uint64(len(migrations)) }

func schemaVersion(tx *bolt.Tx) uint64 {
	b := tx.Bucket(bucketMeta)
	if b == nil {
		return 0
	}
	v := b.Get(keyVersion)
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

// migrate runs the migrations the index lacks, each in its own
// transaction with the version bump, so a crash leaves a consistent index
// at some version.
func migrate(db *bolt.DB, list []migration) error {
	for {
		var done bool
		err := db.Update(func(tx *bolt.Tx) error {
			v := schemaVersion(tx)
			if v > uint64(len(list)) {
				return fmt.Errorf("%w: index.db has schema %d, this modelcached understands up to %d; upgrade modelcached", ErrSchemaTooNew, v, len(list))
			}
			if v == uint64(len(list)) {
				done = true
				return nil
			}
			if err := list[v](tx); err != nil {
				return fmt.Errorf("migrate index %d→%d: %w", v, v+1, err)
			}
			meta, err := tx.CreateBucketIfNotExists(bucketMeta)
			if err != nil {
				return err
			}
			var buf [8]byte
			binary.BigEndian.PutUint64(buf[:], v+1)
			return meta.Put(keyVersion, buf[:])
		})
		if err != nil || done {
			return err
		}
	}
}

// getSummary reads a version without its manifest; nil when absent.
func getSummary(vb *bolt.Bucket, rev string) (*Version, error) {
	raw := vb.Get([]byte(rev))
	if raw == nil {
		return nil, nil
	}
	var v Version
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("index: version %s: %w", rev, err)
	}
	return &v, nil
}

// putSummary writes a version's summary and leaves its manifest alone.
func putSummary(vb *bolt.Bucket, v *Version) error {
	sum := *v
	sum.Manifest = nil
	raw, err := json.Marshal(&sum)
	if err != nil {
		return err
	}
	return vb.Put([]byte(v.Revision), raw)
}

// putVersion writes a version's summary and its manifest.
func putVersion(ab *bolt.Bucket, v *Version) error {
	vb, err := ab.CreateBucketIfNotExists(bucketVersions)
	if err != nil {
		return err
	}
	mb, err := ab.CreateBucketIfNotExists(bucketManifests)
	if err != nil {
		return err
	}
	raw, err := json.Marshal(v.Manifest)
	if err != nil {
		return err
	}
	if err := mb.Put([]byte(v.Revision), raw); err != nil {
		return err
	}
	return putSummary(vb, v)
}

// deleteVersion removes a version's summary and manifest.
func deleteVersion(ab *bolt.Bucket, rev string) error {
	if mb := ab.Bucket(bucketManifests); mb != nil {
		if err := mb.Delete([]byte(rev)); err != nil {
			return err
		}
	}
	return ab.Bucket(bucketVersions).Delete([]byte(rev))
}

// readArtifact decodes one artifact bucket, with manifests or without; the
// bytes are copied out by json.Unmarshal before the transaction ends.
func readArtifact(name string, ab *bolt.Bucket, manifests bool) (Artifact, error) {
	a := Artifact{Name: name, Current: string(ab.Get(keyCurrent))}
	vb := ab.Bucket(bucketVersions)
	if vb == nil {
		return a, nil
	}
	mb := ab.Bucket(bucketManifests)
	err := vb.ForEach(func(k, raw []byte) error {
		var v Version
		if err := json.Unmarshal(raw, &v); err != nil {
			return fmt.Errorf("index: %s@%s: %w", name, k, err)
		}
		if manifests && mb != nil {
			if mraw := mb.Get(k); mraw != nil {
				if err := json.Unmarshal(mraw, &v.Manifest); err != nil {
					return fmt.Errorf("index: manifest of %s@%s: %w", name, k, err)
				}
			}
		}
		if v.Revision == a.Current {
			a.Versions = append([]Version{v}, a.Versions...)
		} else {
			a.Versions = append(a.Versions, v)
		}
		return nil
	})
	return a, err
}
