package ngctest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// serveAuth is the token exchange of ngcbase and modelexpress:
// GET /token?service=ngc&scope=group/ngc:<org>[&scope=…/<team>], Basic
// "$oauthtoken":<key> → {"token", "expires_in"}.
func (s *Server) serveAuth(w http.ResponseWriter, r *http.Request) {
	if s.Hook != nil && s.Hook(w, r) {
		return
	}
	s.TokenRequests.Add(1)
	user, key, ok := r.BasicAuth()
	if r.URL.Path != "/token" || r.URL.Query().Get("service") != "ngc" {
		status(w, http.StatusBadRequest, "want /token?service=ngc")
		return
	}
	s.mu.Lock()
	allowed, known := s.Keys[key]
	s.mu.Unlock()
	if !ok || user != "$oauthtoken" || !known {
		status(w, http.StatusUnauthorized, "invalid credentials")
		return
	}
	scopes := map[string]bool{}
	for _, sc := range r.URL.Query()["scope"] {
		found := false
		for _, a := range allowed {
			found = found || a == sc
		}
		if !found {
			status(w, http.StatusForbidden, "scope not allowed: "+sc)
			return
		}
		scopes[sc] = true
	}
	s.mu.Lock()
	tok := fmt.Sprintf("ngctest-token-%d", len(s.tokens)+1)
	s.tokens[tok] = &issued{scopes: scopes}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{"token": tok, "expires_in": int(s.TokenTTL / time.Second)})
}
