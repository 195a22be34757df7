package kernels

import (
	"fmt"
	"strings"

	"github.com/modelcache/modelcache/api"
	"github.com/modelcache/modelcache/daemon/sources"
	"github.com/modelcache/modelcache/fetchers"
	ocifetcher "github.com/modelcache/modelcache/fetchers/oci"
)

// EffectivePolicy is the policy a kernel cache desire is checked under.
// The node's policy (--kernel-cache-signature-policy) is the default and,
// for a desire from the socket, the floor: a pull may ask for required
// where the node says off, never for off where the node says required
// (the daemon's validation refuses that; a desire persisted before the
// floor existed is raised here). models.d and the cluster are the node's
// configuration and set their own.
func EffectivePolicy(floor string, ds api.Desire, asked string) string {
	if floor == "" {
		floor = api.PolicyRequired
	}
	switch {
	case asked == "":
		return floor
	case asked == api.PolicyOff && ds.Origin == sources.OriginAPI:
		return floor
	}
	return asked
}

// signaturePolicy turns the wire policy into the verifier's: keys given
// as paths (models.d only) are read from the node, bounded.
func signaturePolicy(p api.SignaturePolicy) (ocifetcher.SignaturePolicy, error) {
	switch p.Policy {
	case "", api.PolicyRequired, api.PolicyOff:
	default:
		return ocifetcher.SignaturePolicy{}, fmt.Errorf("%w: signature policy %q: use required or off", ocifetcher.ErrBadSignature, p.Policy)
	}
	out := ocifetcher.SignaturePolicy{Identity: p.Identity, IdentityRegexp: p.IdentityRegexp, Issuer: p.Issuer, IssuerRegexp: p.IssuerRegexp, TrustedRoot: p.TrustedRoot}
	for _, k := range p.Keys {
		if strings.Contains(k, "-----BEGIN") {
			out.PublicKeys = append(out.PublicKeys, []byte(k))
			continue
		}
		b, err := fetchers.ReadConfigFile(k, ocifetcher.MaxTrustedRoot)
		if err != nil {
			return out, fmt.Errorf("%w: public key: %v", ocifetcher.ErrBadSignature, err)
		}
		out.PublicKeys = append(out.PublicKeys, b)
	}
	return out, nil
}
