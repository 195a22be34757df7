// Package cachestore is the node-local, content-addressed store of model
// weights and kernel caches: blobs, resumable ingest, the bbolt index,
// atomic commit of artifact versions as trees of hardlinks, startup repair,
// verification (scrub), garbage collection and usage accounting.
//
// It knows nothing about networks, Kubernetes or GPUs, and imports no other
// package of this project. It is the one place that guards the store root:
// every manifest path is validated here (ValidatePath) before anything is
// written, and nothing is ever written outside the root.
//
// # Where to find what
//
//	store.go       Store, Open and Close, Check, the root's directories and kinds
//	options.go     Open's options (WithLogger, WithDirectIO, …), each with its default
//	roles.go       the consumer-side interfaces: what a pull, a view and eviction need
//	blobs.go       blobs: paths, presence, reading, adoption into blobs/, their index
//	               records; Lease and what holds a blob from GC
//	commit.go      VersionSpec, CommitVersion, Activate; building, removing and
//	               pointing at trees (materialize, current links)
//	private.go     private artifacts' trees under private/ (SetPrivate, IsPrivate), the
//	               artifact directories public and private; InTrees parses a path in them
//	artifacts.go   the artifact records: get, list (with the summaries' cache), pin,
//	               touch, state, evict
//	records.go     Records: the daemon's records (desires, holds) beside the content,
//	               in the same index; the on-disk copies of hold records
//	holdtree.go    a hold's composed tree (HoldTree), beside its record
//	index.go       the index's records (Version, Artifact, blobRecord), buckets and keys,
//	               the schema version and its migrations
//	indexcheck.go  opening index.db safely: the read-only check of a damaged index
//	path.go        Entry and Manifest; ValidatePath and ValidateName, the root's guard
//	digest.go      parsing and normalizing sha256 digests
//	errors.go      the sentinel errors
//	writer.go      Writer: resumable, hashed ingest into ingest/<ref>/ and the commit of a blob
//	growing.go     Growing: a blob a Writer is still writing, readable up to what it wrote and
//	               hashed, with a wait for more (OpenGrowing); WatchBlob: told when a digest lands
//	ingest.go      opening Writers, CommitBatch, the partial ingests on disk (list, remove,
//	               abandoned) and the lock of a ref
//	bufpool.go     the Writer's I/O buffers: their size, alignment, huge pages, a pool that
//	               frees idle ones
//	metadata.go    Metadata read from a version's config.json and safetensors headers
//	hfview.go      the Hugging Face hub cache view under hf/: what one repo's view should
//	               be (wantedSnapshots, wantedRefs) and its steps (hfRepoView)
//	repair.go      what Open repairs after a crash (blobs, trees, current links, ingests),
//	               one step per method of a repairer
//	rebuild.go     rebuilding a lost index from the trees on disk (a rebuilder: per
//	               artifact, per version, then one transaction)
//	fsck.go        Fsck: index, blobs and trees agree, without rehashing (a fscker)
//	verify.go      Verify: rehash blobs (scrub), quarantine what fails
//	gc.go          GC of unreferenced blobs; usage accounting and filesystem stats
//	xetchunks.go   the chunk index of Hugging Face Xet files: RecordXetTerms, XetChunks
//	               (a range stitched from the blobs that hold it), its pruning in GC
//	doc_test.go    TestDocDrawsSchema, which holds the schema below to the code
//
// # Content and metadata
//
// Store is the content: blobs, ingests, versions and their trees, the HF
// view. Records is the daemon's metadata (desires, holds), kept apart in
// its own type over the same index file, as containerd keeps its metadata
// store beside its content store. Store reads none of it; Open only has
// Records put hold records back after a lost index (records.go). Consumers
// take the narrowest role they need (roles.go): a pull a Puller, the read
// views a Viewer, eviction a Pruner.
//
// # On-disk layout
//
//	<root>/index.db                          bbolt index (this file's schema below)
//	<root>/blobs/sha256/<2 hex>/<64 hex>     immutable content, mode 0444
//	<root>/ingest/<sha256(ref)>/{ref,data}   partial writes, resumable by ref; an optional
//	                                         owner file names whose pull may resume it
//	<root>/tmp/                              temp trees and renameio temp files; emptied at Open
//	<root>/quarantine/<hex>-<unix>           blobs that failed verification
//	<root>/quarantine/tree-<kind>-<name>-<rev>-<unix>  trees an index rebuild could not read as the store's
//	<root>/holds/<sha256(key)>/record        the on-disk copy of a hold record ({key, record}),
//	                                         put back into the index when the index is lost
//	<root>/holds/<sha256(key)>/tree/…        a hold's composed tree (several versions side by
//	                                         side), hardlinks into blobs; goes with the hold
//	<root>/models/<name>/<revision>/…        hardlinks into blobs; appears by rename
//	<root>/models/<name>/current -> <revision>
//	<root>/kernels/<name>/<revision>/…       the same for kind "kernelcache"
//	<root>/kernels/<name>/current -> <revision>
//	<root>/hf/models--<org>--<repo>/         the Hugging Face hub cache view of versions with hfRepo:
//	    blobs/<oid>                          hardlinks of store blobs; oid is the entry's etag, else its sha256 hex
//	    snapshots/<commit>/<path>            relative symlinks to ../../blobs/<oid>
//	    refs/<ref>                           the commit a ref names, no trailing newline
//
// # Index schema (bbolt, version 4)
//
// Every bucket, key and stored field; TestDocDrawsSchema fails when a
// bucket or key of index.go, or a JSON field of a stored record, is
// missing here.
//
//	meta/
//	    version              -> uint64, big-endian: the schema version
//	    clean                -> uint64, big-endian: the id of the transaction that
//	                            wrote it, at a clean Close; Open trusts disk and
//	                            index to agree only while it is the last one
//	blobs/
//	    <sha256:hex>         -> JSON blobRecord{size, created}
//	artifacts/
//	    <name>/              (bucket, one per artifact)
//	        current          -> revision (the one <kind dir>/<name>/current points to)
//	        versions/        (bucket)
//	            <revision>   -> JSON Version, the summary (no manifest since schema 2):
//	                            {name, kind, source, revision, manifestDigest,
//	                             state (Ready|Missing|Failed), message, pinned,
//	                             created, lastUsed, bytes, spec, hfRepo, hfRef,
//	                             metadata, annotations}
//	                            metadata: Metadata{architectures, modelType,
//	                             torchDtype, maxPositionEmbeddings,
//	                             quantizationConfig, parameters,
//	                             parametersByDtype, tensorBytes,
//	                             safetensorsFiles, problems}
//	                            annotations: opaque JSON of the committer (the
//	                             daemon's api.KernelCacheInfo for a kernel cache)
//	        manifests/       (bucket; since schema 2)
//	            <revision>   -> JSON Manifest [{path, digest, size, mode, etag, streamed, peers, validator,
//	                             transport}], sorted by path
//	desires/             (kept by Records, never read by Store)
//	    <name>               -> opaque to the store: the daemon's JSON api.Desire
//	                            (source URIs with credentials redacted) of a
//	                            socket pull or pin; models.d files are never stored
//	    cluster:<name>       -> the same, for a desire from a ModelCache object
//	                            (a colon is never part of an artifact name)
//	holds/               (bucket; since schema 3; kept by Records)
//	    <key>                -> opaque to the store: the daemon's JSON record of a
//	                            hold that outlives restarts (csi:<volume id>: a
//	                            pod's CSI volume and the version it mounts)
//	xet/                 (bucket; since schema 4; the chunk index of Xet files, xetchunks.go)
//	    <xorb>/              (bucket, one per xorb: its hash as 64 lowercase hex)
//	        <first><end><sha256:hex> -> JSON xetPlace{offset, chunkLens}: chunks
//	                            [first, end) of the xorb (uint32s, big-endian, so
//	                            terms sort by first chunk) sit in that blob from
//	                            byte offset, one uncompressed length per chunk;
//	                            answered only while the blob has its record
//	xetblobs/            (bucket; since schema 4)
//	    <sha256:hex>         -> JSON [xetRef{xorb, first, end}]: the blob's xet/
//	                            entries, dropped with it (GC)
//
// Fields marked omitempty in the structs are absent when empty.
//
// Migrations are listed in order in migrations; each takes the index from
// version i to i+1 inside the transaction that also records the new version.
// An index newer than this binary understands is refused, never rewritten.
//
// # A damaged or lost index
//
// Open checks an existing index.db on a read-only handle before using it:
// the pages its meta page claims must be in the file, every bucket must be
// walkable (memory faults and bbolt's assertion panics are recovered), and
// bbolt's Tx.Check must pass. A damaged index is refused with
// ErrIndexDamaged and a message that says to move it aside; nothing on
// disk is touched. An index with no schema (new, emptied or deleted) over
// a root that holds trees is rebuilt from them before repair runs (see
// rebuildIndex for what comes back and what is lost), so repair never
// deletes the trees of a store whose index was what went missing.
//
// # Commit protocol
//
// Blob: write into ingest/<ref>/data while hashing → fsync → size check →
// digest check → exists check (dedup: a no-op) → chmod 0444 → rename into
// blobs/ → fsync the parent directory → index record. A crash after the
// rename leaves a verified blob without a record, which Open adopts.
//
// Artifact version: every blob present → tree of hardlinks built under tmp/
// → renamed to models/<name>/<revision> → one bbolt transaction records the
// version Ready and sets current → the current symlink is swapped with
// renameio. A staged commit (VersionSpec.Stage, a rollout's prefetch)
// stops after recording the version Ready: current stays; Activate later
// sets current in one transaction and swaps the symlink (where two
// versions name one HF ref, refs/ names the current one). Open removes trees without a Ready record, re-materializes
// trees whose record is Ready, marks records whose blobs are gone Missing
// (the daemon re-fetches them), and re-points current symlinks.
//
// # Clean shutdown
//
// That repair walks every blob, tree and current link: seconds over tens
// of thousands of artifacts. Close, with every mutation finished (it takes
// the store lock), syncs the filesystem (syncfs) and then records
// meta/clean = the id of that very bbolt transaction. Open skips the walk
// only when meta/clean equals the id of the last committed transaction,
// that is when nothing wrote to the index since a clean Close (an older
// binary, a crashed run: any write transaction makes the record stale), and
// its first write deletes the record, so a crash of this run is repaired at
// the next Open. It still empties tmp/ and reclaims stale ingests, which
// are not per artifact. What changed on disk behind a stopped daemon's back
// is found by verify (modelctl verify), not at start.
package cachestore
