package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"syscall"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
)

// Client talks to modelcached over its unix socket. The zero value uses
// DefaultSocket. Safe for concurrent use.
type Client struct {
	// Socket is the path of the daemon's socket; empty means DefaultSocket.
	Socket string

	mu sync.Mutex
	hc *http.Client
}

func (c *Client) socket() string {
	if c.Socket == "" {
		return DefaultSocket
	}
	return c.Socket
}

func (c *Client) http() *http.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.hc == nil {
		sock := c.socket()
		c.hc = &http.Client{Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return dialUnix(ctx, sock)
			},
			DisableCompression: true,
		}}
	}
	return c.hc
}

// dialRetried, when set (by a test, before any dial), is called each
// time dialUnix finds the listen queue full and waits to try again.
var dialRetried func()

// dialUnix connects to the socket. A full listen queue (EAGAIN: the
// daemon is busy, or another local user floods it) is retried with a
// growing pause for up to about 10 s, so a burst does not fail a command.
func dialUnix(ctx context.Context, sock string) (net.Conn, error) {
	var d net.Dialer
	retried := dialRetried
	pause := 5 * time.Millisecond
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := d.DialContext(ctx, "unix", sock)
		if err == nil || !errors.Is(err, syscall.EAGAIN) || time.Now().After(deadline) {
			return c, err
		}
		if retried != nil {
			retried()
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(pause):
		}
		pause = min(2*pause, 500*time.Millisecond)
	}
}

// UnavailableError says the daemon could not be reached and where the
// client looked.
type UnavailableError struct {
	Socket string
	Err    error
	// Accepted says the daemon had answered the request (a stream had
	// begun) before the connection was lost: a restart, not a daemon
	// that was never reached.
	Accepted bool
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("cannot reach modelcached at %s: %v", e.Socket, e.Err)
}

// Unwrap makes errors.Is(err, ErrUnavailable) hold.
func (e *UnavailableError) Unwrap() []error { return []error{ErrUnavailable, e.Err} }

func (c *Client) do(ctx context.Context, method, path string, in any) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://modelcached"+path, body)
	if err != nil {
		return nil, err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http().Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &UnavailableError{Socket: c.socket(), Err: unwrapURL(err)}
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

func unwrapURL(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

func decodeError(resp *http.Response) error {
	e := &Error{Status: resp.StatusCode}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if json.Unmarshal(raw, e) != nil || e.Code == "" {
		e.Code = CodeInternal
		e.Message = fmt.Sprintf("daemon answered %s: %s", resp.Status, bytes.TrimSpace(raw))
	}
	return e
}

func (c *Client) call(ctx context.Context, method, path string, in, out any) error {
	resp, err := c.do(ctx, method, path, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode %s %s: %w", method, path, err)
	}
	return nil
}

// stream reads JSON lines of Events until one is Done, calling fn for each.
func (c *Client) stream(ctx context.Context, method, path string, in any, fn func(Event)) (*Artifact, error) {
	resp, err := c.do(ctx, method, path, in)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var last *Artifact
	for sc.Scan() {
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return last, fmt.Errorf("decode event: %w", err)
		}
		if ev.Artifact != nil {
			last = ev.Artifact
		}
		if fn != nil {
			fn(ev)
		}
		if ev.Error != nil {
			ev.Error.Status = HTTPStatus(ev.Error.Code)
			return last, ev.Error
		}
		if ev.Done {
			return last, nil
		}
	}
	if ctx.Err() != nil {
		return last, ctx.Err()
	}
	if err := sc.Err(); err != nil {
		return last, &UnavailableError{Socket: c.socket(), Err: err, Accepted: true}
	}
	return last, &UnavailableError{Socket: c.socket(), Err: errors.New("the stream ended before the artifact settled (modelcached stopped or restarted)"), Accepted: true}
}

// Health returns nil when the daemon serves.
func (c *Client) Health(ctx context.Context) error { return c.call(ctx, "GET", "/v1/health", nil, nil) }

// Status returns the daemon's status.
func (c *Client) Status(ctx context.Context) (*Status, error) {
	var s Status
	return &s, c.call(ctx, "GET", "/v1/status", nil, &s)
}

// List returns every artifact the daemon knows.
func (c *Client) List(ctx context.Context) ([]Artifact, error) {
	return getArray[Artifact](ctx, c, "/v1/artifacts")
}

// ListRows is List with only the fields of ArtifactRow (what modelctl
// list's table shows) sent and decoded.
func (c *Client) ListRows(ctx context.Context) ([]ArtifactRow, error) {
	return getArray[ArtifactRow](ctx, c, "/v1/artifacts?fields=row")
}

// HeaderCount is the response header in which the daemon says how many
// elements an array answer holds, so that a client sizes its slice once.
const HeaderCount = "X-Modelcache-Count"

// getArray decodes the JSON array GET path answers element by element as
// it streams in (the daemon writes it so): decoding overlaps the transfer.
// A null body gives a nil slice, an empty array an empty one.
func getArray[T any](ctx context.Context, c *Client, path string) ([]T, error) {
	resp, err := c.do(ctx, "GET", path, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	fail := func(err error) ([]T, error) { return nil, fmt.Errorf("decode GET %s: %w", path, err) }
	// jsonv2 (the encoding/json/v2 of Go's GOEXPERIMENT=jsonv2, as a
	// module) decodes these arrays faster than encoding/json, and decoding
	// was most of modelctl list's own time for 10,000 artifacts
	// (docs/benchmarks.md has the figures).
	// The daemon writes with encoding/json, whose output (valid UTF-8,
	// exact field names) v2 reads the same.
	dec := jsontext.NewDecoder(resp.Body)
	tok, err := dec.ReadToken()
	switch {
	case err != nil:
		return fail(err)
	case tok.Kind() == 'n':
		return nil, nil
	case tok.Kind() != '[':
		return fail(fmt.Errorf("want an array, got %v", tok))
	}
	// Decoded into chunks that never move, then copied once: appending
	// to one slice would copy tens of thousands of elements again at each
	// doubling (with the GC's write barriers, the most of this client's
	// time in a list of 10,000). The daemon says how many elements come
	// (HeaderCount): then the first chunk holds them all and nothing is
	// copied. The count only sizes memory, bounded; the body decides.
	first := 64
	if n, err := strconv.Atoi(resp.Header.Get(HeaderCount)); err == nil && n > 0 {
		first = min(n, 1<<16) // a few MiB at most, whatever the header says
	}
	var chunks [][]T
	chunk, n := make([]T, 0, first), 0
	for dec.PeekKind() != ']' {
		if len(chunk) == cap(chunk) {
			chunks, chunk = append(chunks, chunk), make([]T, 0, 2*cap(chunk))
		}
		chunk = append(chunk, *new(T))
		if err := jsonv2.UnmarshalDecode(dec, &chunk[len(chunk)-1]); err != nil {
			return fail(err)
		}
		n++
	}
	if _, err := dec.ReadToken(); err != nil {
		return fail(err)
	}
	if len(chunks) == 0 {
		return chunk, nil
	}
	out := make([]T, 0, n)
	for _, c := range append(chunks, chunk) {
		out = append(out, c...)
	}
	return out, nil
}

// Get returns one artifact with its versions and files.
func (c *Client) Get(ctx context.Context, name string) (*Artifact, error) {
	var a Artifact
	return &a, c.call(ctx, "GET", "/v1/artifacts/"+url.PathEscape(name), nil, &a)
}

// Pull records the desire and starts the pull. Without wait it returns at
// once with the artifact as it stands; with wait it streams progress to fn
// until the artifact is Ready (nil error) or Failed (an *Error with code
// CodeFailed).
func (c *Client) Pull(ctx context.Context, req PullRequest, wait bool, fn func(Event)) (*Artifact, error) {
	if !wait {
		var a Artifact
		return &a, c.call(ctx, "POST", "/v1/pull", req, &a)
	}
	return c.stream(ctx, "POST", "/v1/pull?wait=true", req, fn)
}

// Retry pulls the Failed desire of name again now, whatever its origin
// (a pull, a models.d file, a ModelCache). Without wait it returns at once;
// with wait it streams progress to fn until that pull ends, as Pull.
// CodeConflict when the artifact is not Failed, CodeNotFound when nothing
// desires it.
func (c *Client) Retry(ctx context.Context, name string, wait bool, fn func(Event)) (*Artifact, error) {
	path := "/v1/artifacts/" + url.PathEscape(name) + "/retry"
	if !wait {
		var a Artifact
		return &a, c.call(ctx, "POST", path, nil, &a)
	}
	return c.stream(ctx, "POST", path+"?wait=true", nil, fn)
}

// Wait streams progress until name is Ready or Failed, or timeout passes
// (0: no limit; the daemon answers CodeTimeout).
func (c *Client) Wait(ctx context.Context, name string, timeout time.Duration, fn func(Event)) (*Artifact, error) {
	return c.WaitWith(ctx, name, WaitOptions{Timeout: timeout}, fn)
}

// WaitOptions are a wait's: its limit (0: none) and whether a model's
// kernel caches are left out (by default a model is done when it is
// Ready and each of its kernel caches is Ready, Incompatible or Failed).
type WaitOptions struct {
	Timeout          time.Duration
	SkipKernelCaches bool
}

// WaitWith is Wait with options.
func (c *Client) WaitWith(ctx context.Context, name string, o WaitOptions, fn func(Event)) (*Artifact, error) {
	q := url.Values{}
	if o.Timeout > 0 {
		q.Set("timeout", o.Timeout.String())
	}
	if o.SkipKernelCaches {
		q.Set("kernelCaches", "skip")
	}
	path := "/v1/artifacts/" + url.PathEscape(name) + "/wait"
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	return c.stream(ctx, "GET", path, nil, fn)
}

// Pin protects the current version of name from eviction.
func (c *Client) Pin(ctx context.Context, name string) (*Artifact, error) {
	var a Artifact
	return &a, c.call(ctx, "POST", "/v1/artifacts/"+url.PathEscape(name)+"/pin", nil, &a)
}

// Unpin lets the current version of name be evicted again.
func (c *Client) Unpin(ctx context.Context, name string) (*Artifact, error) {
	var a Artifact
	return &a, c.call(ctx, "POST", "/v1/artifacts/"+url.PathEscape(name)+"/unpin", nil, &a)
}

// Evict removes name (every version, or one revision) and its desire,
// then collects the blobs nothing uses any more.
func (c *Client) Evict(ctx context.Context, name, revision string, force bool) (*EvictResult, error) {
	q := url.Values{}
	if revision != "" {
		q.Set("revision", revision)
	}
	if force {
		q.Set("force", "true")
	}
	var r EvictResult
	return &r, c.call(ctx, "DELETE", "/v1/artifacts/"+url.PathEscape(name)+"?"+q.Encode(), nil, &r)
}

// Verify re-hashes the blobs of the named artifacts (all when none).
func (c *Client) Verify(ctx context.Context, names ...string) (*VerifyResult, error) {
	var r VerifyResult
	return &r, c.call(ctx, "POST", "/v1/verify", VerifyRequest{Names: names}, &r)
}

// Fsck checks that the index, the blobs and the trees agree.
func (c *Client) Fsck(ctx context.Context) (*VerifyResult, error) {
	var r VerifyResult
	return &r, c.call(ctx, "POST", "/v1/verify", VerifyRequest{Fsck: true}, &r)
}

// GC removes blobs that no artifact version references; with dryRun it
// only reports what it would remove.
func (c *Client) GC(ctx context.Context, dryRun bool) (*GCResult, error) {
	var r GCResult
	path := "/v1/gc"
	if dryRun {
		path += "?dryRun=true"
	}
	return &r, c.call(ctx, "POST", path, nil, &r)
}

// Lease takes or renews holder's lease on name's current version for ttl.
func (c *Client) Lease(ctx context.Context, name, holder string, ttl time.Duration) (*Lease, error) {
	var l Lease
	return &l, c.call(ctx, "POST", "/v1/artifacts/"+url.PathEscape(name)+"/lease", LeaseRequest{Holder: holder, TTL: ttl.String()}, &l)
}

// Release drops holder's lease on name.
func (c *Client) Release(ctx context.Context, name, holder string) error {
	return c.call(ctx, "DELETE", "/v1/artifacts/"+url.PathEscape(name)+"/lease?holder="+url.QueryEscape(holder), nil, nil)
}

// Warm starts reading name's current revision into the page cache (or
// joins the warm of it that runs). Without wait it returns at once; with
// wait it calls fn with the progress (about once a second) and returns
// the warm's end, whose Reason says why it ended.
func (c *Client) Warm(ctx context.Context, name string, wait bool, fn func(WarmResult)) (*WarmResult, error) {
	path := "/v1/artifacts/" + url.PathEscape(name) + "/warm"
	if !wait {
		var r WarmResult
		return &r, c.call(ctx, "POST", path, nil, &r)
	}
	resp, err := c.do(ctx, "POST", path+"?wait=true", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for {
		var r WarmResult
		if err := dec.Decode(&r); err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, &UnavailableError{Socket: c.socket(), Err: fmt.Errorf("the warm's stream ended before the warm did: %w", err)}
		}
		if fn != nil {
			fn(r)
		}
		if r.Reason != "" {
			return &r, nil
		}
	}
}

// Usage returns the store's disk use.
func (c *Client) Usage(ctx context.Context) (*Usage, error) {
	var u Usage
	return &u, c.call(ctx, "GET", "/v1/usage", nil, &u)
}

// GPU returns the node's GPU inventory.
func (c *Client) GPU(ctx context.Context) (*GPUInventory, error) {
	var g GPUInventory
	return &g, c.call(ctx, "GET", "/v1/gpu", nil, &g)
}

// Env returns the environment a framework needs to use an artifact.
func (c *Client) Env(ctx context.Context, name string) (map[string]string, error) {
	var env map[string]string
	return env, c.call(ctx, "GET", "/v1/artifacts/"+url.PathEscape(name)+"/env", nil, &env)
}

// FormatBytes renders n in binary units for people.
func FormatBytes(n int64) string {
	if n < 0 {
		return "?"
	}
	const unit = 1024
	if n < unit {
		return strconv.FormatInt(n, 10) + " B"
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
