package peer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/modelcache/modelcache/fetchers"
)

// blobURL is base's URL of digest; base is an http(s) URL with a host
// and nothing after it but an optional "/".
func blobURL(base, digest string) (string, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("peer %q: want a base URL such as http://10.0.0.7:7435", base)
	}
	return u.Scheme + "://" + u.Host + BlobPath + digest, nil
}

// fromPeer asks peer p for b from dst's offset and streams the answer
// into dst.
func (f *Fetcher) fromPeer(ctx context.Context, p, tok string, b Blob, dst Partial) (int64, error) {
	fail := func(reason string, format string, args ...any) (int64, error) {
		return 0, &peerError{reason: reason, err: fmt.Errorf("peer %s: blob %s: "+format, append([]any{p, b.Digest}, args...)...)}
	}
	u, err := blobURL(p, b.Digest)
	if err != nil {
		return 0, &peerError{reason: AvoidBadURL, err: err}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, &peerError{reason: AvoidBadURL, err: err}
	}
	off := dst.Offset()
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("User-Agent", f.o.http.UserAgent)
	if b.Wait > 0 {
		req.Header.Set(HeaderWait, strconv.Itoa(int((min(b.Wait, MaxWait)+time.Second-1)/time.Second)))
	}
	if off > 0 {
		req.Header.Set("Range", "bytes="+strconv.FormatInt(off, 10)+"-")
	}
	resp, err := f.client.Do(req)
	if err != nil {
		if errors.Is(err, fetchers.ErrRedirect) {
			return 0, &peerError{reason: AvoidRedirect, err: err}
		}
		return 0, &peerError{reason: AvoidNetwork, err: err}
	}
	want := b.Size - off
	switch {
	case resp.StatusCode == http.StatusOK && off == 0, resp.StatusCode == http.StatusPartialContent && off > 0:
	case resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusPartialContent:
		resp.Body.Close()
		return fail(AvoidWrongLength, "asked for bytes from %d, got %s", off, resp.Status)
	case resp.StatusCode == http.StatusNotFound:
		resp.Body.Close()
		return 0, &peerError{err: fmt.Errorf("peer %s: blob %s: %w", p, b.Digest, fetchers.ErrNotFound)}
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		resp.Body.Close()
		return fail(AvoidUnauthorized, "%s: the peer does not accept this daemon's token", resp.Status)
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
		resp.Body.Close()
		n, err := fail(AvoidBusy, "%s", resp.Status)
		err.(*peerError).wait = fetchers.ParseRetryAfter(resp.Header.Get("Retry-After"), f.o.now())
		return n, err
	default:
		resp.Body.Close()
		return fail(AvoidStatus, "%s", resp.Status)
	}
	if resp.ContentLength != want {
		resp.Body.Close()
		return fail(AvoidWrongLength, "Content-Length %d, want %d (the blob's %d bytes from %d)", resp.ContentLength, want, b.Size, off)
	}
	if off > 0 {
		if cr := resp.Header.Get("Content-Range"); cr != fmt.Sprintf("bytes %d-%d/%d", off, b.Size-1, b.Size) {
			resp.Body.Close()
			return fail(AvoidWrongLength, "Content-Range %q, want bytes %d-%d/%d", cr, off, b.Size-1, b.Size)
		}
	}
	streamed := resp.Header.Get(HeaderStreamed) != ""
	pace := peerPace
	if streamed {
		pace = streamedPace
	}
	n, err := f.transfer(resp.Body, b, dst, pace)
	if err != nil {
		var se sinkError
		if errors.As(err, &se) {
			return n, err
		}
		reason := AvoidNetwork
		switch {
		case errors.Is(err, errTooLong):
			reason = AvoidTooLong
		case errors.Is(err, io.ErrUnexpectedEOF) && streamed:
			reason = AvoidStreamEnded
		case errors.Is(err, io.ErrUnexpectedEOF):
			reason = AvoidShort
		case errors.Is(err, fetchers.ErrTooSlow) || errors.Is(err, fetchers.ErrIdle):
			reason = AvoidStall
		}
		return n, &peerError{reason: reason, streamed: streamed, err: fmt.Errorf("peer %s: blob %s at byte %d: %w", p, b.Digest, off+n, err)}
	}
	return n, nil
}

// pace is what a transfer holds its source to.
type pace int

const (
	originPace   pace = iota // nothing: the origin's pace is its caller's to bound, as the Origin it gave does
	peerPace                 // the idle timeout and the progress floor
	streamedPace             // the idle timeout only: a streamed answer (HeaderStreamed) flows at its sender's source's pace
)

// transfer streams body into dst until b.Size, closing body. It refuses a
// body that ends early (io.ErrUnexpectedEOF) or goes on past the blob
// (errTooLong), and one that stalls as pc says (fetchers.IdleTimeout,
// MinRate); a failure of dst comes back as a sinkError.
func (f *Fetcher) transfer(body io.ReadCloser, b Blob, dst Partial, pc pace) (int64, error) {
	switch pc {
	case peerPace:
		body = fetchers.MinRate(fetchers.IdleTimeout(body, f.o.http.IdleTimeout), f.o.floor, f.o.window)
	case streamedPace:
		body = fetchers.IdleTimeout(body, f.o.http.IdleTimeout)
	}
	defer body.Close()
	src := &exactReader{r: body, left: b.Size - dst.Offset()}
	n, err := dst.ReadFrom(src)
	switch {
	case src.err != nil:
		return n, src.err
	case err != nil:
		return n, sinkError{err}
	case src.left > 0:
		return n, fmt.Errorf("stream ended %d bytes early: %w", src.left, io.ErrUnexpectedEOF)
	}
	return n, nil
}

// peerError is a peer's failure and the reason it is set aside; reason
// "" is a 404 (the peer does not hold the blob), which sets nothing aside.
type peerError struct {
	reason   string
	wait     time.Duration // at least this long (a Retry-After)
	streamed bool          // the answer was streamed (HeaderStreamed)
	err      error
}

func (e *peerError) Error() string { return e.err.Error() }

func (e *peerError) Unwrap() error { return e.err }

// sinkError is a failure of the partial ingest, not of the source.
type sinkError struct{ err error }

func (e sinkError) Error() string { return e.err.Error() }

var errTooLong = errors.New("more bytes than the blob has")

// exactReader passes exactly left bytes of r: an EOF before is
// io.ErrUnexpectedEOF, a byte after is errTooLong. err keeps the error
// it returned (other than io.EOF), so its failures are told from the
// sink's.
type exactReader struct {
	r    io.Reader
	left int64
	err  error
	one  [1]byte
}

func (e *exactReader) Read(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	if e.left == 0 {
		n, err := e.r.Read(e.one[:])
		if n > 0 {
			e.err = errTooLong
			return 0, e.err
		}
		if err != nil && err != io.EOF {
			e.err = err
			return 0, err
		}
		return 0, io.EOF
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.r.Read(p)
	e.left -= int64(n)
	switch {
	case err == io.EOF && e.left > 0:
		e.err = fmt.Errorf("stream ended %d bytes early: %w", e.left, io.ErrUnexpectedEOF)
		return n, e.err
	case err == io.EOF:
		return n, io.EOF
	case err != nil:
		e.err = err
	}
	return n, err
}
