package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/fetchers"
)

// handler is a route's function: an error it returns is written by
// toAPIError's table.
type handler func(w http.ResponseWriter, r *http.Request) error

// statusWriter records the status code for the metrics and gives every
// write its own deadline, writeTimeout from that write: a peer that stops
// reading loses its connection, a stream that keeps writing lives on.
type statusWriter struct {
	http.ResponseWriter
	rc           *http.ResponseController // of the ResponseWriter
	writeTimeout time.Duration            // 0: none
	code         int
}

func (s *statusWriter) renew() {
	if s.writeTimeout > 0 {
		s.rc.SetWriteDeadline(time.Now().Add(s.writeTimeout))
	}
}

func (s *statusWriter) WriteHeader(c int) { s.code = c; s.ResponseWriter.WriteHeader(c) }

func (s *statusWriter) Write(p []byte) (int, error) {
	s.renew()
	return s.ResponseWriter.Write(p)
}

// FlushError sends what is buffered; an error means the peer is gone or
// stopped reading (and the request's context is cancelled).
func (s *statusWriter) FlushError() error {
	s.renew()
	return s.rc.Flush()
}

func (s *statusWriter) Flush() { s.FlushError() }

// Unwrap lets http.ResponseController reach the server's writer.
func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// toAPIError is the one place that maps errors to codes and statuses.
func toAPIError(err error) *api.Error {
	var e *api.Error
	switch {
	case errors.As(err, &e):
		return e
	case errors.Is(err, cachestore.ErrNotFound), errors.Is(err, fetchers.ErrNotFound):
		return api.Errorf(api.CodeNotFound, "%v", err)
	case errors.Is(err, fetchers.ErrUnauthorized):
		return api.Errorf(api.CodeForbidden, "%v", err)
	case errors.Is(err, cachestore.ErrPinned):
		return api.Errorf(api.CodePinned, "%v", err)
	case errors.Is(err, cachestore.ErrDigestMismatch):
		return api.Errorf(api.CodeDigestMismatch, "%v", err)
	case errors.Is(err, cachestore.ErrInvalidName), errors.Is(err, cachestore.ErrInvalidPath),
		errors.Is(err, cachestore.ErrInvalidDigest), errors.Is(err, fetchers.ErrBadSource), errors.Is(err, fetchers.ErrUnsupported):
		return api.Errorf(api.CodeInvalid, "%v", err)
	case errors.Is(err, context.DeadlineExceeded):
		return api.Errorf(api.CodeTimeout, "%v", err)
	}
	return api.Errorf(api.CodeInternal, "%v", err)
}

// writeError sends e with the credentials in any URL of its message
// redacted: every local user may read the socket.
func writeError(w http.ResponseWriter, e *api.Error) {
	out := *e
	if out.Status == 0 {
		out.Status = api.HTTPStatus(out.Code)
	}
	out.Message = fetchers.RedactText(out.Message)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(out.Status)
	api.WriteJSON(w, &out, "")
}

func writeJSON(w http.ResponseWriter, v any) error {
	w.Header().Set("Content-Type", "application/json")
	return api.WriteJSON(w, v, "")
}

// writeJSONArray writes items as writeJSON would (the same bytes), one
// element at a time: a list of thousands is never held encoded whole, and
// the client decodes the first elements while the last are encoded.
func writeJSONArray[T any](w http.ResponseWriter, items []T) error {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set(api.HeaderCount, strconv.Itoa(len(items)))
	return api.WriteJSONArray(w, items)
}

// decode reads a bounded JSON body, rejecting unknown fields.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return api.Errorf(api.CodeInvalid, "request body: %v", err)
	}
	return nil
}
