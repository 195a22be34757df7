package daemon

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
)

// TestMisbehavingServers: sources that lie about lengths, drip, redirect
// forever or answer with huge JSON fail the pull with a reason that names
// the problem, and nothing becomes visible.
func TestMisbehavingServers(t *testing.T) {
	w := data(300<<10, 9)
	cases := []struct {
		name string
		hook func(rw http.ResponseWriter, r *http.Request) bool
		want string
	}{
		{"shorter than Content-Length, every time", func(rw http.ResponseWriter, r *http.Request) bool {
			if r.Method != http.MethodGet {
				return false
			}
			rw.Header().Set("Content-Length", fmt.Sprint(len(w)))
			rw.WriteHeader(200)
			rw.Write(w[:1000])
			rw.(http.Flusher).Flush()
			conn, _, _ := rw.(http.Hijacker).Hijack()
			conn.Close()
			return true
		}, "unexpected EOF"},
		{"longer than announced", func(rw http.ResponseWriter, r *http.Request) bool {
			if r.Method == http.MethodHead {
				rw.Header().Set("Content-Length", fmt.Sprint(len(w)-100))
				rw.WriteHeader(200)
				return true
			}
			rw.Write(w)
			return true
		}, "more than the"},
		{"slow drip", func(rw http.ResponseWriter, r *http.Request) bool {
			if r.Method != http.MethodGet {
				return false
			}
			rw.Header().Set("Content-Length", fmt.Sprint(len(w)))
			rw.WriteHeader(200)
			rw.Write(w[:1])
			rw.(http.Flusher).Flush()
			<-r.Context().Done() // silent until the client hangs up: its idle timeout (2 s in testConfig) must
			return true
		}, "idle"},
		{"endless redirects", func(rw http.ResponseWriter, r *http.Request) bool {
			http.Redirect(rw, r, r.URL.Path+"x", http.StatusFound)
			return true
		}, "redirect"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			srv := newFileServer(t, map[string][]byte{"w.bin": w})
			srv.hook = c.hook
			cfg := testConfig(t)
			h := start(t, cfg)
			_, err := h.pull(api.PullRequest{Name: "m", URI: srv.URL + "/w.bin"})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("want a failure naming %q, got %v", c.want, err)
			}
			if _, err := lstatTree(cfg.Root, "m"); err == nil {
				t.Fatal("a tree appeared")
			}
		})
	}

	// A hub whose revision answer is a huge JSON document.
	t.Run("huge JSON", func(t *testing.T) {
		hub := hubtest.New()
		defer hub.Close()
		hub.Commit("org/m", map[string][]byte{"config.json": []byte("{}")}, "main")
		hub.Hook = func(rw http.ResponseWriter, r *http.Request) bool {
			if !strings.Contains(r.URL.Path, "/revision/") {
				return false
			}
			rw.Write([]byte(`{"sha":"` + strings.Repeat("a", 40) + `","siblings":[`))
			chunk := []byte(strings.Repeat(`{"rfilename":"x"},`, 1000))
			for i := 0; i < 1000 && r.Context().Err() == nil; i++ { // ~18 MB
				if _, err := rw.Write(chunk); err != nil {
					break
				}
			}
			return true
		}
		t.Setenv("HF_ENDPOINT", hub.URL())
		cfg := testConfig(t)
		h := start(t, cfg)
		_, err := h.pull(api.PullRequest{Name: "m", URI: "hf://org/m"})
		if err == nil || !strings.Contains(err.Error(), "larger than") {
			t.Fatalf("want the size limit named, got %v", err)
		}
	})
}
