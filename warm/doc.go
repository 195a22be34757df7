// Package warm reads a committed model tree into the page cache ahead of
// the process about to load it, so that a pod's first read runs at the
// speed of memory rather than the disk's. It knows nothing about the
// store's index, the daemon or Kubernetes: it is given a key (the
// revision), the tree's directory and who asked.
//
// Where to find what:
//
//	plan.go     Plan: the order a loader reads a tree (configs and tokenizers,
//	            safetensors shards in index order, each header first then its
//	            tensors, then the rest), Item, Total
//	tree.go     the confined walk and opens: openat2 RESOLVE_BENEATH beneath the
//	            tree's directory; a symlink leading out is ErrEscape
//	warmer.go   Warmer (New and its options), Start/Warm, Run (Wait, Progress),
//	            Result and Reason: one warm per key (a second request joins it),
//	            a token bucket of starts per caller, a budget shared by the
//	            running warms
//	cursor.go   the chunked read loop (cursor): skips what is resident, yields to
//	            others' I/O, stops at the budget or when the consumer overtakes it
//	mincore.go  residency: a read-only mapping per file and mincore(2); Resident
//	            for modelctl inspect
//	budget.go   MemAvailable, Budget (a share of it, never more than the model),
//	            DefaultShare
//	devstat.go  the block device's I/O counters, to yield while others read or
//	            write it (WithYield)
//	ioprio.go   the warming thread's idle I/O priority (ioprio_set)
//	metrics.go  Metrics: the modelcache_warm_* counters for the daemon's registry
//
// Promises: a warm reads only beneath its tree and through no symlink
// that leaves it; it takes no lock of the store; it reads at most its
// budget of bytes that were not resident (all running warms share one
// budget: a share of MemAvailable at the start, and an optional node
// limit); it runs on a thread of its own at idle I/O priority (which the
// block layer honours under BFQ and mq-deadline, not under none).
// Residency is read with mincore(2), which reports the page cache
// only to the file's owner, a process with write access or one with
// CAP_FOWNER: the daemon owns the store's files, and a warm run by
// anyone else sees only pages it mapped itself, that is none.
package warm
