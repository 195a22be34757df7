package kernelcache

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/sigstore/cosign/v2/pkg/cosign"
	"github.com/sigstore/cosign/v2/pkg/oci/mutate"
	ociremote "github.com/sigstore/cosign/v2/pkg/oci/remote"
	"github.com/sigstore/cosign/v2/pkg/oci/static"
	"github.com/sigstore/sigstore-go/pkg/sign"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/payload"

	"github.com/modelcache/modelcache/gpu/mcv"
)

// Registry is where images are pushed and how: credentials (the zero
// value reads them as crane and docker do: authn.DefaultKeychain, that is
// $DOCKER_CONFIG/config.json or ~/.docker/config.json and its credential
// helpers) and plain HTTP for a registry without TLS.
type Registry struct {
	Keychain authn.Keychain
	// Insecure talks plain HTTP (loopback registries always do).
	Insecure bool
}

// ParseRef reads oci://<registry>/<repository>[:tag] (or the same without
// the scheme).
func (r Registry) ParseRef(uri string) (name.Reference, error) {
	s := strings.TrimPrefix(uri, "oci://")
	var opts []name.Option
	if r.Insecure {
		opts = append(opts, name.Insecure)
	}
	ref, err := name.ParseReference(s, append(opts, name.StrictValidation)...)
	if err != nil {
		if ref, err = name.ParseReference(s, opts...); err != nil {
			return nil, fmt.Errorf("%s: %w; write oci://<registry>/<repository>:<tag>", uri, err)
		}
	}
	return ref, nil
}

func (r Registry) options(ctx context.Context) []remote.Option {
	kc := r.Keychain
	if kc == nil {
		kc = authn.DefaultKeychain
	}
	return []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(kc)}
}

// Title is org.opencontainers.image.title for a reference: the last part
// of its repository (schema2image.go's imageTitleFromName).
func Title(ref name.Reference) string {
	repo := ref.Context().RepositoryStr()
	return repo[strings.LastIndexByte(repo, '/')+1:]
}

// Push writes b's image to ref and returns the digest it is pinned by.
func (r Registry) Push(ctx context.Context, ref name.Reference, b *Built) (name.Digest, error) {
	if err := remote.Write(ref, b.Image, r.options(ctx)...); err != nil {
		return name.Digest{}, fmt.Errorf("push %s: %w", ref, err)
	}
	d, err := b.Image.Digest()
	if err != nil {
		return name.Digest{}, err
	}
	return ref.Context().Digest(d.String()), nil
}

// Signer signs an image's digest: with a cosign key (KeySigner) or keyless
// (FulcioSigner).
type Signer interface {
	// sign signs the simple signing payload and returns the signature
	// and, keyless, the PEM certificate chain.
	sign(ctx context.Context, pl []byte) (sig []byte, cert, chain []byte, err error)
}

// KeySigner signs with a cosign private key (cosign generate-key-pair's
// cosign.key), decrypted with the password (cosign reads COSIGN_PASSWORD).
func KeySigner(keyPEM, password []byte) (Signer, error) {
	sv, err := cosign.LoadPrivateKey(keyPEM, password, nil)
	if err != nil {
		return nil, fmt.Errorf("cosign key: %w (a key from cosign generate-key-pair, its password in COSIGN_PASSWORD)", err)
	}
	return keySigner{sv}, nil
}

type keySigner struct{ sv signature.SignerVerifier }

func (k keySigner) sign(_ context.Context, pl []byte) ([]byte, []byte, []byte, error) {
	sig, err := k.sv.SignMessage(bytes.NewReader(pl))
	return sig, nil, nil, err
}

// FulcioSigner signs keyless: an ephemeral key whose certificate Fulcio
// (at url) issues for the OIDC identity token; the certificate travels
// with the signature. Nothing is written to a transparency log (the node
// verifies offline, against a trusted root). Not tested here: it needs a
// Fulcio and an OIDC provider.
func FulcioSigner(url, idToken string) (Signer, error) {
	if idToken == "" {
		return nil, errors.New("keyless signing needs an OIDC identity token (--identity-token)")
	}
	if url == "" {
		url = "https://fulcio.sigstore.dev"
	}
	return fulcioSigner{url: url, token: idToken}, nil
}

type fulcioSigner struct{ url, token string }

func (f fulcioSigner) sign(ctx context.Context, pl []byte) ([]byte, []byte, []byte, error) {
	kp, err := sign.NewEphemeralKeypair(nil)
	if err != nil {
		return nil, nil, nil, err
	}
	der, err := sign.NewFulcio(&sign.FulcioOptions{BaseURL: f.url}).GetCertificate(ctx, kp, &sign.CertificateProviderOptions{IDToken: f.token})
	if err != nil {
		return nil, nil, nil, fmt.Errorf("certificate from %s: %w", f.url, err)
	}
	if _, err := x509.ParseCertificate(der); err != nil {
		return nil, nil, nil, fmt.Errorf("certificate from %s: %w", f.url, err)
	}
	sig, _, err := kp.SignData(ctx, pl)
	if err != nil {
		return nil, nil, nil, err
	}
	return sig, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil, nil
}

// Sign attaches a cosign signature of dref to its repository, as cosign
// v2's sign does by default: the simple signing payload under the
// sha256-<hex>.sig tag. What the daemon verifies (and cosign verify).
func (r Registry) Sign(ctx context.Context, dref name.Digest, s Signer) error {
	pl, err := (&payload.Cosign{Image: dref}).MarshalJSON()
	if err != nil {
		return err
	}
	raw, cert, chain, err := s.sign(ctx, pl)
	if err != nil {
		return err
	}
	var sopts []static.Option
	if cert != nil {
		sopts = append(sopts, static.WithCertChain(cert, chain))
	}
	sig, err := static.NewSignature(pl, base64.StdEncoding.EncodeToString(raw), sopts...)
	if err != nil {
		return err
	}
	ro := ociremote.WithRemoteOptions(r.options(ctx)...)
	se, err := ociremote.SignedEntity(dref, ro)
	if err != nil {
		return fmt.Errorf("sign %s: %w", dref, err)
	}
	se, err = mutate.AttachSignatureToEntity(se, sig)
	if err != nil {
		return err
	}
	if err := ociremote.WriteSignatures(dref.Repository, se, ro); err != nil {
		return fmt.Errorf("write the signature of %s: %w", dref, err)
	}
	return nil
}

// ParseTarget reads --target: backend:arch[:warp size], e.g. cuda:90,
// cuda:sm_90a, hip:gfx90a:64. The warp size defaults to 32 for cuda and
// 64 for hip.
func ParseTarget(s string) (mcv.SummaryTarget, error) {
	parts := strings.Split(s, ":")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return mcv.SummaryTarget{}, fmt.Errorf("--target %q: write backend:arch[:warp], e.g. cuda:90 or hip:gfx90a", s)
	}
	t := mcv.SummaryTarget{Backend: strings.ToLower(parts[0]), Arch: strings.TrimPrefix(parts[1], "sm_")}
	switch t.Backend {
	case "cuda":
		t.WarpSize = 32
	case "hip", "rocm":
		t.Backend, t.WarpSize = "hip", 64
	default:
		return t, fmt.Errorf("--target %q: backend %s: use cuda or hip", s, t.Backend)
	}
	if len(parts) == 3 {
		if _, err := fmt.Sscanf(parts[2], "%d", &t.WarpSize); err != nil || t.WarpSize <= 0 {
			return t, fmt.Errorf("--target %q: warp size %q is not a positive number", s, parts[2])
		}
	}
	return t, nil
}

// ReadKey reads a cosign key file and its password from COSIGN_PASSWORD.
func ReadKey(path string) (Signer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--key: %w", err)
	}
	if !bytes.Contains(b, []byte("-----BEGIN")) {
		return nil, fmt.Errorf("--key %s: not a PEM key file (cosign generate-key-pair writes cosign.key)", path)
	}
	return KeySigner(b, []byte(os.Getenv("COSIGN_PASSWORD")))
}
