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

// TestRoundKeepsSmallDurations: the status's seconds and rates keep three
// significant digits, so a download faster than 10 ms is not reported as
// taking 0 s (omitted) beside its rate.
func TestRoundKeepsSmallDurations(t *testing.T) {
	for in, want := range map[float64]float64{0.0071234: 0.00712, 148252521.41: 1.48e8, 12.3456: 12.3, 0: 0} {
		if got := round(in); got != want {
			t.Errorf("round(%v) = %v, want %v", in, got, want)
		}
	}
}
