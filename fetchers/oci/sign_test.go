package oci_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/modelcache/modelcache/fetchers/oci"
	"github.com/modelcache/modelcache/fetchers/oci/ocitest"
	"github.com/modelcache/modelcache/internal/testenv"
)

// testCA makes a CA and a leaf certificate for identity, issued by the
// OIDC issuer iss (the Fulcio extensions), as a private Fulcio would. It
// returns the paths of the leaf key (PKCS#8 PEM), the leaf certificate
// and the CA certificate.
func testCA(t *testing.T, dir, identity, iss string) (string, string, string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "modelcache test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leafKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	issV2, _ := asn1.Marshal(iss)
	u, _ := url.Parse("https://ci.example.com/kernels")
	_ = u
	leafTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), NotBefore: now.Add(-time.Minute), NotAfter: now.Add(2 * time.Hour),
		EmailAddresses: []string{identity}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning},
		ExtraExtensions: []pkix.Extension{
			{Id: asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 57264, 1, 1}, Value: []byte(iss)}, // issuer (v1)
			{Id: asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 57264, 1, 8}, Value: issV2},       // issuer (v2)
		}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &leafKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pk8, _ := x509.MarshalPKCS8PrivateKey(leafKey)
	write := func(n, typ string, der []byte) string {
		p := filepath.Join(dir, n)
		os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
		return p
	}
	return write("leaf.pem", "PRIVATE KEY", pk8), write("leaf.crt", "CERTIFICATE", leafDER), write("ca.crt", "CERTIFICATE", caDER)
}

func TestSignaturesWithRealCosign(t *testing.T) {
	host := testenv.Registry(t)
	cs := ocitest.NewCosign(t)
	key1, pub1 := cs.KeyPair(t, "k1")
	_, pub2 := cs.KeyPair(t, "k2")
	read := func(p string) []byte {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	good := oci.SignaturePolicy{PublicKeys: [][]byte{read(pub1)}}
	wrong := oci.SignaturePolicy{PublicKeys: [][]byte{read(pub2)}}
	f := oci.New(oci.WithInsecureRegistries(host))
	ctx := context.Background()
	image := func(repo string, seed byte) (string, string) {
		img := ocitest.SM90(map[string][]byte{"h90/kernel.cubin": {seed, 1, 2, 3}}).Image(t)
		return "oci://" + host + "/" + repo, ocitest.Push(t, host, repo, img)
	}
	verify := func(uri, dg string, p oci.SignaturePolicy) (*oci.SignatureResult, error) {
		return f.VerifySignature(ctx, uri, dg, p)
	}

	// cosign v2: a .sig tag.
	uriA, dgA := image("kc/a:v1", 1)
	cs.SignV2(t, key1, host+"/kc/a@"+dgA)
	if r, err := verify(uriA, dgA, good); err != nil || r.Format != oci.FormatCosignTag || !strings.HasPrefix(r.Signer, "key sha256:") {
		t.Fatalf("v2 signature with the right key: %+v %v", r, err)
	}
	if _, err := verify(uriA, dgA, wrong); !errors.Is(err, oci.ErrBadSignature) {
		t.Fatalf("v2 signature with the wrong key must fail verification: %v", err)
	}

	// cosign v3: a sigstore bundle under the referrers tag fallback
	// (distribution 2.8 has no referrers API).
	uriB, dgB := image("kc/b:v1", 2)
	cs.SignV3(t, key1, host+"/kc/b@"+dgB)
	if r, err := verify(uriB, dgB, good); err != nil || r.Format != oci.FormatBundle {
		t.Fatalf("v3 bundle with the right key: %+v %v", r, err)
	}
	if _, err := verify(uriB, dgB, wrong); !errors.Is(err, oci.ErrBadSignature) {
		t.Fatalf("v3 bundle with the wrong key must fail verification: %v", err)
	}

	// Unsigned.
	uriC, dgC := image("kc/c:v1", 3)
	if _, err := verify(uriC, dgC, good); !errors.Is(err, oci.ErrUnsigned) || !strings.Contains(err.Error(), "cosign sign") {
		t.Fatalf("an unsigned image must say so and how to fix it: %v", err)
	}

	// Changed after signing: image D carries A's signature (copied to
	// D's .sig tag). The signed payload names A's digest, not D's.
	uriD, dgD := image("kc/a:v2", 4)
	sigA, err := remote.Image(mustRef(t, host+"/kc/a:sha256-"+strings.TrimPrefix(dgA, "sha256:")+".sig"))
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(mustRef(t, host+"/kc/a:sha256-"+strings.TrimPrefix(dgD, "sha256:")+".sig"), sigA); err != nil {
		t.Fatal(err)
	}
	if _, err := verify(uriD, dgD, good); !errors.Is(err, oci.ErrBadSignature) {
		t.Fatalf("a signature of other content must not verify: %v", err)
	}
	// The same for a bundle copied onto another image's referrers tag.
	uriE, dgE := image("kc/b:v2", 5)
	idxB, err := remote.Index(mustRef(t, host+"/kc/b:sha256-"+strings.TrimPrefix(dgB, "sha256:")))
	if err != nil {
		t.Fatalf("the v3 bundle is not under the referrers tag fallback: %v", err)
	}
	if err := remote.WriteIndex(mustRef(t, host+"/kc/b:sha256-"+strings.TrimPrefix(dgE, "sha256:")), idxB); err != nil {
		t.Fatal(err)
	}
	if _, err := verify(uriE, dgE, good); !errors.Is(err, oci.ErrBadSignature) {
		t.Fatalf("a bundle of other content must not verify: %v", err)
	}

	// Keyless: a certificate from a private CA, issuer and identity in it.
	leafKey, leafCrt, caCrt := testCA(t, cs.Dir, "builder@example.com", "https://issuer.example.com")
	ckey := cs.ImportKey(t, leafKey, "leaf")
	uriK, dgK := image("kc/k:v1", 6)
	cs.SignV2(t, ckey, host+"/kc/k@"+dgK, "--certificate", leafCrt, "--certificate-chain", caCrt)
	keyless := oci.SignaturePolicy{Identity: "builder@example.com", Issuer: "https://issuer.example.com", TrustedRoot: caCrt}
	if r, err := verify(uriK, dgK, keyless); err != nil || !strings.Contains(r.Signer, "builder@example.com") {
		t.Fatalf("keyless with the right identity: %+v %v", r, err)
	}
	for _, bad := range []oci.SignaturePolicy{
		{Identity: "attacker@example.com", Issuer: "https://issuer.example.com", TrustedRoot: caCrt},
		{Identity: "builder@example.com", Issuer: "https://other-issuer.example.com", TrustedRoot: caCrt},
	} {
		if _, err := verify(uriK, dgK, bad); !errors.Is(err, oci.ErrBadSignature) {
			t.Fatalf("keyless with identity %s / issuer %s must fail: %v", bad.Identity, bad.Issuer, err)
		}
	}
	// Another CA: the certificate does not chain to the trusted root.
	_, _, otherCA := testCA(t, t.TempDir(), "builder@example.com", "https://issuer.example.com")
	if _, err := verify(uriK, dgK, oci.SignaturePolicy{Identity: "builder@example.com", Issuer: "https://issuer.example.com", TrustedRoot: otherCA}); !errors.Is(err, oci.ErrBadSignature) {
		t.Fatalf("a certificate from an untrusted CA must fail: %v", err)
	}
	// A policy with nothing to check against is refused, not passed.
	if _, err := verify(uriA, dgA, oci.SignaturePolicy{}); !errors.Is(err, oci.ErrBadSignature) || !strings.Contains(err.Error(), "no public key") {
		t.Fatalf("an empty policy: %v", err)
	}
}

func mustRef(t *testing.T, s string) name.Reference {
	r, err := name.ParseReference(s, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestKeylessBundlesWithRealCosign: a sigstore bundle that cosign v3
// signs with a certificate from a private CA verifies against that CA,
// given as a PEM bundle or as a sigstore trusted_root.json, when the
// certificate's issuer and subject match; another identity, issuer or CA
// fails, and so does a trusted root whose CA's validity has ended.
func TestKeylessBundlesWithRealCosign(t *testing.T) {
	host := testenv.Registry(t)
	cs := ocitest.NewCosign(t)
	f := oci.New(oci.WithInsecureRegistries(host))
	ctx := context.Background()
	img := ocitest.SM90(map[string][]byte{"h90/kernel.cubin": {7, 1, 2, 3}}).Image(t)
	uri, dg := "oci://"+host+"/kc/kb", ocitest.Push(t, host, "kc/kb:v1", img)
	leafKey, leafCrt, caCrt := testCA(t, cs.Dir, "builder@example.com", "https://issuer.example.com")
	cs.SignV3(t, cs.ImportKey(t, leafKey, "leaf"), host+"/kc/kb@"+dg, "--certificate", leafCrt, "--certificate-chain", caCrt)

	caPEM, err := os.ReadFile(caCrt)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(caPEM)
	trustedRoot := func(validFor string) string {
		return `{"mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
  "certificateAuthorities": [{"subject": {"organization": "modelcache", "commonName": "modelcache test CA"},
    "uri": "https://fulcio.example.com", "certChain": {"certificates": [{"rawBytes": "` + base64.StdEncoding.EncodeToString(blk.Bytes) + `"}]},
    "validFor": ` + validFor + `}]}`
	}
	current := trustedRoot(`{"start": "` + time.Now().Add(-time.Hour).UTC().Format(time.RFC3339) + `"}`)
	ended := trustedRoot(`{"start": "2020-01-01T00:00:00Z", "end": "2021-01-01T00:00:00Z"}`)
	good := func(root string) oci.SignaturePolicy {
		return oci.SignaturePolicy{Identity: "builder@example.com", Issuer: "https://issuer.example.com", TrustedRoot: root}
	}
	for name, root := range map[string]string{"a PEM CA": caCrt, "a trusted_root.json": current} {
		if r, err := f.VerifySignature(ctx, uri, dg, good(root)); err != nil || r.Format != oci.FormatBundle || !strings.Contains(r.Signer, "builder@example.com") {
			t.Fatalf("keyless bundle against %s: %+v %v", name, r, err)
		}
	}
	if _, err := f.VerifySignature(ctx, uri, dg, oci.SignaturePolicy{IdentityRegexp: `^builder@`, IssuerRegexp: `^https://issuer\.example\.com$`, TrustedRoot: caCrt}); err != nil {
		t.Fatalf("keyless bundle by regexps: %v", err)
	}
	_, _, otherCA := testCA(t, t.TempDir(), "builder@example.com", "https://issuer.example.com")
	for name, p := range map[string]oci.SignaturePolicy{
		"another identity":          {Identity: "attacker@example.com", Issuer: "https://issuer.example.com", TrustedRoot: caCrt},
		"another issuer":            {Identity: "builder@example.com", Issuer: "https://other-issuer.example.com", TrustedRoot: caCrt},
		"an identity regexp missed": {IdentityRegexp: `^attacker@`, Issuer: "https://issuer.example.com", TrustedRoot: caCrt},
		"another CA":                good(otherCA),
		"a CA no longer valid":      good(ended),
	} {
		if _, err := f.VerifySignature(ctx, uri, dg, p); !errors.Is(err, oci.ErrBadSignature) {
			t.Fatalf("keyless bundle with %s must fail verification: %v", name, err)
		}
	}
	// A key policy does not accept a bundle signed with a certificate.
	if _, err := f.VerifySignature(ctx, uri, dg, oci.SignaturePolicy{PublicKeys: [][]byte{pubPEM(t, leafCrt)}}); !errors.Is(err, oci.ErrBadSignature) {
		t.Fatalf("a certificate's bundle under a key policy: %v", err)
	}
	// A trusted_root.json that is not one is refused, naming what is wrong.
	if _, err := f.VerifySignature(ctx, uri, dg, good(`{"certificateAuthorities": 3}`)); !errors.Is(err, oci.ErrBadSignature) || !strings.Contains(err.Error(), "trusted_root.json") {
		t.Fatalf("a malformed trusted root: %v", err)
	}
}

// pubPEM is the PEM public key of the certificate at path.
func pubPEM(t *testing.T, path string) []byte {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(c.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}
