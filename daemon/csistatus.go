package daemon

import (
	"fmt"
	"sort"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/modelcache/modelcache/api"
)

// notReadyStatus: Unavailable (kubelet retries) while there is hope, with
// the progress; FailedPrecondition when the node has given up. Progress
// is in words ("41 percent"): kubelet's events take the message as a
// format string (the driver escapes any other '%').
func notReadyStatus(a *api.Artifact) error {
	switch a.Phase {
	case api.PhaseDownloading:
		msg := fmt.Sprintf("model %s downloading", a.Name)
		if p := a.Progress; p != nil {
			if p.BytesTotal > 0 {
				msg += fmt.Sprintf(" %d percent, %s of %s", (p.BytesDone+p.BytesSkipped)*100/p.BytesTotal, api.FormatBytes(p.BytesDone+p.BytesSkipped), api.FormatBytes(p.BytesTotal))
			} else {
				msg += ", " + api.FormatBytes(p.BytesDone) + " so far"
			}
			if p.BytesPerSecond > 0 {
				msg += fmt.Sprintf(" at %s/s", api.FormatBytes(int64(p.BytesPerSecond)))
			}
		}
		if a.Message != "" {
			msg += " (" + a.Message + ")"
		}
		return status.Error(codes.Unavailable, msg+"; the volume mounts once it is Ready")
	case api.PhaseFailed, api.PhaseIncompatible, api.PhaseEvicted:
		msg := fmt.Sprintf("model %s is %s on this node", a.Name, a.Phase)
		if a.Reason != "" {
			msg += " (" + a.Reason + ")"
		}
		if a.Message != "" {
			msg += ": " + a.Message
		}
		if a.Phase == api.PhaseFailed && a.NextRetry != nil {
			return status.Error(codes.Unavailable, msg+fmt.Sprintf("; the node retries at %s", a.NextRetry.Format("15:04:05")))
		}
		return status.Error(codes.FailedPrecondition, msg+"; fix the ModelCache (modelctl inspect "+a.Name+" says more) and recreate the pod")
	default:
		msg := fmt.Sprintf("model %s is %s on this node", a.Name, a.Phase)
		if a.Message != "" {
			msg += ": " + a.Message
		}
		return status.Error(codes.Unavailable, msg+"; the volume mounts once it is Ready")
	}
}

// servable lists what a pod of namespace ns may name: the declared
// artifacts it may mount (public ones, and private ones its namespace is
// allowed), nothing of other namespaces' private models.
func (c *csiVolumes) servable(ns string) string {
	var out []string
	for n, ds := range c.host.desired() {
		if ds.State != api.StateAbsent && mayMount(ds, ns) {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	if len(out) > 20 {
		out = append(out[:20], fmt.Sprintf("and %d more (modelctl list)", len(out)-20))
	}
	return listOr(out, "nothing yet")
}

func listOr(xs []string, none string) string {
	if len(xs) == 0 {
		return none
	}
	return strings.Join(xs, ", ")
}
