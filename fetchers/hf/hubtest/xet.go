package hubtest

import (
	"fmt"
	"net/http"

	"github.com/modelcache/modelcache/fetchers/hf/xet/xettest"
)

// EnableXet starts a test CAS: LFS files committed from now on are
// stored in it too, and their resolve answers carry the Xet headers;
// Close closes it.
func (h *Hub) EnableXet() *xettest.CAS {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.Xet = xettest.New()
	return h.Xet
}

// XetID is the Xet file id of an LFS file (its sha256), "" when the file
// is not in the CAS.
func (h *Hub) XetID(oid string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.xetIDs[oid]
}

// xetHeaders adds what the hub answers for a file stored in Xet when the
// resolve redirect is not followed (huggingface_hub reads them from the
// HEAD: X-Xet-Hash, and Link rel="xet-auth" for the read token, rel=
// "xet-reconstruction-info" for the CAS route).
func (h *Hub) xetHeaders(w http.ResponseWriter, repo, sha, oid string) {
	h.mu.Lock()
	id := h.xetIDs[oid]
	cas := h.Xet
	h.mu.Unlock()
	if id == "" || cas == nil {
		return
	}
	w.Header().Set("X-Xet-Hash", id)
	w.Header().Set("Link", fmt.Sprintf(`<%s/api/models/%s/xet-read-token/%s>; rel="xet-auth", <%s/v1/reconstructions/%s>; rel="xet-reconstruction-info"`,
		h.API.URL, repo, sha, cas.URL(), id))
}

// serveXetToken answers GET /api/models/{repo}/xet-read-token/{rev}
// (hub-docs docs/xet/auth.md); a hub without Xet has no such route.
func (h *Hub) serveXetToken(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	cas := h.Xet
	h.mu.Unlock()
	if cas == nil {
		hubError(w, http.StatusNotFound, "", "no such API route")
		return
	}
	cas.TokenHandler().ServeHTTP(w, r)
}
