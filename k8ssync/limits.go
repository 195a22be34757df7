package k8ssync

import (
	"strconv"
	"unicode/utf8"

	"github.com/modelcache/modelcache/fetchers"
)

// Caps on what a status copies. A status is one object, written whole,
// and the API server refuses one over about 1.5 MB (etcd's request
// limit): a node whose status cannot be written stops reporting, and a
// rollout that waits for every node stalls. Every string the loop copies
// into a status from the daemon, a fetcher or another node's report is
// clipped to its cap, with a marker that says so.
const (
	// MaxStatusURI caps a URI (an artifact's source, a rollout's next
	// source). The CRD caps a ModelCache's sources at 2048 bytes, so a
	// pinned URI of the cluster is never clipped; a socket pull's URI
	// (api.MaxURIBytes, 8 KiB) may be.
	MaxStatusURI = 4 << 10
	// MaxStatusMessage caps a message (an artifact's, its next's, a
	// resolution's error, a rollout's).
	MaxStatusMessage = 1 << 10
	// MaxStatusField caps a short field: a revision, a digest, a reason,
	// a kind, a holder, a pod's name, a time.
	MaxStatusField = 320
	// MaxStatusHolders is how many holders (inUseBy) and pods an
	// artifact lists; a last entry counts the rest.
	MaxStatusHolders = 32
	// MaxNodePods is how many pods an artifact of one node lists (by
	// name; the first in order): more pods on one node mounting one
	// model are not counted in the ModelCache's podCount.
	MaxNodePods = 64
	// MaxNodeStatusBytes is the budget of a ModelCacheNode's status:
	// artifacts past it (those of no ModelCache first) are left out, and
	// status.problems says how many.
	MaxNodeStatusBytes = 512 << 10
)

// clip is s cut to at most n bytes (at a UTF-8 boundary), ending in a
// marker that gives its full length; s itself when it fits.
func clip(s string, n int) string { return clipOf(s, n, len(s)) }

// clipText is a message from the daemon or a fetcher redacted
// (fetchers.RedactText) and clipped to n. Only its first 4n bytes are
// redacted: what follows is cut anyway, and a message of megabytes costs
// no more than a short one.
func clipText(s string, n int) string {
	total := len(s)
	if total > 4*n {
		s = s[:4*n]
	}
	return clipOf(fetchers.RedactText(s), n, total)
}

// clipOf clips s, a part of a text of total bytes, to n.
func clipOf(s string, n, total int) string {
	if len(s) <= n && total == len(s) {
		return s
	}
	marker := "… [clipped: " + strconv.Itoa(total) + " bytes]"
	cut := max(n-len(marker), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + marker
}

// clipList is l with each entry clipped to MaxStatusField and at most
// MaxStatusHolders entries, the last one then counting those left out.
func clipList(l []string) []string {
	if len(l) == 0 {
		return l
	}
	out := make([]string, 0, min(len(l), MaxStatusHolders))
	for i, s := range l {
		if i == MaxStatusHolders-1 && len(l) > MaxStatusHolders {
			out = append(out, "… and "+strconv.Itoa(len(l)-i)+" more")
			break
		}
		out = append(out, clip(s, MaxStatusField))
	}
	return out
}
