// Package peer lets the daemons of one cluster fetch verified blobs from
// each other, so that the origin serves each byte about once. A daemon
// serves its committed blobs by digest (Server, on its own port, to
// callers an Authenticator accepts) and fetches blobs from a list of
// peers before the origin (Fetcher). A peer is an untrusted mirror: its
// bytes go into the same partial ingest as the origin's, the store's
// size and digest check decides what commits, and a peer that fails in
// any way is set aside for a while.
//
// The wire: GET or HEAD /v1/blobs/sha256:<hex>, one Range (bytes=a-b,
// a-, -n; 206 with Content-Range, 416 for anything else), header
// "Authorization: Bearer <token>"; 401 without an accepted token, 404
// for a blob not held or not given to the caller (the two alike), 503 with Retry-After when the uploads are all
// busy or the token cannot be checked now. No redirects either way.
//
// Bytes flow before a blob is whole: a blob this node is still fetching
// is served as well as a committed one, from ahead of the caller (more
// written here than where its Range starts), the bytes written and
// hashed so far at once and the rest as they land, with the whole
// blob's Content-Length; a fetch that stops short cuts the answer short
// (the caller goes on from where it got to, elsewhere). A receiver that
// is itself still fetching serves its part onward the same way, tier
// after tier. Nothing of it is trusted: every receiver checks the whole
// blob's digest before it commits. A request may carry HeaderWait
// ("X-Modelcache-Wait: <seconds>"): a blob not here yet is then not a
// 404 at once; the request is held (at most WithMaxWait, 60s, and
// WithMaxWaiting at once; 503 with Retry-After beyond) and answered as
// soon as the blob is here, committed or growing, or with a 404 when
// the wait ends. A held request opens nothing and waits on the store's
// word (WatchBlob), not a timer.
//
// Who may fetch: in Kubernetes, a daemon presents a projected
// service-account token of its own account for audience DefaultAudience
// (a serviceAccountToken volume with that audience), re-read from its
// file on each request; the serving daemon checks it with a TokenReview
// (its account needs create on tokenreviews: bind system:auth-delegator)
// and accepts only its own account, so pods and users, whatever their
// tokens, are never served. The projected token is bound to the daemon's
// pod, and the review names that pod and the node it runs on
// (Identity.Pod, Identity.Node); the server adds the address the request
// came from (Identity.Source): the serving daemon's Authorizer
// (WithAuthorizer) then decides which blobs that node may have, and gives
// private ones only to a request from the pod's address, so a token
// stolen from one node, or received by a node that advertised itself as
// a peer, fetches only what that node could fetch anyway. Outside Kubernetes every daemon reads one
// shared token file (StaticTokenAuthenticator on the serving side, the
// same file as the Fetcher's TokenSource); it names no node, and a
// static fleet serves every committed blob to it. A network policy that admits
// the peer port only from the DaemonSet's pods is a second fence, not a
// substitute.
//
// Where to find what:
//
//	server.go     Server (the http.Handler), Blobs (what it serves from:
//	              committed and growing blobs), the upload bounds, the Range parser
//	wait.go       requests held for a blob not here yet (HeaderWait), their bounds
//	blobs.go      StoreBlobs: Blobs over a cachestore.Store, with a lease per transfer
//	auth.go       Authenticator and the Identity it returns (the node and
//	              pod a token is bound to); Authorizer; TokenReviewAuthenticator (a
//	              projected service-account token of the daemon's own account
//	              and audience, checked with a TokenReview, cached);
//	              StaticTokenAuthenticator (a shared token file, systemd)
//	tokenclaims.go what a token claims, read unverified (TokenReviewAuthenticator
//	              refuses one that cannot be a daemon's without a review), and
//	              the review budget of each source address (WithSource)
//	tokenfile.go  TokenFile: a token read from a file again when it changes
//	fetch.go      Fetcher: a blob from peers, then the origin, into a
//	              partial ingest (Fetch) and committed (Ingest)
//	transfer.go   one peer's GET: the blob's URL, the answer checked (status,
//	              length, Range) and streamed at a progress floor
//	avoid.go      peers set aside by reason, for a time that grows with
//	              their failures
//	picker.go     Pick: the peers that hold a revision, from ModelCacheNode statuses
//	metrics.go    Metrics: the modelcache_peer_* collectors the daemon registers
package peer
