package daemon

import (
	"fmt"
	"sort"
	"strings"

	"github.com/modelcache/modelcache/api"
)

// kernelCacheWait is what a model's kernel caches still owe whoever waits
// for the model (modelctl wait, a CSI volume with kernelCaches: auto):
// pending names those still on their way (Pending, Downloading), with
// their phase; notes say, once none is, what will not come: each GPU of
// this node that none of them runs on and why, each one that failed. A
// model without kernel caches owes nothing. desired is the merged
// desires; view is an artifact as the socket shows it (it takes the
// daemon lock: call it with none held).
func kernelCacheWait(model string, desired map[string]api.Desire, view func(string) (*api.Artifact, error)) (pending, notes []string) {
	var names []string
	for n, ds := range desired {
		if ds.Kind == api.KindKernelCache && ds.Serves == model && ds.State != api.StateAbsent {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	type gpuState struct {
		name    string
		covered bool
		why     []string
	}
	gpus := map[int]*gpuState{}
	var noDevices []string // incompatible caches whose report names no GPU (a node without one)
	for _, n := range names {
		a, err := view(n)
		if err != nil {
			pending = append(pending, n+" (not known yet)")
			continue
		}
		switch a.Phase {
		case api.PhaseReady, api.PhaseIncompatible:
		case api.PhaseFailed:
			notes = append(notes, fmt.Sprintf("kernel cache %s failed: %s; the model is served without it", n, a.Message))
			continue
		case api.PhaseEvicted:
			notes = append(notes, fmt.Sprintf("kernel cache %s was evicted", n))
			continue
		default:
			p := string(a.Phase)
			if a.Progress != nil && a.Progress.BytesTotal > 0 {
				p += fmt.Sprintf(" %d%%", a.Progress.BytesDone*100/a.Progress.BytesTotal)
			}
			pending = append(pending, n+" ("+p+")")
			continue
		}
		var rep *api.Compatibility
		if a.KernelCache != nil {
			rep = a.KernelCache.Compatibility
		}
		if rep == nil || len(rep.Devices) == 0 {
			if a.Phase == api.PhaseIncompatible {
				noDevices = append(noDevices, n+": "+a.Message)
			}
			continue
		}
		for _, dv := range rep.Devices {
			g := gpus[dv.Index]
			if g == nil {
				g = &gpuState{name: dv.Name}
				gpus[dv.Index] = g
			}
			if dv.Compatible && a.Phase == api.PhaseReady {
				g.covered = true
			} else if dv.Reason != "" {
				g.why = append(g.why, n+": "+dv.Reason)
			}
		}
	}
	if len(pending) > 0 {
		return pending, nil
	}
	idx := make([]int, 0, len(gpus))
	for i := range gpus {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	for _, i := range idx {
		if g := gpus[i]; !g.covered {
			notes = append(notes, fmt.Sprintf("GPU %d (%s) has no kernel cache of %s it can run (%s); it compiles its kernels at first launch", i, g.name, model, strings.Join(g.why, "; ")))
		}
	}
	if len(gpus) == 0 && len(noDevices) > 0 {
		notes = append(notes, fmt.Sprintf("no kernel cache of %s runs on this node (%s)", model, strings.Join(noDevices, "; ")))
	}
	return nil, notes
}
