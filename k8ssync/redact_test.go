package k8ssync

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	"github.com/modelcache/modelcache/api"
)

// TestEventsRedactCredentials: an artifact message that carries a source
// URI with credentials becomes an Event without them.
func TestEventsRedactCredentials(t *testing.T) {
	rec := record.NewFakeRecorder(4)
	s := &Syncer{cfg: Config{NodeName: "n1"}, rec: rec, phases: map[string]string{}}
	mc := &ModelCache{ObjectMeta: metav1.ObjectMeta{Name: "m", UID: "u1"}}
	msg := `resolve http://alice:PASSW0RD@h/w.bin?token=SECRET1&X-Amz-Signature=SECRET2: GET "http://h/w.bin?token=SECRET1": not found`
	s.events([]api.Artifact{{Name: "m", Phase: api.PhaseFailed, Message: msg}}, map[string]string{"m": "m"}, []*ModelCache{mc})
	ev := <-rec.Events
	for _, secret := range []string{"PASSW0RD", "SECRET1", "SECRET2"} {
		if strings.Contains(ev, secret) {
			t.Fatalf("event shows %q: %s", secret, ev)
		}
	}
	if !strings.Contains(ev, "http://REDACTED@h/w.bin?token=REDACTED") || !strings.Contains(ev, "not found") {
		t.Fatalf("event: %s", ev)
	}
}
