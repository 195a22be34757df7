package daemon

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/cachestore"
	"github.com/modelcache/modelcache/fetchers"
)

type handler func(w http.ResponseWriter, r *http.Request) error

type route struct {
	pattern string // "METHOD /path", Go ServeMux syntax
	write   bool   // mutates: needs root, the daemon's uid or the socket group
	h       handler
}

func (d *Daemon) routeTable() []route {
	return []route{
		{"GET /v1/health", false, d.handleHealth},
		{"GET /v1/status", false, views{d}.handleStatus},
		{"GET /v1/usage", false, views{d}.handleUsage},
		{"GET /v1/artifacts", false, views{d}.handleList},
		{"GET /v1/artifacts/{name}", false, views{d}.handleGet},
		{"GET /v1/artifacts/{name}/wait", false, views{d}.handleWait},
		{"GET /v1/artifacts/{name}/env", false, d.handleEnv},
		{"GET /v1/gpu", false, d.handleGPU},
		{"POST /v1/pull", true, d.handlePull},
		{"POST /v1/artifacts/{name}/pin", true, d.handlePin(true)},
		{"POST /v1/artifacts/{name}/unpin", true, d.handlePin(false)},
		{"DELETE /v1/artifacts/{name}", true, evictions{d}.handleEvict},
		{"POST /v1/artifacts/{name}/lease", true, d.leases.handleLease},
		{"DELETE /v1/artifacts/{name}/lease", true, d.leases.handleRelease},
		{"POST /v1/artifacts/{name}/warm", true, d.warming.handleWarm},
		{"POST /v1/verify", true, d.handleVerify},
		{"POST /v1/gc", true, evictions{d}.handleGC},
	}
}

func (d *Daemon) routes() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range d.routeTable() {
		rt := rt
		mux.HandleFunc(rt.pattern, func(w http.ResponseWriter, r *http.Request) {
			sw := &statusWriter{ResponseWriter: w, rc: http.NewResponseController(w), writeTimeout: d.cfg.SocketWriteTimeout, code: 200}
			defer func() { d.metrics.apiRequests.WithLabelValues(rt.pattern, strconv.Itoa(sw.code)).Inc() }()
			if rt.write && !d.mayMutate(r) {
				writeError(sw, d.forbidden(r))
				return
			}
			if err := rt.h(sw, r); err != nil {
				e := toAPIError(err)
				if e.Code == api.CodeInternal {
					d.log.Error("api", "route", rt.pattern, "err", err)
				}
				writeError(sw, e)
			}
		})
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, api.Errorf(api.CodeNotFound, "no route %s %s; this daemon serves /v1/", r.Method, r.URL.Path))
	})
	return mux
}

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

func (d *Daemon) handleHealth(w http.ResponseWriter, r *http.Request) error {
	if err := d.healthy(); err != nil {
		return api.Errorf(api.CodeUnavailable, "store unhealthy: %v", err)
	}
	return writeJSON(w, map[string]string{"status": "ok"})
}

func (d *Daemon) handleVerify(w http.ResponseWriter, r *http.Request) error {
	var req api.VerifyRequest
	if err := decode(r, &req); err != nil {
		return err
	}
	if req.Fsck {
		probs, err := d.store.Fsck()
		if err != nil {
			return err
		}
		return writeJSON(w, api.VerifyResult{Fsck: true, Problems: probs})
	}
	rep, err := d.store.Verify(r.Context(), req.Names, nil)
	if err != nil {
		return err
	}
	d.metrics.verifications.WithLabelValues("ok").Add(float64(rep.BlobsChecked - len(rep.Corrupt) - len(rep.Missing)))
	d.metrics.verifications.WithLabelValues("corrupt").Add(float64(len(rep.Corrupt)))
	d.metrics.verifications.WithLabelValues("missing").Add(float64(len(rep.Missing)))
	out := api.VerifyResult{BlobsChecked: rep.BlobsChecked, BytesChecked: rep.BytesChecked, Corrupt: rep.Corrupt, Missing: rep.Missing, Quarantined: rep.Quarantine}
	if len(rep.Affected) > 0 {
		d.mu.Lock()
		want := d.desires.merged()
		for _, nr := range rep.Affected {
			name, _, _ := strings.Cut(nr, "@")
			if ds, ok := want[name]; ok && ds.State != api.StateAbsent {
				out.Refetching = append(out.Refetching, nr)
			}
		}
		d.notify()
		d.mu.Unlock()
		d.log.Warn("verify found damage", "corrupt", rep.Corrupt, "missing", rep.Missing, "affected", rep.Affected)
		d.kick()
	}
	return writeJSON(w, out)
}
