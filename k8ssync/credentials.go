package k8ssync

import (
	"fmt"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"github.com/modelcache/modelcache/fetchers"
)

// Credentials belong to a namespace. A ModelCache is cluster-scoped, so
// by itself it may use Secrets of the daemon's own namespace only (the
// operator's). A Secret of another namespace N is used only where a
// ModelCacheCredentials in N, an object of N that names a Secret of N,
// grants it to that ModelCache and to every source the ModelCache sends
// it to: whoever may create a ModelCache cannot borrow N's Secret (nor
// send it to a host of their choosing) without N's consent, and the
// daemon reads no Secret on behalf of an object that could not name it.
//
// What a pull with credentials fetches is private: only pods of the
// allowed namespaces may mount it (api.Desire.AllowedNamespaces): the
// grant's namespace and its allowedNamespaces, or for a Secret of the
// daemon's namespace, that namespace and the ModelCache's
// spec.allowedNamespaces.

// EventCredentialsRefused is the Warning Event on a ModelCache whose
// secretRef the node refuses to use.
const EventCredentialsRefused = "CredentialsRefused"

// credentialsUse is what a ModelCache's secretRef comes to.
type credentialsUse struct {
	ns, name string   // the Secret
	allowed  []string // the namespaces that may mount its artifacts
	refused  string   // why the Secret is not used ("" when it is)
}

// key is the Secret as namespace/name.
func (u credentialsUse) key() string { return u.ns + "/" + u.name }

// credentialsOf says whether mc uses a Secret (ok), which, and who may
// mount what it fetches; a refused use names the migration.
func (s *Syncer) credentialsOf(mc *ModelCache) (u credentialsUse, ok bool) {
	ref := mc.Spec.SecretRef
	if ref == nil {
		return u, false
	}
	u = credentialsUse{ns: ref.Namespace, name: ref.Name}
	if ref.Namespace == s.cfg.Namespace {
		if !mc.Spec.Public { // the operator's own Secret: public only where spec.public says so
			u.allowed = namespaces(s.cfg.Namespace, mc.Spec.AllowedNamespaces)
		}
		return u, true
	}
	g, why := s.grant(mc, ref.Namespace, ref.Name)
	if why != "" {
		u.refused = why
		return u, true
	}
	u.allowed = namespaces(ref.Namespace, g.Spec.AllowedNamespaces)
	return u, true
}

// grant finds the ModelCacheCredentials of namespace ns that grants
// Secret name to mc for all of mc's sources; else why not, with the
// object to create.
func (s *Syncer) grant(mc *ModelCache, ns, name string) (*ModelCacheCredentials, string) {
	var srcs []string
	for _, src := range sources(mc) {
		srcs = append(srcs, src.source)
	}
	migrate := fmt.Sprintf("a ModelCache may use Secrets of %s; a Secret of namespace %s only where a ModelCacheCredentials of %s grants it: create one there with modelCache: %s, secretName: %s, sources: [%s] (docs/tenancy.md)",
		s.cfg.Namespace, ns, ns, mc.Name, name, clip(fetchers.RedactText(strings.Join(srcs, ", ")), MaxStatusURI))
	if s.credInf == nil || !s.credInf.HasSynced() {
		return nil, "spec.secretRef names Secret " + ns + "/" + name + ": the ModelCacheCredentials objects are not listed yet (is their CRD installed?); " + migrate
	}
	objs, _ := s.credInf.GetIndexer().ByIndex(cache.NamespaceIndex, ns)
	var names []string
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		var g ModelCacheCredentials
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &g); err != nil {
			continue
		}
		if g.Spec.ModelCache != mc.Name || g.Spec.SecretName != name {
			continue
		}
		missing := ungranted(g.Spec.Sources, srcs)
		if len(missing) == 0 {
			return &g, ""
		}
		names = append(names, fmt.Sprintf("%s (it does not list %s)", g.Name, clip(fetchers.RedactText(strings.Join(missing, ", ")), MaxStatusURI)))
	}
	if len(names) > 0 {
		sort.Strings(names)
		return nil, "spec.secretRef names Secret " + ns + "/" + name + " of another namespace; the ModelCacheCredentials of " + ns + " that grant it to " + mc.Name +
			" do not grant every source: " + strings.Join(names, "; ") + ": add the sources there"
	}
	return nil, "spec.secretRef names Secret " + ns + "/" + name + " of another namespace; refused: " + migrate
}

// ungranted are the sources no granted entry admits: each must be one of
// them as written, or one of them pinned at a revision (atRevision).
func ungranted(granted, srcs []string) []string {
	var out []string
	for _, src := range srcs {
		ok := false
		for _, g := range granted {
			if g == src || atRevision(g, src) == nil {
				ok = true
				break
			}
		}
		if !ok {
			out = append(out, src)
		}
	}
	return out
}

// namespaces is own and more, deduplicated and sorted.
func namespaces(own string, more []string) []string {
	seen := map[string]bool{own: true}
	out := []string{own}
	for _, n := range more {
		if n != "" && !seen[n] {
			seen[n] = true
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// refuseCredentials raises the Warning Event of a refused secretRef once
// per reason (seen carries the keys told this pass, as refuse does).
func (s *Syncer) refuseCredentials(mc *ModelCache, why string, seen map[string]bool) {
	if s.told(mc.Name+"/credentials/"+why, seen) {
		return
	}
	s.log.Warn("k8s sync: refused a ModelCache's Secret", "modelcache", mc.Name, "why", why)
	s.warnOn(mc, EventCredentialsRefused, clipText(why, MaxStatusMessage))
}
