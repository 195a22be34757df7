package peer_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	authv1client "k8s.io/client-go/kubernetes/typed/authentication/v1"

	"github.com/modelcache/modelcache/internal/kubetest"
	"github.com/modelcache/modelcache/peer"
)

// replace writes content to path by rename, as kubelet and config
// management tools do (a new inode).
func replace(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// The shared token is read again when its file changes: a rotation needs
// no restart.
func TestStaticTokenFollowsTheFile(t *testing.T) {
	tf := tokenFile(t, "first")
	a := peer.StaticTokenAuthenticator{File: tf}
	ctx := context.Background()
	check := func(tok string, ok bool) {
		t.Helper()
		_, err := a.Authenticate(ctx, tok)
		if (err == nil) != ok || (err != nil && !errors.Is(err, peer.ErrUnauthenticated)) {
			t.Errorf("token %q: %v, want accepted=%v", tok, err, ok)
		}
	}
	check("first", true)
	check("firs", false)
	check("first ", false)
	check("", false)
	replace(t, tf.Path(), "second\n")
	check("second", true)
	check("first", false)
	// A file gone or empty accepts nothing.
	os.Remove(tf.Path())
	check("second", false)
	replace(t, tf.Path(), "  \n")
	check("", false)
	check("second", false)
}

func TestTokenFileRejects(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{"empty": "", "blank": " \n\n", "two-tokens": "a\nb\n", "spaced": "a b"} {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(content), 0o600)
		if tok, err := peer.NewTokenFile(p).Token(); err == nil || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: token %q, err %v; want an error naming the file", name, tok, err)
		}
	}
	if _, err := peer.NewTokenFile(dir).Token(); err == nil {
		t.Error("a directory gave a token")
	}
	big := filepath.Join(dir, "big")
	os.WriteFile(big, []byte(strings.Repeat("x", 1<<20)), 0o600)
	if _, err := peer.NewTokenFile(big).Token(); err == nil {
		t.Error("a 1 MiB token was read")
	}
}

// countingReviews counts the TokenReviews sent.
type countingReviews struct {
	authv1client.TokenReviewInterface
	n atomic.Int32
}

func (c *countingReviews) Create(ctx context.Context, tr *authenticationv1.TokenReview, o metav1.CreateOptions) (*authenticationv1.TokenReview, error) {
	c.n.Add(1)
	return c.TokenReviewInterface.Create(ctx, tr, o)
}

// Against a real kube-apiserver: only a token of the daemon's own
// service account, for the peer audience, is accepted; answers are
// cached (positive until the token's exp, negative for NegativeTTL).
func TestTokenReviewAuthenticator(t *testing.T) {
	cl := kubetest.Start(t)
	kc := kubernetes.NewForConfigOrDie(cl.Config)
	ctx := context.Background()
	const ns = "modelcache-system"
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, sa := range []string{"modelcached", "other"} {
		if _, err := kc.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	token := func(sa string, audiences ...string) string {
		tr, err := kc.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: audiences}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	reviews := &countingReviews{TokenReviewInterface: kc.AuthenticationV1().TokenReviews()}
	now := time.Now()
	a, err := peer.NewTokenReviewAuthenticator(reviews, "", ns, "modelcached")
	if err != nil {
		t.Fatal(err)
	}
	a.Now = func() time.Time { return now }
	a.ReviewBurst = 100 // this test is of verdicts, not of the limit (TestTokenFloodCostsNoReviews)
	good := token("modelcached", peer.DefaultAudience)
	for _, tc := range []struct {
		name, token string
		ok          bool
	}{
		{"the daemon's account, peer audience", good, true},
		{"the daemon's account, also another audience", token("modelcached", "elsewhere", peer.DefaultAudience), true},
		{"another account", token("other", peer.DefaultAudience), false},
		{"the daemon's account, API server audience", token("modelcached"), false},
		{"the daemon's account, wrong audience", token("modelcached", "modelcache-peers"), false},
		{"garbage", "not.a.jwt", false},
		{"a forged exp", forgedJWT(), false},
	} {
		_, err := a.Authenticate(ctx, tc.token)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, peer.ErrUnauthenticated)) {
			t.Errorf("%s: %v, want accepted=%v", tc.name, err, tc.ok)
		}
	}
	// The caller is the account and the node its token is bound to: a
	// token bound to the Node object, or the projected token of a pod
	// scheduled there (the DaemonSet's), which names the pod too; a token
	// bound to nothing names no node.
	node, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	no := false
	pod, err := kc.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "modelcached-x"}, Spec: corev1.PodSpec{
		NodeName: "node-a", ServiceAccountName: "modelcached", AutomountServiceAccountToken: &no,
		Containers: []corev1.Container{{Name: "modelcached", Image: "modelcached"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	boundTo := func(kind, name string, uid types.UID) string {
		tr, err := kc.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "modelcached", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
			Audiences: []string{peer.DefaultAudience}, BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: kind, APIVersion: "v1", Name: name, UID: uid}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	const user = "system:serviceaccount:" + ns + ":modelcached"
	for _, tc := range []struct {
		name, token string
		want        peer.Identity
	}{
		{"bound to nothing", good, peer.Identity{User: user}},
		{"bound to the Node", boundTo("Node", "node-a", node.UID), peer.Identity{User: user, Node: "node-a"}},
		{"bound to a pod scheduled on the node", boundTo("Pod", pod.Name, pod.UID),
			peer.Identity{User: user, Node: "node-a", Namespace: ns, Pod: pod.Name, PodUID: string(pod.UID)}},
	} {
		for range 2 { // the second from the cache
			if who, err := a.Authenticate(ctx, tc.token); err != nil || who != tc.want {
				t.Errorf("%s: %+v %v, want %+v", tc.name, who, err, tc.want)
			}
		}
	}
	accepts := func(tok string) bool { _, err := a.Authenticate(ctx, tok); return err == nil }
	// Garbage never reaches the API server.
	n := reviews.n.Load()
	for _, g := range []string{"garbage", "a.b.c", "not.a.jwt", expiredJWT()} {
		if accepts(g + "x") {
			t.Errorf("%q accepted", g)
		}
	}
	if reviews.n.Load() != n {
		t.Errorf("malformed or expired tokens sent %d reviews", reviews.n.Load()-n)
	}
	// Cached: asking again sends no review, until the verdict expires.
	if !accepts(good) || accepts(forgedJWT()) || reviews.n.Load() != n {
		t.Errorf("cached answers sent %d more reviews", reviews.n.Load()-n)
	}
	now = now.Add(a.NegativeTTL + time.Second)
	if !accepts(good) || accepts(forgedJWT()) || reviews.n.Load() != n+1 {
		t.Errorf("after the negative TTL: %d more reviews, want 1 (the rejected token's)", reviews.n.Load()-n)
	}
	now = now.Add(2 * time.Hour) // past the token's exp (1h by default): the acceptance ends
	if _, err := a.Authenticate(ctx, good); !errors.Is(err, peer.ErrUnauthenticated) {
		t.Errorf("after the token's exp: %v, want ErrUnauthenticated", err)
	}
	// A new token presented by many uploads at once is reviewed once.
	now = time.Now()
	fresh, before := token("modelcached", peer.DefaultAudience), reviews.n.Load()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := a.Authenticate(ctx, fresh); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if d := reviews.n.Load() - before; d != 1 {
		t.Errorf("8 concurrent checks of one token sent %d reviews, want 1", d)
	}
	// The caches are bounded.
	a.MaxEntries, a.RefusedEntries = 3, 3
	for i := range 10 {
		a.Authenticate(ctx, fmt.Sprintf("garbage-%d", i))
	}
	if c := a.Cached() - a.CachedAccepted(); c > 3 {
		t.Errorf("the refusal cache holds %d verdicts, more than RefusedEntries 3", c)
	}
	if _, err := peer.NewTokenReviewAuthenticator(reviews, "", "", "modelcached"); err == nil {
		t.Error("an authenticator without the namespace was made")
	}
}

// forgedJWT claims a far exp with no valid signature.
func forgedJWT() string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(`{"exp":99999999999,"sub":"system:serviceaccount:modelcache-system:modelcached","aud":["modelcache-peer"]}`)) + "." + enc([]byte("sig"))
}

// expiredJWT is well formed with an exp in the past.
func expiredJWT() string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(`{"exp":1000}`)) + "." + enc([]byte("sig"))
}

// jwt is a token with the given header and claims and a made-up
// signature.
func jwt(header, claims string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(header)) + "." + enc([]byte(claims)) + "." + enc([]byte("not-a-signature"))
}

// daemonCluster is a real kube-apiserver with the daemon's namespace and
// service account, and a TokenReview counter.
func daemonCluster(t *testing.T) (kubernetes.Interface, *countingReviews) {
	cl := kubetest.Start(t)
	kc := kubernetes.NewForConfigOrDie(cl.Config)
	ctx := context.Background()
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "modelcache-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.CoreV1().ServiceAccounts("modelcache-system").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "modelcached"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return kc, &countingReviews{TokenReviewInterface: kc.AuthenticationV1().TokenReviews()}
}

func peerToken(t *testing.T, kc kubernetes.Interface) string {
	tr, err := kc.CoreV1().ServiceAccounts("modelcache-system").CreateToken(context.Background(), "modelcached",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{peer.DefaultAudience}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// A token whose claims cannot be a daemon's is refused without a
// TokenReview, whatever its signature: another issuer, subject or
// audience, no exp ahead, a nbf to come, no algorithm, too long.
func TestImplausibleTokensCostNoReview(t *testing.T) {
	kc, reviews := daemonCluster(t)
	a, err := peer.NewTokenReviewAuthenticator(reviews, "", "modelcache-system", "modelcached")
	if err != nil {
		t.Fatal(err)
	}
	good := peerToken(t, kc)
	a.Issuer = peer.IssuerOf(good)
	if a.Issuer == "" {
		t.Fatalf("the API server's token has no issuer: %q", good)
	}
	const sub = `"sub":"system:serviceaccount:modelcache-system:modelcached"`
	iss := `"iss":"` + a.Issuer + `"`
	const head, exp, aud = `{"alg":"RS256","kid":"k"}`, `"exp":99999999999`, `"aud":["modelcache-peer"]`
	for name, tok := range map[string]string{
		"another issuer":      jwt(head, `{"iss":"https://evil.example",`+sub+`,`+aud+`,`+exp+`}`),
		"another subject":     jwt(head, `{`+iss+`,"sub":"system:serviceaccount:default:default",`+aud+`,`+exp+`}`),
		"another audience":    jwt(head, `{`+iss+`,`+sub+`,"aud":["https://kubernetes.default.svc"],`+exp+`}`),
		"no audience":         jwt(head, `{`+iss+`,`+sub+`,`+exp+`}`),
		"no exp":              jwt(head, `{`+iss+`,`+sub+`,`+aud+`}`),
		"expired":             jwt(head, `{`+iss+`,`+sub+`,`+aud+`,"exp":1000}`),
		"not valid for years": jwt(head, `{`+iss+`,`+sub+`,`+aud+`,`+exp+`,"nbf":99999999990}`),
		"alg none":            jwt(`{"alg":"none"}`, `{`+iss+`,`+sub+`,`+aud+`,`+exp+`}`),
		"no header":           "." + strings.SplitN(jwt(head, `{`+iss+`,`+sub+`,`+aud+`,`+exp+`}`), ".", 2)[1],
		"a claims array":      jwt(head, `[1,2]`),
		"too long":            jwt(head, `{`+iss+`,`+sub+`,`+aud+`,`+exp+`,"x":"`+strings.Repeat("x", peer.MaxTokenBytes)+`"}`),
		"two parts":           "a.b",
	} {
		if _, err := a.Authenticate(context.Background(), tok); !errors.Is(err, peer.ErrUnauthenticated) {
			t.Errorf("%s: %v, want ErrUnauthenticated", name, err)
		}
	}
	if n := reviews.n.Load(); n != 0 {
		t.Errorf("implausible tokens sent %d TokenReviews, want none", n)
	}
	if _, err := a.Authenticate(context.Background(), good); err != nil || reviews.n.Load() != 1 {
		t.Errorf("the daemon's token: %v after %d reviews, want accepted after 1", err, reviews.n.Load())
	}
}

// The flood of the issue: forged tokens that look like a daemon's (the
// right issuer, subject, audience and a far exp; a made-up signature)
// sent at a real peer server from one address. 1,000 of them cost at
// most 10 TokenReviews (the address's budget), a legitimate peer's
// request from another address during the flood is answered (its time is
// reported, not asserted), and 4,000 more unique tokens evict no cached
// acceptance.
func TestTokenFloodCostsNoReviews(t *testing.T) {
	kc, reviews := daemonCluster(t)
	a, err := peer.NewTokenReviewAuthenticator(reviews, "", "modelcache-system", "modelcached")
	if err != nil {
		t.Fatal(err)
	}
	good, fresh := peerToken(t, kc), peerToken(t, kc)
	a.Issuer = peer.IssuerOf(good)
	s := openStore(t)
	data, b := blobOf(4<<10, 31)
	commit(t, s, data)
	srv, err := peer.NewServer(peer.StoreBlobs{Store: s}, a, peer.WithMaxUploads(64))
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	from := func(ip string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		return &http.Client{Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 64}, Timeout: time.Minute}
	}
	attacker, legit := from("127.0.0.2"), from("127.0.0.3")
	ask := func(c *http.Client, tok string) int {
		req, _ := http.NewRequest(http.MethodGet, hs.URL+peer.BlobPath+b.Digest, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := c.Do(req)
		if err != nil {
			t.Error(err)
			return 0
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := ask(legit, good); code != http.StatusOK {
		t.Fatalf("the legitimate peer before the flood: %d", code)
	}
	forged := func(i int) string {
		return jwt(`{"alg":"RS256","kid":"k"}`, fmt.Sprintf(`{"iss":%q,"sub":"system:serviceaccount:modelcache-system:modelcached","aud":["modelcache-peer"],"exp":99999999999,"jti":"%d"}`, a.Issuer, i))
	}
	before := reviews.n.Load()
	var wg sync.WaitGroup
	var codes sync.Map
	next := atomic.Int64{}
	start := time.Now()
	for range 32 { // 32 connections at once, as the attacker had 30
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= 1000; i = next.Add(1) {
				code := ask(attacker, forged(int(i)))
				n, _ := codes.LoadOrStore(code, new(atomic.Int64))
				n.(*atomic.Int64).Add(1)
			}
		}()
	}
	// During the flood: the legitimate peer with its cached token, and
	// with a fresh one (a review of its own).
	var cached, reviewed time.Duration
	for next.Load() < 100 {
		time.Sleep(time.Millisecond)
	}
	t0 := time.Now()
	if code := ask(legit, good); code != http.StatusOK {
		t.Errorf("the legitimate peer during the flood: %d", code)
	}
	cached = time.Since(t0)
	t0 = time.Now()
	if code := ask(legit, fresh); code != http.StatusOK {
		t.Errorf("the legitimate peer with a fresh token during the flood: %d", code)
	}
	reviewed = time.Since(t0)
	wg.Wait()
	flood := time.Since(start)
	spent := reviews.n.Load() - before - 1 // the fresh token's
	var got []string
	codes.Range(func(k, v any) bool {
		got = append(got, fmt.Sprintf("%v×%d", k, v.(*atomic.Int64).Load()))
		return true
	})
	t.Logf("1,000 forged tokens in %s (answers %v): %d TokenReviews; the legitimate peer answered in %s (cached token), %s (fresh token)",
		flood.Round(time.Millisecond), got, spent, cached.Round(time.Microsecond), reviewed.Round(time.Microsecond))
	if spent > 10 {
		t.Errorf("1,000 forged tokens cost %d TokenReviews, want at most 10", spent)
	}
	// 4,000 unique tokens more (forged and garbage) push out no cached
	// acceptance: the legitimate tokens cost no new review.
	for i := range 4000 {
		tok := forged(2000 + i)
		if i%2 == 1 {
			tok = fmt.Sprintf("garbage-%d", i)
		}
		a.Authenticate(peer.WithSource(context.Background(), netip.MustParseAddr("127.0.0.2")), tok)
	}
	n := reviews.n.Load()
	for _, tok := range []string{good, fresh} {
		if code := ask(legit, tok); code != http.StatusOK {
			t.Errorf("the legitimate peer after 4,000 more tokens: %d", code)
		}
	}
	if reviews.n.Load() != n {
		t.Errorf("4,000 unique tokens evicted a cached acceptance: %d new reviews", reviews.n.Load()-n)
	}
}

// The acceptance cache is sized by the fleet: AcceptedPerNode tokens a
// node, never under MaxEntries.
func TestAcceptanceCacheSizedByFleet(t *testing.T) {
	kc, reviews := daemonCluster(t)
	a, err := peer.NewTokenReviewAuthenticator(reviews, "", "modelcache-system", "modelcached")
	if err != nil {
		t.Fatal(err)
	}
	a.MaxEntries, a.ReviewBurst = 2, 100
	a.SetFleetSize(1) // 4 a node, but at least 2
	var toks []string
	for range 6 {
		toks = append(toks, peerToken(t, kc))
	}
	for _, tok := range toks {
		if _, err := a.Authenticate(context.Background(), tok); err != nil {
			t.Fatal(err)
		}
	}
	if c := a.CachedAccepted(); c != peer.AcceptedPerNode {
		t.Errorf("a fleet of one node: %d acceptances cached, want %d", c, peer.AcceptedPerNode)
	}
	a.SetFleetSize(0)
	for _, tok := range toks {
		a.Authenticate(context.Background(), tok)
	}
	if c := a.CachedAccepted(); c != 2 {
		t.Errorf("no fleet known: %d acceptances cached, want MaxEntries 2", c)
	}
}
