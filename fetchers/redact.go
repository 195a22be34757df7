package fetchers

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
)

// Redacted replaces a secret in what the daemon shows.
const Redacted = "REDACTED"

// secretParams are query (and fragment) parameters whose values are
// credentials, lower-case: bearer tokens and API keys, presigned URL
// signatures (AWS SigV2/SigV4, Google Cloud Storage, CloudFront, Alibaba
// OSS) and every field of an Azure SAS token. Besides these, any key with
// the prefix x-amz- or x-goog-, or one that contains token, secret,
// passw, signature, credential, apikey, api_key, api-key, accesskey,
// access_key or private_key, is secret.
var secretParams = map[string]bool{
	"token": true, "auth": true, "authorization": true, "jwt": true, "bearer": true,
	"key": true, "apikey": true, "api_key": true, "password": true, "pass": true, "pwd": true, "secret": true,
	"sig": true, "signature": true, "policy": true, "key-pair-id": true, "googleaccessid": true,
	"awsaccesskeyid": true, "ossaccesskeyid": true, "session": true, "credential": true,
	// CDN URL signing: Alibaba (auth_key), Tencent (sign), Akamai (hdnts,
	// hdnea), and one-time codes.
	"auth_key": true, "authkey": true, "sign": true, "hdnts": true, "hdnea": true, "code": true, "sessionid": true, "session_id": true,
	// Azure SAS: the signature and the fields it signs.
	"sv": true, "ss": true, "srt": true, "sp": true, "se": true, "st": true, "sr": true, "spr": true, "sip": true,
	"si": true, "sdd": true, "skoid": true, "sktid": true, "skt": true, "ske": true, "sks": true, "skv": true,
	"saoid": true, "suoid": true, "scid": true, "ses": true,
}

var secretPrefixes = []string{"x-amz-", "x-goog-", "x-oss-"}

var secretInfixes = []string{"token", "secret", "passw", "signature", "credential", "apikey", "api_key", "api-key", "accesskey", "access_key", "private_key", "privatekey"}

// IsSecretParam reports whether a URL query parameter named key carries
// a credential (case-insensitive, after percent-decoding).
func IsSecretParam(key string) bool {
	if k, err := url.QueryUnescape(key); err == nil {
		key = k
	}
	k := strings.ToLower(strings.TrimSpace(key))
	if secretParams[k] {
		return true
	}
	for _, p := range secretPrefixes {
		if strings.HasPrefix(k, p) {
			return true
		}
	}
	for _, s := range secretInfixes {
		if strings.Contains(k, s) {
			return true
		}
	}
	return false
}

// RedactURI returns uri with its credentials replaced by REDACTED: the
// userinfo (user and password: a token is often the user name) and the
// value of every secret query or fragment parameter (IsSecretParam).
// Everything else is kept byte for byte, so the result still names the
// source. hf://repo@revision has no userinfo (the @ names a revision)
// unless the part before @ holds a colon. It is a pure function and
// idempotent; a string that is not a URI comes back with only its
// key=value secrets redacted.
func RedactURI(uri string) string { return redact(uri, true) }

// RedactText returns s with every URL in it redacted as RedactURI does,
// for arbitrary text such as error messages and log lines: a URL ends at
// white space, a quote or an angle bracket, and punctuation before those
// ("…?token=S: not found") is not part of it. Secret key=value parameters
// after ?, &, ; or # are redacted wherever they appear, inside a URL or
// not (a URL cut short by quoting still loses its secrets). Pure and
// idempotent.
func RedactText(s string) string { return redact(s, false) }

// isTerm reports whether c ends a URL (and a secret value) in text.
func isTerm(c byte) bool {
	switch c {
	case ' ', '\t', '\n', '\r', '\v', '\f', '"', '\'', '<', '>', '`':
		return true
	}
	return false
}

// trailing reports whether s starts with punctuation that ends a
// sentence rather than a URL: a run of .,:;!?)]} followed by white space,
// a quote or the end ("resolve http://h/x?token=S: not found").
func trailing(s string) bool {
	i := 0
	for i < len(s) && strings.IndexByte(".,:;!?)]}", s[i]) >= 0 {
		i++
	}
	return i > 0 && (i == len(s) || isTerm(s[i]))
}

func isSchemeChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.'
}

func redact(s string, whole bool) string {
	if !strings.Contains(s, "=") && !strings.Contains(s, "@") {
		return s // nothing that could hold a secret: the fast path of every log line
	}
	term := func(c byte) bool { return !whole && isTerm(c) }
	var b strings.Builder
	b.Grow(len(s))
	i := 0
	for i < len(s) {
		// Userinfo: scheme "://" userinfo "@" host.
		if strings.HasPrefix(s[i:], "://") {
			j := i
			for j > 0 && isSchemeChar(s[j-1]) {
				j--
			}
			scheme := strings.ToLower(s[j:i])
			start := i + 3
			end := start
			for end < len(s) && !term(s[end]) && s[end] != '/' && s[end] != '?' && s[end] != '#' {
				end++
			}
			b.WriteString("://")
			if at := strings.LastIndexByte(s[start:end], '@'); at >= 0 {
				user := s[start : start+at]
				if scheme != "hf" || strings.Contains(user, ":") {
					user = Redacted
				}
				b.WriteString(user)
				b.WriteString(s[start+at : end])
			} else {
				b.WriteString(s[start:end])
			}
			i = end
			continue
		}
		// A parameter: [?&;#] key "=" value.
		c := s[i]
		b.WriteByte(c)
		i++
		if c != '?' && c != '&' && c != ';' && c != '#' {
			continue
		}
		k := i
		for k < len(s) && s[k] != '=' && s[k] != '&' && s[k] != '?' && s[k] != ';' && s[k] != '#' && !term(s[k]) && !strings.HasPrefix(s[k:], "://") {
			k++
		}
		if k >= len(s) || s[k] != '=' || !IsSecretParam(s[i:k]) {
			continue // the key is written by the loop, byte by byte
		}
		v := k + 1
		for v < len(s) && s[v] != '&' && s[v] != '#' && !term(s[v]) && (whole || !trailing(s[v:])) {
			v++
		}
		b.WriteString(s[i : k+1])
		if v > k+1 {
			b.WriteString(Redacted)
		}
		i = v
	}
	return b.String()
}

// RedactHandler wraps h so that no credential in a URL reaches the log:
// the message and every string, error and other value (formatted with
// %+v, kept as it was when it held nothing to redact) pass through
// RedactText, in groups and in attributes added with WithAttrs too.
// Wrapping twice is a no-op.
func RedactHandler(h slog.Handler) slog.Handler {
	if _, ok := h.(redactHandler); ok {
		return h
	}
	return redactHandler{h}
}

type redactHandler struct{ h slog.Handler }

func (r redactHandler) Enabled(ctx context.Context, l slog.Level) bool { return r.h.Enabled(ctx, l) }

func (r redactHandler) Handle(ctx context.Context, rec slog.Record) error {
	out := slog.NewRecord(rec.Time, rec.Level, RedactText(rec.Message), rec.PC)
	rec.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(redactAttr(a))
		return true
	})
	return r.h.Handle(ctx, out)
}

func (r redactHandler) WithAttrs(as []slog.Attr) slog.Handler {
	out := make([]slog.Attr, len(as))
	for i, a := range as {
		out[i] = redactAttr(a)
	}
	return redactHandler{r.h.WithAttrs(out)}
}

func (r redactHandler) WithGroup(name string) slog.Handler { return redactHandler{r.h.WithGroup(name)} }

func redactAttr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, RedactText(v.String()))
	case slog.KindGroup:
		g := v.Group()
		out := make([]slog.Attr, len(g))
		for i, x := range g {
			out[i] = redactAttr(x)
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(out...)}
	case slog.KindAny:
		var s string
		switch x := v.Any().(type) {
		case nil:
			return slog.Attr{Key: a.Key, Value: v}
		case error:
			s = x.Error()
		default:
			s = fmt.Sprintf("%+v", x)
		}
		if r := RedactText(s); r != s {
			return slog.String(a.Key, r)
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
