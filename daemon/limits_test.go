package daemon

import (
	"errors"
	"strings"
	"testing"

	"github.com/modelcache/modelcache/api"
)

// TestPullURICap: a pull over the socket whose URI is 900 KB (the body
// limit of the socket is 1 MiB) is refused at once, the error naming the
// cap; a URI of exactly the cap pulls; a kernel cache's URI has the same
// cap.
func TestPullURICap(t *testing.T) {
	w := data(4<<10, 1)
	srv := newFileServer(t, map[string][]byte{"w.bin": w})
	h := start(t, testConfig(t))
	long := srv.URL + "/w.bin?pad=" + strings.Repeat("a", 900<<10)
	_, err := h.pull(api.PullRequest{Name: "long", URI: long})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeInvalid || !strings.Contains(ae.Message, "the cap is 8192 bytes") || len(ae.Message) > 512 {
		t.Fatalf("a 900 KB URI: %v", err)
	}
	if _, err := h.c.Get(t.Context(), "long"); err == nil {
		t.Fatal("the refused pull left an artifact")
	}
	exact := srv.URL + "/w.bin?pad="
	exact += strings.Repeat("a", api.MaxURIBytes-len(exact))
	if a, err := h.pull(api.PullRequest{Name: "exact", URI: exact}); err != nil || a.Phase != api.PhaseReady {
		t.Fatalf("a URI of %d bytes: %+v %v", len(exact), a, err)
	}
	kc := "oci://registry.example/k:" + strings.Repeat("t", api.MaxURIBytes)
	_, err = h.pull(api.PullRequest{Name: "m", URI: srv.URL + "/w.bin", KernelCaches: []api.KernelCacheRef{{URI: kc}}})
	if !errors.As(err, &ae) || !strings.Contains(ae.Message, "the cap is 8192 bytes") {
		t.Fatalf("a kernel cache URI over the cap: %v", err)
	}
}
