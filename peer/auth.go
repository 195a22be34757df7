package peer

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"

	"github.com/modelcache/modelcache/internal/expiring"
)

// ErrUnauthenticated is wrapped by an Authenticator's answer for a
// token it rejects. Any other error means it could not decide (the API
// server is unreachable): the server answers 503, not 401, and caches
// nothing.
var ErrUnauthenticated = errors.New("unauthenticated")

// Authenticator decides whether a bearer token belongs to a daemon of
// this cluster, and whose. Implementations are safe for concurrent use.
type Authenticator interface {
	// Authenticate returns the caller of a token it accepts, an error
	// wrapping ErrUnauthenticated for one it rejects, any other error
	// when it cannot decide.
	Authenticate(ctx context.Context, token string) (Identity, error)
}

// Identity is the caller an Authenticator accepted: what an Authorizer
// decides on.
type Identity struct {
	// User is the account the token is of
	// ("system:serviceaccount:<namespace>:<name>"); "" for the shared
	// token of a static fleet, which names nobody.
	User string
	// Node is the node the token is bound to, as the API server vouches
	// for it (the TokenReview's extra NodeNameExtra): a projected token
	// of a pod scheduled on that node, or a token bound to the Node
	// object itself. "" when the token names no node (a token bound to
	// nothing, the shared token): such a caller is no node in
	// particular, and an Authorizer gives it only what any daemon may
	// have.
	Node string
	// Namespace, Pod and PodUID name the pod a projected token is bound
	// to (the namespace from User, the pod from the review's extra
	// PodNameExtra and PodUIDExtra); "" for a token bound to a Node or to
	// nothing.
	Namespace, Pod, PodUID string
	// Source is the address the request came from (the Server sets it
	// from the connection; an Authenticator leaves it zero). A token is
	// a bearer credential: the one a daemon sent to a peer it was told of
	// can be replayed from anywhere, so an Authorizer gives private
	// blobs only to a Source that is an address of the token's pod (or
	// Node).
	Source netip.Addr
}

// ErrForbidden is wrapped by an Authorizer's answer for a blob the
// caller may not have.
var ErrForbidden = errors.New("forbidden")

// Authorizer decides whether an authenticated caller may have one blob
// (Server asks it before anything of the blob is opened or said).
// Implementations are safe for concurrent use.
type Authorizer interface {
	// Authorize returns nil when caller may have blob digest (always
	// "sha256:<64 lowercase hex>": the server validated it); an error
	// wrapping ErrForbidden when it may not; one wrapping
	// cachestore.ErrNotFound for a blob the authorizer knows of no
	// holder of (counted as not found); any other error when it cannot
	// decide now. The server answers every one of these alike (404), so
	// a caller cannot tell a blob it may not have from one not held.
	Authorize(ctx context.Context, caller Identity, digest string) error
}

// The keys of a TokenReview's user.extra that name what a token is
// bound to: its node (the Node itself, or the node of the pod), and the
// pod.
const (
	NodeNameExtra = "authentication.kubernetes.io/node-name"
	PodNameExtra  = "authentication.kubernetes.io/pod-name"
	PodUIDExtra   = "authentication.kubernetes.io/pod-uid"
)

// ErrSourceMismatch is wrapped by an Authorizer's answer for a request
// that does not come from an address of the pod or Node its token is
// bound to (a token replayed from elsewhere); it wraps ErrForbidden.
var ErrSourceMismatch = fmt.Errorf("%w: the request does not come from the token's pod or node", ErrForbidden)

// DefaultAudience is the audience of the projected service-account token
// that daemons present to each other: a token minted for the API server
// (or anything else) is not accepted by a peer, and a peer's token is
// useless to the API server.
const DefaultAudience = "modelcache-peer"

// StaticTokenAuthenticator accepts the one token held in a file (the
// shared token of a systemd fleet, outside Kubernetes). The file is
// stat'ed on each request and read again when it changed (TokenFile), so
// rotating the token needs no restart.
type StaticTokenAuthenticator struct {
	File *TokenFile
}

// Authenticate compares token with the file's in constant time; the
// caller it accepts is the zero Identity (the shared token names no one).
// A file that cannot be read rejects every token (ErrUnauthenticated):
// the feature is misconfigured, and the error says why for the log.
func (a StaticTokenAuthenticator) Authenticate(_ context.Context, token string) (Identity, error) {
	want, err := a.File.Token()
	if err != nil {
		return Identity{}, fmt.Errorf("%w: %v", ErrUnauthenticated, err)
	}
	// Compare digests: equal lengths, so the time says nothing of the
	// token's length either.
	w, g := sha256.Sum256([]byte(want)), sha256.Sum256([]byte(token))
	if subtle.ConstantTimeCompare(w[:], g[:]) != 1 {
		return Identity{}, fmt.Errorf("%w: not the shared token of %s", ErrUnauthenticated, a.File.Path())
	}
	return Identity{}, nil
}

// TokenReviewAuthenticator accepts a projected service-account token of
// one service account (the daemon's own: only daemons of this cluster are
// peers, never pods or users) for one audience, checked with a
// TokenReview. The caller it accepts carries the node its token is bound
// to (Identity.Node, from the review's user.extra NodeNameExtra).
//
// The peer port is open to any pod that can reach it, so what a caller
// sends must cost the API server nothing unless it could be a daemon's
// token:
//   - a token whose claims (read without verifying them: the review
//     does) cannot be a daemon's is refused without a review: not a JWT,
//     no exp ahead, not for the audience, not of the daemon's service
//     account, not of Issuer (when set: the daemon's own token's), over
//     MaxTokenBytes;
//   - the reviews of tokens the cache does not know are limited per
//     source address (ReviewBurst at once, one per ReviewEvery after;
//     a review that accepts its token gives its share back, so the
//     daemons behind one address are limited only in how many of
//     their new tokens are reviewed at once);
//     past that a caller is told to come back later (an error that is
//     not ErrUnauthenticated: the server answers 503 with Retry-After);
//   - acceptances (until the token's exp) and refusals (for NegativeTTL)
//     are cached apart, each least recently used first out, so a flood
//     of refused tokens never pushes out an accepted one. The
//     acceptances hold max(MaxEntries, AcceptedPerNode × the fleet's
//     node count, SetFleetSize) tokens, by their SHA-256, never the token
//     itself.
//
// Use NewTokenReviewAuthenticator; set the fields before first use.
type TokenReviewAuthenticator struct {
	reviews  authv1client.TokenReviewInterface
	audience string
	user     string
	// Issuer, when set, is the iss claim every daemon's token carries
	// (IssuerOf the daemon's own token): a token of another issuer is
	// refused without a review.
	Issuer string
	// NegativeTTL is how long a refusal is remembered; MaxEntries is
	// the least the acceptance cache holds (the floor of the fleet's
	// size); RefusedEntries bounds the refusal cache; ReviewBurst and
	// ReviewEvery limit each source address's reviews; Now is the clock.
	NegativeTTL    time.Duration
	MaxEntries     int
	RefusedEntries int
	ReviewBurst    int
	ReviewEvery    time.Duration
	Now            func() time.Time

	fleet    atomic.Int64
	accepted expiring.Map[[32]byte, Identity]
	refused  expiring.Map[[32]byte, string]
	limits   sourceLimits
	flight   singleflight.Group
}

// AcceptedPerNode is how many tokens of each node the acceptance cache
// has room for: a daemon's projected token is replaced before it
// expires, and a node's daemon restarts now and then.
const AcceptedPerNode = 4

// MaxTokenBytes bounds a token that may be reviewed: a projected
// service-account token is a couple of KiB.
const MaxTokenBytes = 16 << 10

// ErrTooManyReviews is returned by TokenReviewAuthenticator for a token
// it does not know from a source address that has had its reviews for
// now: it is neither accepted nor refused (the server answers 503 with
// Retry-After, and caches nothing).
var ErrTooManyReviews = errors.New("too many unknown tokens from this address; try again later")

// NewTokenReviewAuthenticator checks tokens with reviews (a clientset's
// AuthenticationV1().TokenReviews(); the daemon's service account needs
// create on tokenreviews, as the system:auth-delegator ClusterRole
// grants) for audience (DefaultAudience when empty), accepting only the
// service account namespace/name.
func NewTokenReviewAuthenticator(reviews authv1client.TokenReviewInterface, audience, namespace, name string) (*TokenReviewAuthenticator, error) {
	if namespace == "" || name == "" {
		return nil, fmt.Errorf("peer authentication: the daemon's service account is %q/%q; give both its namespace and its name (the DaemonSet's serviceAccountName)", namespace, name)
	}
	if audience == "" {
		audience = DefaultAudience
	}
	return &TokenReviewAuthenticator{reviews: reviews, audience: audience, user: "system:serviceaccount:" + namespace + ":" + name,
		NegativeTTL: 10 * time.Second, MaxEntries: 1024, RefusedEntries: 4096, ReviewBurst: 5, ReviewEvery: 5 * time.Second,
		Now: time.Now}, nil
}

// SetFleetSize sizes the acceptance cache for a fleet of n nodes
// (AcceptedPerNode tokens each, at least MaxEntries): every daemon of a
// large fleet may ask one origin node at once. Safe to call at any time.
func (a *TokenReviewAuthenticator) SetFleetSize(n int) { a.fleet.Store(int64(max(n, 0))) }

func (a *TokenReviewAuthenticator) capacity() int {
	return max(a.MaxEntries, int(min(a.fleet.Load(), 1<<24))*AcceptedPerNode, 1)
}

// Authenticate answers from the caches, refuses a token that cannot be
// a daemon's, or asks the API server (within the limit of the request's
// source: WithSource).
func (a *TokenReviewAuthenticator) Authenticate(ctx context.Context, token string) (Identity, error) {
	if token == "" {
		return Identity{}, fmt.Errorf("%w: no token", ErrUnauthenticated)
	}
	key, now := sha256.Sum256([]byte(token)), a.Now()
	if who, hit := a.accepted.Get(key, now); hit {
		return who, nil
	}
	if why, hit := a.refused.Get(key, now); hit {
		return Identity{}, fmt.Errorf("%w: %s (refused recently)", ErrUnauthenticated, why)
	}
	// Only a token whose claims are a daemon's can pass a review:
	// anything else is refused here, so garbage and forgeries cost the
	// API server nothing.
	exp, why := a.plausible(token, now)
	if why != "" {
		a.refuse(key, why, now)
		return Identity{}, fmt.Errorf("%w: %s", ErrUnauthenticated, why)
	}
	// One review per token at a time: the uploads a new peer starts at
	// once share it (and its source's limit is taken once).
	src := SourceOf(ctx)
	res, err, _ := a.flight.Do(string(key[:]), func() (any, error) {
		if !a.limits.take(src, now, a.ReviewBurst, a.ReviewEvery) {
			return nil, ErrTooManyReviews
		}
		tr, err := a.reviews.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{
			Token: token, Audiences: []string{a.audience}}}, metav1.CreateOptions{})
		if err != nil {
			return nil, err
		}
		if tr.Status.Authenticated && tr.Status.User.Username == a.user {
			a.limits.give(src, a.ReviewBurst) // a daemon's token: its review costs its address nothing
		}
		return tr.Status, nil
	})
	if errors.Is(err, ErrTooManyReviews) {
		return Identity{}, fmt.Errorf("peer authentication from %s: %w", src, err)
	}
	if err != nil {
		return Identity{}, fmt.Errorf("peer authentication: TokenReview: %w", err)
	}
	st := res.(authenticationv1.TokenReviewStatus)
	reject := ""
	switch {
	case !st.Authenticated:
		reject = "the API server does not accept the token"
		if st.Error != "" {
			reject += " (" + clipText(st.Error, 200) + ")"
		}
	case !hasAudience(st.Audiences, a.audience):
		reject = "the token is not for audience " + a.audience
	case st.User.Username != a.user:
		reject = "the token is " + clipText(st.User.Username, 200) + "'s, not " + a.user + "'s"
	}
	if reject != "" {
		a.refuse(key, reject, now)
		return Identity{}, fmt.Errorf("%w: %s", ErrUnauthenticated, reject)
	}
	who := identity(st.User)
	a.accepted.Put(key, who, exp, now, a.capacity())
	return who, nil
}

func (a *TokenReviewAuthenticator) refuse(key [32]byte, why string, now time.Time) {
	a.refused.Put(key, why, now.Add(a.NegativeTTL), now, max(a.RefusedEntries, 1))
}

// identity is the caller a reviewed token names: its account, and the
// node and pod it is bound to (a pod only with both its name and uid).
func identity(u authenticationv1.UserInfo) Identity {
	who := Identity{User: u.Username, Node: extraOf(u.Extra, NodeNameExtra)}
	pod, uid := extraOf(u.Extra, PodNameExtra), extraOf(u.Extra, PodUIDExtra)
	sa, isSA := strings.CutPrefix(u.Username, "system:serviceaccount:")
	if ns, _, ok := strings.Cut(sa, ":"); isSA && ok && pod != "" && uid != "" {
		who.Namespace, who.Pod, who.PodUID = ns, pod, uid
	}
	return who
}

// extraOf is the one value of a reviewed token's extra key, else ""
// (none, or a list that names no single one).
func extraOf(extra map[string]authenticationv1.ExtraValue, key string) string {
	if v := extra[key]; len(v) == 1 {
		return v[0]
	}
	return ""
}

// Cached is how many verdicts the caches hold, acceptances and
// refusals.
func (a *TokenReviewAuthenticator) Cached() int { return a.accepted.Len() + a.refused.Len() }

// CachedAccepted is how many acceptances the cache holds.
func (a *TokenReviewAuthenticator) CachedAccepted() int { return a.accepted.Len() }

func hasAudience(auds []string, want string) bool { return slices.Contains(auds, want) }
