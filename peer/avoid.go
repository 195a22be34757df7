package peer

import (
	"errors"
	"time"
)

// Reasons a peer is set aside (label reason of modelcache_peer_avoided_total).
const (
	AvoidUnauthorized = "unauthorized" // 401 or 403: the peer does not take our token
	AvoidBusy         = "busy"         // 429 or 503 (for its Retry-After, no backoff)
	AvoidStatus       = "status"       // any other answer than 200/206/404
	AvoidRedirect     = "redirect"     // it redirected: a peer answers itself
	AvoidWrongLength  = "wrong_length" // Content-Length or Content-Range not what was asked
	AvoidTooLong      = "too_long"     // more bytes than the blob has
	AvoidShort        = "short"        // the body ended early
	AvoidStreamEnded  = "stream_ended" // a streamed answer (HeaderStreamed) ended early: the sender's own fetch did (for a second, no backoff)
	AvoidStall        = "stall"        // under the progress floor, or idle
	AvoidNetwork      = "network"      // no connection, a reset
	AvoidDigest       = "digest"       // bytes it sent failed the digest check at commit
	AvoidBadURL       = "bad_url"      // the peer's address is not an http(s) base URL
)

type peerState struct {
	failures int
	until    time.Time
	reason   string
}

// maxPeerStates is how many peers' failures the fetcher remembers
// before it forgets those no longer set aside.
const maxPeerStates = 4096

// Distrust sets aside every peer that gave bytes to res (AvoidDigest):
// for a caller that commits a Fetch itself and sees the check fail. why
// is the commit's error, for the log.
func (f *Fetcher) Distrust(res Result, why error) {
	for _, p := range res.Peers() {
		f.setAside(p, &peerError{reason: AvoidDigest, err: why})
	}
}

// Avoided reports whether peer is set aside now, and why.
func (f *Fetcher) Avoided(peer string) (bool, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := f.peers[peer]
	if st == nil || !f.o.now().Before(st.until) {
		return false, ""
	}
	return true, st.reason
}

// usable is peers without those set aside and repeats, in order.
func (f *Fetcher) usable(peers []string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.o.now()
	var out []string
	seen := map[string]bool{}
	for _, p := range peers {
		if seen[p] {
			continue
		}
		seen[p] = true
		if st := f.peers[p]; st != nil && now.Before(st.until) {
			continue
		}
		out = append(out, p)
	}
	return out
}

func (f *Fetcher) setAside(p string, err error) {
	reason, wait := AvoidNetwork, time.Duration(0)
	var pe *peerError
	if errors.As(err, &pe) {
		reason, wait = pe.reason, pe.wait
	}
	// A peer's word sets it aside no longer than this node would wait
	// for it anyway: a Retry-After of a day is a Retry-After of
	// --peer-wait.
	wait = min(wait, f.o.maxRetryAfter)
	f.mu.Lock()
	now := f.o.now()
	if len(f.peers) >= maxPeerStates { // forget peers whose time is up
		for k, st := range f.peers {
			if !now.Before(st.until) {
				delete(f.peers, k)
			}
		}
	}
	st := f.peers[p]
	if st == nil {
		st = &peerState{}
		f.peers[p] = st
	}
	var d time.Duration
	if reason == AvoidBusy || reason == AvoidStreamEnded {
		// A full peer is no failing one: it said when to come back
		// (its Retry-After, at least a second), and its uploads end
		// while ours wait; backing off further would set aside, for
		// minutes, the one peer that holds a fresh blob.
		d = max(wait, time.Second)
	} else {
		st.failures++
		d = f.o.avoidMin << min(st.failures-1, 20)
		if d > f.o.avoidMax || d <= 0 {
			d = f.o.avoidMax
		}
		d = max(d, wait)
	}
	st.until, st.reason = now.Add(d), reason
	failures := st.failures
	f.mu.Unlock()
	f.o.metrics.avoid(reason)
	f.o.log.Warn("peer set aside", "peer", p, "reason", reason, "for", d, "failures", failures, "err", err)
}

func (f *Fetcher) succeeded(p string) {
	f.mu.Lock()
	delete(f.peers, p)
	f.mu.Unlock()
}
