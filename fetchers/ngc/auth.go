package ngc

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	nethttp "net/http"
	"strings"
	"time"

	"github.com/modelcache/modelcache/fetchers"
	httpfetcher "github.com/modelcache/modelcache/fetchers/http"
)

type token struct {
	value   string
	expires time.Time
}

// tokenFor returns the bearer token for r's scope ("" without a key) and
// whether it was fetched just now. force asks for a new one.
func (f *Fetcher) tokenFor(ctx context.Context, r Ref, force bool) (string, bool, error) {
	if f.key == "" {
		return "", false, nil
	}
	if strings.HasPrefix(f.key, "nvapi-") {
		return f.key, false, nil
	}
	scope := r.scope()
	f.mu.Lock()
	t, ok := f.tokens[scope]
	f.mu.Unlock()
	if ok && !force && f.now().Before(t.expires.Add(-refreshBefore)) {
		return t.value, false, nil
	}
	req, err := nethttp.NewRequestWithContext(ctx, nethttp.MethodGet, f.auth+"/token?"+scope, nil)
	if err != nil {
		return "", false, fetchers.Permanent(err)
	}
	req.SetBasicAuth("$oauthtoken", f.key)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", f.opts.UserAgent)
	resp, err := f.client.Do(req)
	if err != nil {
		return "", false, fmt.Errorf("NGC token endpoint %s: %w", f.auth, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case nethttp.StatusOK:
	case nethttp.StatusUnauthorized:
		return "", false, fetchers.Permanent(fmt.Errorf("%s: %w: the NGC token endpoint rejected NGC_API_KEY (HTTP 401): the key is wrong, revoked or expired; make a new one (ngc.nvidia.com, Setup, API Key) and give it in NGC_API_KEY, NGC_API_KEY_FILE or the Secret's NGC_API_KEY", r, fetchers.ErrUnauthorized))
	case nethttp.StatusForbidden:
		return "", false, fetchers.Permanent(fmt.Errorf("%s: %w: the NGC token endpoint refused scope %s to NGC_API_KEY (HTTP 403): the key's user is not a member of org %q%s; ask the org's admin, or use a key of that org", r, fetchers.ErrUnauthorized, r.scopeName(), r.Org, teamClause(r)))
	default:
		return "", false, httpfetcher.StatusError("NGC token endpoint "+f.auth, resp)
	}
	var body struct {
		Token     string `json:"token"`
		ExpiresIn int64  `json:"expires_in"`
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", false, fmt.Errorf("NGC token endpoint %s: %w", f.auth, err)
	}
	if err := json.Unmarshal(b, &body); err != nil || body.Token == "" || strings.ContainsAny(body.Token, "\r\n") {
		return "", false, fetchers.Permanent(fmt.Errorf("NGC token endpoint %s: the answer holds no token", f.auth))
	}
	ttl := defaultTTL
	if body.ExpiresIn > 0 {
		ttl = time.Duration(body.ExpiresIn) * time.Second
	}
	f.mu.Lock()
	f.tokens[scope] = token{value: body.Token, expires: f.now().Add(ttl)}
	f.mu.Unlock()
	return body.Token, true, nil
}

// forget drops a cached token that the API refused.
func (f *Fetcher) forget(r Ref) {
	f.mu.Lock()
	delete(f.tokens, r.scope())
	f.mu.Unlock()
}

// header is the Authorization of a request for r.
func (f *Fetcher) header(ctx context.Context, r Ref, force bool) (nethttp.Header, bool, error) {
	tok, fresh, err := f.tokenFor(ctx, r, force)
	if err != nil {
		return nil, false, err
	}
	h := nethttp.Header{}
	if tok != "" {
		h.Set("Authorization", "Bearer "+tok)
	}
	return h, fresh, nil
}
