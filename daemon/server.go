package daemon

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/daemon/kernels"
)

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

func (d *Daemon) handleGPU(w http.ResponseWriter, r *http.Request) error {
	return writeJSON(w, kernels.GPUView(d.kernels.GPUs()))
}

func (d *Daemon) handleEnv(w http.ResponseWriter, r *http.Request) error {
	env, err := d.kernels.Env(r.PathValue("name"))
	if err != nil {
		return err
	}
	return writeJSON(w, env)
}
