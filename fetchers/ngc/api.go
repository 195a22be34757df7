package ngc

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	nethttp "net/http"
	"strings"

	"github.com/modelcache/modelcache/fetchers"
	httpfetcher "github.com/modelcache/modelcache/fetchers/http"
)

// apiGet GETs an API URL, with r's token unless guest, and decodes its
// JSON into v. A 401 to a cached token fetches a new one and asks once
// more. An error status comes back as a *statusError.
func (f *Fetcher) apiGet(ctx context.Context, r Ref, u, what string, guest bool, v any) error {
	for attempt := 0; ; attempt++ {
		h := nethttp.Header{}
		fresh := false
		if !guest {
			var err error
			if h, fresh, err = f.header(ctx, r, attempt > 0); err != nil {
				return err
			}
		}
		req, err := nethttp.NewRequestWithContext(ctx, nethttp.MethodGet, u, nil)
		if err != nil {
			return fetchers.Permanent(err)
		}
		req.Header = h
		req.Header.Set("Accept", "application/json")
		req.Header.Set("User-Agent", f.opts.UserAgent)
		resp, err := f.client.Do(req)
		if err != nil {
			return fmt.Errorf("GET %s: %w", u, err)
		}
		if resp.StatusCode == nethttp.StatusUnauthorized && h.Get("Authorization") != "" && !fresh && attempt == 0 {
			resp.Body.Close()
			continue // the token expired early or was revoked: one more try with a new one
		}
		defer resp.Body.Close()
		if resp.StatusCode != nethttp.StatusOK {
			err := f.apiError(r, what, "", guest)(resp)
			if err == nil {
				err = httpfetcher.StatusError(u, resp)
			}
			return &statusError{code: resp.StatusCode, err: err}
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxAPIBody+1))
		if err != nil {
			return fmt.Errorf("GET %s: %w", u, err)
		}
		if len(body) > maxAPIBody {
			return fetchers.Permanent(fmt.Errorf("GET %s: answer larger than %d bytes; refusing it", u, maxAPIBody))
		}
		if err := json.Unmarshal(body, v); err != nil {
			return fetchers.Permanent(fmt.Errorf("GET %s: the %s answer is not what NGC sends: %v", u, what, err))
		}
		return nil
	}
}

// apiError explains the registry's error answers; what is "model",
// "version", "files" (the listing), "manifest" or "file" (a download of
// file). guest says the request carried no token.
func (f *Fetcher) apiError(r Ref, what, file string, guest bool) func(*nethttp.Response) error {
	return func(resp *nethttp.Response) error {
		switch resp.StatusCode {
		case nethttp.StatusUnauthorized, nethttp.StatusForbidden:
			if guest {
				return fetchers.Permanent(fmt.Errorf("%s: %w (HTTP %d): the model is not public; no NGC API key is set: give one with access to org %q%s in NGC_API_KEY (or NGC_CLI_API_KEY), NGC_API_KEY_FILE, the ModelCache Secret's NGC_API_KEY or a models.d credentialsFile",
					r, fetchers.ErrUnauthorized, resp.StatusCode, r.Org, teamClause(r)))
			}
			return fetchers.Permanent(fmt.Errorf("%s: %w (HTTP %d): NGC_API_KEY has no read access to this model under scope %s; the key's user needs the registry read role in org %q%s",
				r, fetchers.ErrUnauthorized, resp.StatusCode, r.scopeName(), r.Org, teamClause(r)))
		case nethttp.StatusPreconditionFailed:
			return fetchers.Permanent(fmt.Errorf("%s: %w (HTTP 412): the model's licence must be accepted before it can be downloaded: sign in to ngc.nvidia.com as the key's user, open the model and accept its licence terms, then pull again", r, fetchers.ErrUnauthorized))
		case nethttp.StatusBadRequest:
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
			if low := strings.ToLower(string(b)); strings.Contains(low, "org contex") {
				who := "NGC_API_KEY's token"
				if guest {
					who = "a request without NGC_API_KEY"
				}
				return fetchers.Permanent(fmt.Errorf("%s: %w (HTTP 400, \"org context missing\"): NGC serves this %s only to a token of org %q, and %s carries none; give a key of that org in NGC_API_KEY", r, fetchers.ErrUnauthorized, what, r.Org, who))
			}
		case nethttp.StatusNotFound:
			private := ""
			if guest {
				private = fmt.Sprintf("; a private model answers so without a key: give one with access to org %q in NGC_API_KEY", r.Org)
			}
			switch what {
			case "model":
				return fetchers.Permanent(fmt.Errorf("%s: %w: NGC has no model %s in org %q%s (HTTP 404); check the names (a private model may also answer 404 to a key without access)%s", r, fetchers.ErrNotFound, r.Model, r.Org, teamClause(r), private))
			case "version", "files":
				return fetchers.Permanent(fmt.Errorf("%s: %w: NGC has no version %q of this model (HTTP 404), or no such model; list its versions with `ngc registry model list %s`%s", r, fetchers.ErrNotFound, r.Version, strings.TrimPrefix(Ref{Org: r.Org, Team: r.Team, Model: r.Model + ":*"}.String(), "ngc://"), private))
			}
			return fetchers.Permanent(fmt.Errorf("%s: %w: file %s is listed in the version but NGC does not serve it (HTTP 404)", r, fetchers.ErrNotFound, file))
		case nethttp.StatusTooManyRequests:
			return fmt.Errorf("%s: NGC rate limit: %w", r, httpfetcher.StatusError(r.String(), resp))
		}
		return nil
	}
}

// statusError is an API answer other than 200, as apiError explains it.
type statusError struct {
	code int
	err  error
}

func (e *statusError) Error() string { return e.err.Error() }

func (e *statusError) Unwrap() error { return e.err }
