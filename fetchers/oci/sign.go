package oci

import (
	"bytes"
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/modelcache/modelcache/fetchers"
	"github.com/sigstore/cosign/v2/pkg/cosign"
	ociremote "github.com/sigstore/cosign/v2/pkg/oci/remote"
	"github.com/sigstore/sigstore-go/pkg/bundle"
	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore-go/pkg/verify"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
)

// Signature errors. Both are permanent: retrying does not sign an image.
var (
	ErrUnsigned     = errors.New("no signature")
	ErrBadSignature = errors.New("signature verification failed")
)

// Signature formats.
const (
	FormatCosignTag = "cosign-sig-tag"  // cosign v2's default: simple signing payload under sha256-<hex>.sig
	FormatBundle    = "sigstore-bundle" // cosign v3's default: a bundle attached as an OCI referrer
)

// bundleMediaPrefix marks a sigstore bundle referrer (cosign v3 writes
// application/vnd.dev.sigstore.bundle.v0.3+json); maxBundle bounds what is
// read of one.
const (
	bundleMediaPrefix = "application/vnd.dev.sigstore.bundle"
	maxBundle         = 1 << 20
)

// SignaturePolicy says what must have signed an image. Key-based: any of
// PublicKeys (PEM). Keyless: a certificate chaining to TrustedRoot (a
// sigstore trusted_root.json or a PEM bundle of CA certificates, read
// offline) whose issuer and subject match. Transparency logs and SCTs are
// not consulted: nodes verify offline.
type SignaturePolicy struct {
	PublicKeys     [][]byte
	Identity       string // certificate subject (email or URI SAN)
	IdentityRegexp string
	Issuer         string // OIDC issuer recorded in the certificate
	IssuerRegexp   string
	TrustedRoot    string
}

// Keyless says whether the policy names a certificate identity.
func (p SignaturePolicy) Keyless() bool {
	return p.Identity != "" || p.IdentityRegexp != ""
}

// SignatureResult is what a verification found.
type SignatureResult struct {
	Digest string `json:"digest"`
	Format string `json:"format"`
	// Signer: "key sha256:<fingerprint>" or "<subject> (issuer <issuer>)".
	Signer string `json:"signer"`
}

// VerifySignature checks that the image at uri's repository with this
// digest carries a signature the policy trusts, in either format. It reads
// only signature manifests and payloads, never a layer of the image.
func (f *Fetcher) VerifySignature(ctx context.Context, uri, digest string, p SignaturePolicy) (*SignatureResult, error) {
	ref, err := f.ParseURI(uri)
	if err != nil {
		return nil, err
	}
	dref := ref.Context().Digest(digest)
	keys, err := loadKeys(p.PublicKeys)
	if err != nil {
		return nil, err
	}
	var ca *root.FulcioCertificateAuthority
	if p.Keyless() {
		if p.Issuer == "" && p.IssuerRegexp == "" {
			return nil, fmt.Errorf("%w: a keyless policy needs the certificate issuer as well as the identity", ErrBadSignature)
		}
		if ca, err = loadTrustedRoot(p.TrustedRoot); err != nil {
			return nil, err
		}
	}
	if len(keys) == 0 && ca == nil {
		return nil, fmt.Errorf("%w: the policy names no public key and no certificate identity; set one, or turn the policy off", ErrBadSignature)
	}
	var reasons []string
	found := false

	// Classic cosign signatures under the sha256-<hex>.sig tag.
	ropts := []ociremote.Option{ociremote.WithRemoteOptions(f.remote(ctx)...)}
	try := func(co *cosign.CheckOpts, signer string) (*SignatureResult, bool) {
		co.RegistryClientOpts, co.IgnoreTlog, co.IgnoreSCT, co.ClaimVerifier = ropts, true, true, cosign.SimpleClaimVerifier
		_, _, err := cosign.VerifyImageSignatures(ctx, dref, co)
		var none *cosign.ErrNoSignaturesFound
		switch {
		case err == nil:
			return &SignatureResult{Digest: digest, Format: FormatCosignTag, Signer: signer}, true
		case errors.As(err, &none):
		default:
			found = true
			reasons = append(reasons, fmt.Sprintf("%s: %v", FormatCosignTag, err))
		}
		return nil, false
	}
	for _, k := range keys {
		if r, ok := try(&cosign.CheckOpts{SigVerifier: k.v}, k.name); ok {
			return r, nil
		}
	}
	if ca != nil {
		roots, inter := x509.NewCertPool(), x509.NewCertPool()
		roots.AddCert(ca.Root)
		for _, c := range ca.Intermediates {
			inter.AddCert(c)
		}
		co := &cosign.CheckOpts{RootCerts: roots, IntermediateCerts: inter,
			Identities: []cosign.Identity{{Issuer: p.Issuer, IssuerRegExp: p.IssuerRegexp, Subject: p.Identity, SubjectRegExp: p.IdentityRegexp}}}
		if r, ok := try(co, identityName(p)); ok {
			return r, nil
		}
	}

	// Sigstore bundles attached as referrers (or under the sha256-<hex>
	// tag where the registry has no referrers API).
	bundles, err := f.bundles(ctx, dref)
	if err != nil {
		reasons = append(reasons, fmt.Sprintf("%s: listing referrers: %v", FormatBundle, err))
	}
	hexd, _ := strings.CutPrefix(digest, "sha256:")
	raw, _ := hex.DecodeString(hexd)
	for _, b := range bundles {
		found = true
		for _, k := range keys {
			tm := root.NewTrustedPublicKeyMaterial(func(string) (root.TimeConstrainedVerifier, error) {
				return root.NewExpiringKey(k.v, time.Time{}, time.Time{}), nil
			})
			v, err := verify.NewVerifier(tm, verify.WithNoObserverTimestamps())
			if err == nil {
				_, err = v.Verify(b, verify.NewPolicy(verify.WithArtifactDigest("sha256", raw), verify.WithKey()))
			}
			if err == nil {
				return &SignatureResult{Digest: digest, Format: FormatBundle, Signer: k.name}, nil
			}
			reasons = append(reasons, fmt.Sprintf("%s with %s: %v", FormatBundle, k.name, err))
		}
		if ca != nil {
			err := verifyBundleKeyless(b, ca, p, raw)
			if err == nil {
				return &SignatureResult{Digest: digest, Format: FormatBundle, Signer: identityName(p)}, nil
			}
			reasons = append(reasons, fmt.Sprintf("%s keyless: %v", FormatBundle, err))
		}
	}
	if !found {
		return nil, fmt.Errorf("%s: %w in either format (cosign .sig tag or sigstore bundle referrer); sign the image (cosign sign --key …) or set the signature policy off", dref, ErrUnsigned)
	}
	return nil, fmt.Errorf("%s: %w: %s", dref, ErrBadSignature, strings.Join(reasons, "; "))
}

func verifyBundleKeyless(b *bundle.Bundle, ca *root.FulcioCertificateAuthority, p SignaturePolicy, digest []byte) error {
	tr, err := root.NewTrustedRoot(root.TrustedRootMediaType01, []root.CertificateAuthority{ca}, nil, nil, nil)
	if err != nil {
		return err
	}
	id, err := verify.NewShortCertificateIdentity(p.Issuer, p.IssuerRegexp, p.Identity, p.IdentityRegexp)
	if err != nil {
		return err
	}
	// No transparency log offline: the certificate is checked at the
	// current time, as for a private CA with long-lived certificates.
	v, err := verify.NewVerifier(tr, verify.WithCurrentTime())
	if err != nil {
		return err
	}
	_, err = v.Verify(b, verify.NewPolicy(verify.WithArtifactDigest("sha256", digest), verify.WithCertificateIdentity(id)))
	return err
}

// bundles lists the sigstore bundles that refer to the image. go-containerregistry
// falls back to the sha256-<hex> tag index when the registry has no referrers API.
func (f *Fetcher) bundles(ctx context.Context, dref name.Digest) ([]*bundle.Bundle, error) {
	idx, err := remote.Referrers(dref, f.remote(ctx)...)
	if err != nil {
		return nil, err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var out []*bundle.Bundle
	for _, m := range im.Manifests {
		// cosign v3 marks the bundle by the layer's media type; the entry's
		// artifactType may be the bundle type or the empty config's.
		if !strings.HasPrefix(m.ArtifactType, bundleMediaPrefix) && m.ArtifactType != "application/vnd.oci.empty.v1+json" {
			continue
		}
		img, err := remote.Image(dref.Context().Digest(m.Digest.String()), f.remote(ctx)...)
		if err != nil {
			return out, err
		}
		mf, err := img.Manifest()
		if err != nil {
			return out, err
		}
		if len(mf.Layers) != 1 || !strings.HasPrefix(string(mf.Layers[0].MediaType), bundleMediaPrefix) || mf.Layers[0].Size > maxBundle {
			continue
		}
		layers, err := img.Layers()
		if err != nil || len(layers) == 0 {
			return out, fmt.Errorf("bundle %s: no layer: %v", m.Digest, err)
		}
		rc, err := layers[0].Compressed()
		if err != nil {
			return out, err
		}
		body, err := io.ReadAll(io.LimitReader(rc, maxBundle))
		rc.Close()
		if err != nil {
			return out, err
		}
		var b bundle.Bundle
		if err := json.Unmarshal(body, &b); err != nil {
			return out, fmt.Errorf("bundle %s: %w", m.Digest, err)
		}
		out = append(out, &b)
	}
	return out, nil
}

type namedKey struct {
	v    signature.Verifier
	name string
}

func loadKeys(pems [][]byte) ([]namedKey, error) {
	var out []namedKey
	for i, p := range pems {
		pub, err := cryptoutils.UnmarshalPEMToPublicKey(bytes.TrimSpace(p))
		if err != nil {
			return nil, fmt.Errorf("%w: public key %d: %v (want a PEM public key, as cosign generate-key-pair writes to cosign.pub)", ErrBadSignature, i+1, err)
		}
		v, err := signature.LoadVerifier(pub, crypto.SHA256)
		if err != nil {
			return nil, fmt.Errorf("%w: public key %d: %v", ErrBadSignature, i+1, err)
		}
		der, _ := x509.MarshalPKIXPublicKey(pub)
		sum := sha256.Sum256(der)
		out = append(out, namedKey{v: v, name: "key sha256:" + hex.EncodeToString(sum[:])[:16]})
	}
	return out, nil
}

// MaxTrustedRoot bounds a trusted root or key read from the node.
const MaxTrustedRoot = 4 << 20

// IsInlineTrustedRoot reports whether s is a trusted root's content (a
// trusted_root.json or a PEM bundle) rather than a path.
func IsInlineTrustedRoot(s string) bool {
	t := strings.TrimSpace(s)
	return strings.HasPrefix(t, "{") || strings.HasPrefix(t, "-----BEGIN")
}

// loadTrustedRoot reads a sigstore trusted_root.json or a PEM bundle (the
// root CA first or alone; the others are intermediates), given as its
// content or as a path on the node (a regular file, bounded).
func loadTrustedRoot(path string) (*root.FulcioCertificateAuthority, error) {
	if path == "" {
		return nil, fmt.Errorf("%w: a keyless policy needs a trusted root (a trusted_root.json or a PEM CA bundle) on this node", ErrBadSignature)
	}
	var b []byte
	if IsInlineTrustedRoot(path) {
		b, path = []byte(path), "(inline)"
	} else {
		var err error
		if b, err = fetchers.ReadConfigFile(path, MaxTrustedRoot); err != nil {
			return nil, fmt.Errorf("%w: trusted root: %v", ErrBadSignature, err)
		}
	}
	if bytes.HasPrefix(bytes.TrimSpace(b), []byte("{")) {
		tr, err := root.NewTrustedRootFromJSON(b)
		if err != nil {
			return nil, fmt.Errorf("%w: trusted root %s is not a valid sigstore trusted_root.json (%s)", ErrBadSignature, path, jsonErrorKind(err))
		}
		for _, c := range tr.FulcioCertificateAuthorities() {
			if fca, ok := c.(*root.FulcioCertificateAuthority); ok {
				return fca, nil
			}
		}
		return nil, fmt.Errorf("%w: trusted root %s lists no certificate authority", ErrBadSignature, path)
	}
	var certs []*x509.Certificate
	for rest := b; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%w: trusted root %s: %v", ErrBadSignature, path, err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("%w: trusted root %s holds no PEM certificate", ErrBadSignature, path)
	}
	ca := &root.FulcioCertificateAuthority{Root: certs[0], Intermediates: certs[1:]}
	for _, c := range certs {
		if c.IsCA && bytes.Equal(c.RawIssuer, c.RawSubject) {
			ca.Root = c
		}
	}
	ca.Intermediates = nil
	for _, c := range certs {
		if c != ca.Root {
			ca.Intermediates = append(ca.Intermediates, c)
		}
	}
	return ca, nil
}

func identityName(p SignaturePolicy) string {
	id, iss := p.Identity, p.Issuer
	if id == "" {
		id = "~" + p.IdentityRegexp
	}
	if iss == "" {
		iss = "~" + p.IssuerRegexp
	}
	return fmt.Sprintf("%s (issuer %s)", id, iss)
}

// jsonErrorKind says what was wrong with a JSON document without quoting
// it: a trusted root read from a root-only file must not leak through the
// error text.
func jsonErrorKind(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("syntax error at byte %d", se.Offset)
	case errors.As(err, &te):
		return fmt.Sprintf("field %s has the wrong type", te.Field)
	}
	return "not the trusted root schema"
}
