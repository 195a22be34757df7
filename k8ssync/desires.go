package k8ssync

import (
	"context"
	"sort"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/modelcache/modelcache/api"
)

// modelCaches lists the informer's ModelCaches as typed objects.
func (s *Syncer) modelCaches() []*ModelCache {
	var out []*ModelCache
	for _, o := range s.mcInf.GetStore().List() {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		var mc ModelCache
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &mc); err != nil {
			s.log.Warn("k8s sync: unreadable ModelCache", "name", u.GetName(), "err", err)
			continue
		}
		out = append(out, &mc)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Selected says whether mc selects a node with these labels.
func Selected(mc *ModelCache, nodeLabels map[string]string) (bool, error) {
	if mc.Spec.NodeSelector == nil {
		return true, nil
	}
	sel, err := metav1.LabelSelectorAsSelector(mc.Spec.NodeSelector)
	if err != nil {
		return false, err
	}
	return sel.Matches(labels.Set(nodeLabels)), nil
}

// desires turns the selected ModelCaches into desires; owners maps every
// artifact name (with kernel caches and extra versions) to its ModelCache;
// pending names the ones that wait for the cluster's resolution (and why).
// current is the revision this node serves of each artifact (a rollout
// prefetches the target only where the active revision serves).
func (s *Syncer) desires(ctx context.Context, node *corev1.Node, all []*ModelCache, current map[string]served) (want map[string]api.Desire, creds map[string]map[string]string, owners, pending map[string]string) {
	now := time.Now()
	var wake time.Time // the earliest end of a retainOld: a pass then lets the old revision go
	rolled := func(mc *ModelCache, ds api.Desire, source string) (api.Desire, bool, string) {
		out, ok, why, until := modelDesire(mc, ds, source, current[ds.Name], now)
		if !until.IsZero() && (wake.IsZero() || until.Before(wake)) {
			wake = until
		}
		return out, ok, why
	}
	defer func() {
		if !wake.IsZero() {
			s.later(time.Until(wake) + time.Second)
		}
	}()
	want, pending = map[string]api.Desire{}, map[string]string{}
	creds = map[string]map[string]string{}
	owners = map[string]string{}
	secrets := map[string]bool{} // the Secrets the selected ModelCaches name
	defer s.keepSecrets(secrets, all)
	refused := map[string]bool{}
	defer func() {
		s.mu.Lock()
		s.refused = refused
		s.mu.Unlock()
	}()
	var nodeLabels map[string]string
	if node != nil {
		nodeLabels = node.Labels
	}
	for _, mc := range all {
		ok, err := Selected(mc, nodeLabels)
		if err != nil {
			s.log.Warn("k8s sync: bad nodeSelector", "modelcache", mc.Name, "err", err)
			continue
		}
		if !ok {
			continue // deselected: no longer desired here; eviction may take it
		}
		state, policy := stateAndPolicy(mc)
		cu, withCreds := s.credentialsOf(mc)
		if withCreds && cu.refused != "" && state == api.StatePresent {
			// Not pulled without the credentials it names (nor kept from
			// an earlier pass): the refusal says how to migrate.
			s.refuseCredentials(mc, cu.refused, refused)
			owners[mc.Name] = mc.Name
			pending[mc.Name] = cu.refused
			for _, v := range mc.Spec.Versions {
				owners[mc.Name+"-"+v.Suffix] = mc.Name
				pending[mc.Name+"-"+v.Suffix] = cu.refused
			}
			continue
		}
		base := api.Desire{Name: mc.Name, URI: mc.Spec.Source, Include: mc.Spec.Include, Exclude: mc.Spec.Exclude, Digest: mc.Spec.Digest,
			Pin: mc.Spec.Pin, State: state, Origin: originPrefix + mc.Name, Policy: policy, AllowedNamespaces: cu.allowed,
			CaptureKernelCaches: mc.Spec.CaptureKernelCaches, Public: mc.Spec.Public, Xet: mc.Spec.Xet}
		// Every source is pulled as the cluster resolved it (resolve.go);
		// until then the node keeps the desire it had, or waits.
		var resolved bool
		var why string
		if state == api.StatePresent {
			s.refuse(mc, forged(mc), refused)
			base, resolved, why = rolled(mc, base, mc.Spec.Source)
		}
		for i, kc := range mc.Spec.KernelCaches {
			ref := api.KernelCacheRef{Name: kc.Name, URI: kc.Image, Signature: kc.Signature}
			base.KernelCaches = append(base.KernelCaches, ref)
			n := base.KernelCacheName(i)
			owners[n] = mc.Name
			if state == api.StatePresent && resolved {
				var kd api.Desire
				kd, resolved, why = pinned(mc, api.Desire{Name: n, URI: kc.Image}, kc.Image)
				base.KernelCaches[i].URI = kd.URI
			}
		}
		owners[mc.Name] = mc.Name
		s.wantOrWait(want, pending, base, state == api.StateAbsent || resolved, why)
		for _, v := range mc.Spec.Versions {
			n := mc.Name + "-" + v.Suffix
			vd := api.Desire{Name: n, URI: v.Source, Digest: v.Digest, Include: mc.Spec.Include, Exclude: mc.Spec.Exclude,
				Pin: mc.Spec.Pin, State: state, Origin: originPrefix + mc.Name, Policy: policy, AllowedNamespaces: cu.allowed,
				CaptureKernelCaches: mc.Spec.CaptureKernelCaches, Public: mc.Spec.Public, Xet: mc.Spec.Xet}
			ok, why := true, ""
			if state == api.StatePresent {
				vd, ok, why = rolled(mc, vd, v.Source)
			}
			s.wantOrWait(want, pending, vd, ok, why)
			owners[n] = mc.Name
		}
		if withCreds && cu.refused == "" {
			s.credentials(ctx, mc, cu, owners, creds, secrets)
		}
	}
	return want, creds, owners, pending
}

// stateAndPolicy are what mc's desires ask: present or absent, and the
// update policy (on change, or a poll interval; a bad interval is named).
func stateAndPolicy(mc *ModelCache) (string, string) {
	state := api.StatePresent
	if mc.Spec.State == StateAbsent {
		state = api.StateAbsent
	}
	policy := PolicyOnChange
	if p, err := pollInterval(mc); err != nil {
		policy += " (" + err.Error() + ")"
	} else if p > 0 {
		policy = PolicyPoll + " " + p.String()
	}
	return state, policy
}

// credentials reads the Secret mc may use (cu, credentialsOf), adds its
// name to secrets, and gives its data to every artifact owners says mc
// owns; whether the Secret reads is logged when that changes.
func (s *Syncer) credentials(ctx context.Context, mc *ModelCache, cu credentialsUse, owners map[string]string, creds map[string]map[string]string, secrets map[string]bool) {
	secrets[cu.key()] = true
	data, err := s.secret(ctx, cu.ns, cu.name)
	if s.secrets.changed(cu.key(), err) {
		if err != nil {
			s.log.Warn("k8s sync: credentials", "modelcache", mc.Name, "secret", cu.key(), "err", err)
		} else {
			s.log.Info("k8s sync: credentials read", "modelcache", mc.Name, "secret", cu.key())
		}
	}
	if data != nil {
		for n, o := range owners {
			if o == mc.Name {
				creds[n] = data
			}
		}
	}
}

// wantOrWait adds ds to want when the cluster resolved it (ok); else the
// desire this node last handed its daemon under that name stays (it
// keeps serving what it has), or, when there is none, the name waits in
// pending with why.
func (s *Syncer) wantOrWait(want map[string]api.Desire, pending map[string]string, ds api.Desire, ok bool, why string) {
	if ok {
		want[ds.Name] = ds
		return
	}
	s.mu.Lock()
	prev, had := s.lastWant[ds.Name]
	s.mu.Unlock()
	if had && prev.State != api.StateAbsent {
		want[ds.Name] = prev
		return
	}
	pending[ds.Name] = why
}
