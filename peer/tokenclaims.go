package peer

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"
)

// What a bearer token says before anyone verified it, and the review
// budget of each source address: how TokenReviewAuthenticator keeps a
// flood on the peer port from reaching the API server.

// claims are those of a service-account token that say whose it is.
type claims struct {
	Exp *json.Number    `json:"exp"`
	Nbf *json.Number    `json:"nbf"`
	Iss string          `json:"iss"`
	Sub string          `json:"sub"`
	Aud json.RawMessage `json:"aud"`
}

// plausible is the exp of a token whose claims, unverified, could be a
// daemon's, or why they cannot be.
func (a *TokenReviewAuthenticator) plausible(token string, now time.Time) (time.Time, string) {
	if len(token) > MaxTokenBytes {
		return time.Time{}, fmt.Sprintf("a token of %d bytes; a service-account token has at most %d", len(token), MaxTokenBytes)
	}
	c, err := readClaims(token)
	if err != nil {
		return time.Time{}, "not a service-account token: " + err.Error()
	}
	exp, ok := unixTime(c.Exp)
	switch {
	case !ok:
		return time.Time{}, "not a service-account token: no exp claim"
	case !now.Before(exp):
		return time.Time{}, "the token expired"
	case c.Nbf != nil && !validNotBefore(c.Nbf, now):
		return time.Time{}, "the token is not valid yet (nbf)"
	case c.Sub != a.user:
		return time.Time{}, "the token's subject is not " + a.user
	case a.Issuer != "" && c.Iss != a.Issuer:
		return time.Time{}, "the token's issuer is not " + a.Issuer + " (the daemon's own token's)"
	case !audienceHas(c.Aud, a.audience):
		return time.Time{}, "the token is not for audience " + a.audience
	}
	return exp, ""
}

// validNotBefore: nbf is no later than a minute from now (clocks
// differ a little between nodes).
func validNotBefore(nbf *json.Number, now time.Time) bool {
	t, ok := unixTime(nbf)
	return ok && !t.After(now.Add(time.Minute))
}

// IssuerOf is the iss claim of a JWT, read without verification (a
// daemon reads its own projected token's: every peer's is the same), ""
// when it has none.
func IssuerOf(token string) string {
	c, err := readClaims(token)
	if err != nil {
		return ""
	}
	return c.Iss
}

// readClaims decodes a JWT's payload without verifying anything: three
// base64url parts, a header with an algorithm, a JSON object payload.
func readClaims(token string) (claims, error) {
	var c claims
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[2] == "" {
		return c, errors.New("not a JWT (header.payload.signature)")
	}
	head, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil {
		return c, errors.New("a JWT header that is not base64url")
	}
	var h struct {
		Alg string `json:"alg"`
	}
	if json.Unmarshal(head, &h) != nil || h.Alg == "" || strings.EqualFold(h.Alg, "none") {
		return c, errors.New("a JWT header without a signing algorithm")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return c, errors.New("a JWT payload that is not base64url")
	}
	if err := json.Unmarshal(payload, &c); err != nil {
		return c, errors.New("a JWT payload that is not a JSON object of claims")
	}
	return c, nil
}

// audienceHas reports whether a JWT's aud (a string or a list of them)
// names want.
func audienceHas(raw json.RawMessage, want string) bool {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one == want
	}
	var many []string
	return json.Unmarshal(raw, &many) == nil && slices.Contains(many, want)
}

func unixTime(n *json.Number) (time.Time, bool) {
	if n == nil {
		return time.Time{}, false
	}
	sec, err := n.Int64()
	if err != nil || sec <= 0 {
		return time.Time{}, false
	}
	return time.Unix(sec, 0), true
}

func clipText(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// sourceLimits are the review budgets of source addresses: a token
// bucket each, at most maxSources remembered (a full bucket is as good
// as none, so those go first).
type sourceLimits struct {
	mu sync.Mutex
	m  map[netip.Addr]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

const maxSources = 8192

// take spends one of src's reviews at now, if it has one: burst at
// once, one more per every.
func (l *sourceLimits) take(src netip.Addr, now time.Time, burst int, every time.Duration) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[netip.Addr]*bucket{}
	}
	refill := func(b *bucket) {
		if every > 0 && now.After(b.at) {
			b.tokens = min(float64(burst), b.tokens+float64(now.Sub(b.at))/float64(every))
		}
		b.at = now
	}
	b := l.m[src]
	if b == nil {
		if len(l.m) >= maxSources {
			for k, o := range l.m {
				if refill(o); o.tokens >= float64(burst) {
					delete(l.m, k)
				}
			}
			if len(l.m) >= maxSources {
				return false // a flood from this many addresses waits for its buckets to fill
			}
		}
		b = &bucket{tokens: float64(burst), at: now}
		l.m[src] = b
	}
	refill(b)
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// sourceKey carries the request's source address to an Authenticator.
type sourceKey struct{}

// WithSource is ctx carrying the address a request came from: the
// Server sets it before it asks its Authenticator, which may limit by it.
func WithSource(ctx context.Context, src netip.Addr) context.Context {
	return context.WithValue(ctx, sourceKey{}, src)
}

// SourceOf is the address WithSource put in ctx; the zero Addr when none.
func SourceOf(ctx context.Context) netip.Addr {
	src, _ := ctx.Value(sourceKey{}).(netip.Addr)
	return src
}

// give returns one review to src (one that accepted its token), up to
// burst.
func (l *sourceLimits) give(src netip.Addr, burst int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if b := l.m[src]; b != nil {
		b.tokens = min(float64(burst), b.tokens+1)
	}
}
