package xet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Token is a CAS read token (hub-docs docs/xet/auth.md, "Response
// Format").
type Token struct {
	AccessToken string `json:"accessToken"`
	Exp         int64  `json:"exp"` // unix seconds
	CasURL      string `json:"casUrl"`
}

// refreshBefore is how long before exp a token is replaced (auth.md: "add
// 30 seconds of buffer time before the provided expiration").
const refreshBefore = 30 * time.Second

// TokenSource fetches read tokens from the hub and keeps the last one
// until refreshBefore its expiry. Safe for concurrent use.
type TokenSource struct {
	// URL is the token endpoint: {hub}/api/models/{repo}/xet-read-token/{rev}
	// (auth.md, "Token Request API Endpoints") or the hub's Link rel=xet-auth.
	URL    string
	Header http.Header // the hub's credentials (Authorization)
	Client *http.Client
	Now    func() time.Time // default time.Now

	mu  sync.Mutex
	tok *Token
}

func (s *TokenSource) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// Get returns a token valid for at least refreshBefore, fetching a new
// one when needed. A hub that refuses (401, 403, 404) or answers
// something else than a token gives an error wrapping ErrUnsupported.
func (s *TokenSource) Get(ctx context.Context) (Token, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tok != nil && s.now().Add(refreshBefore).Before(time.Unix(s.tok.Exp, 0)) {
		return *s.tok, nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL, nil)
	if err != nil {
		return Token{}, fmt.Errorf("%w: token URL %q: %v", ErrUnsupported, s.URL, err)
	}
	for k, v := range s.Header {
		req.Header[k] = v
	}
	resp, err := s.Client.Do(req)
	if err != nil {
		return Token{}, fmt.Errorf("xet token: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		err := fmt.Errorf("xet token: GET %s: HTTP %d", redactURL(s.URL), resp.StatusCode)
		if resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests {
			return Token{}, err
		}
		return Token{}, fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	var t Token
	// auth.md: accessToken and casUrl are at most 64000 characters each.
	if err := json.NewDecoder(io.LimitReader(resp.Body, 256<<10)).Decode(&t); err != nil {
		return Token{}, fmt.Errorf("%w: xet token: %v", ErrUnsupported, err)
	}
	if t.AccessToken == "" || !(strings.HasPrefix(t.CasURL, "https://") || strings.HasPrefix(t.CasURL, "http://")) {
		return Token{}, fmt.Errorf("%w: xet token: no accessToken or casUrl", ErrUnsupported)
	}
	s.tok = &t
	return t, nil
}

// Invalidate drops the kept token (after the CAS answered 401).
func (s *TokenSource) Invalidate() {
	s.mu.Lock()
	s.tok = nil
	s.mu.Unlock()
}

// Term is a reconstruction term (docs/xet/download-protocol.md,
// "terms"): chunks [Range.Start, Range.End) of xorb Hash, UnpackedLength
// bytes once decoded.
type Term struct {
	Hash           string     `json:"hash"`
	UnpackedLength uint32     `json:"unpacked_length"`
	Range          ChunkRange `json:"range"`
}

// ChunkRange is end-exclusive.
type ChunkRange struct {
	Start uint32 `json:"start"`
	End   uint32 `json:"end"`
}

// ByteRange is end-inclusive (an HTTP Range).
type ByteRange struct {
	Start uint64 `json:"start"`
	End   uint64 `json:"end"`
}

// RangeDescriptor is one range of a fetch (download-protocol.md,
// "XorbRangeDescriptor").
type RangeDescriptor struct {
	Chunks ChunkRange `json:"chunks"`
	Bytes  ByteRange  `json:"bytes"`
}

// Fetch is a signed URL and the ranges it authorizes
// (download-protocol.md, "XorbMultiRangeFetch").
type Fetch struct {
	URL    string            `json:"url"`
	Ranges []RangeDescriptor `json:"ranges"`
}

// Reconstruction is a QueryReconstructionResponse in the v2 shape
// (download-protocol.md); a v1 answer is converted to it as xet-core
// does (one range per fetch).
type Reconstruction struct {
	OffsetIntoFirstRange uint64             `json:"offset_into_first_range"`
	Terms                []Term             `json:"terms"`
	Xorbs                map[string][]Fetch `json:"xorbs"`
}

// reconstructionV1 is api.md section 10's shape: fetch_info entries of
// (range, url, url_range).
type reconstructionV1 struct {
	OffsetIntoFirstRange uint64 `json:"offset_into_first_range"`
	Terms                []Term `json:"terms"`
	FetchInfo            map[string][]struct {
		Range    ChunkRange `json:"range"`
		URL      string     `json:"url"`
		URLRange ByteRange  `json:"url_range"`
	} `json:"fetch_info"`
}

// maxReconstruction bounds a reconstruction answer.
const maxReconstruction = 64 << 20

// ErrExpired says the CAS refused a token (401): refresh and retry.
var ErrExpired = errors.New("xet: token refused")

// GetReconstruction asks the CAS for the terms of file [start, end]
// (inclusive, api.md "Get File Reconstruction": GET
// /v2/reconstructions/{file_id} with Range; a CAS without v2 (404, 501)
// is asked /v1/reconstructions/{file_id}).
func GetReconstruction(ctx context.Context, c *http.Client, tok Token, fileID string, start, end uint64) (*Reconstruction, error) {
	base := strings.TrimRight(tok.CasURL, "/")
	var rec Reconstruction
	status, err := getJSON(ctx, c, base+"/v2/reconstructions/"+fileID, tok, start, end, &rec)
	if err != nil {
		return nil, err
	}
	if status == http.StatusNotFound || status == http.StatusNotImplemented {
		var v1 reconstructionV1
		if status, err = getJSON(ctx, c, base+"/v1/reconstructions/"+fileID, tok, start, end, &v1); err != nil {
			return nil, err
		}
		rec = Reconstruction{OffsetIntoFirstRange: v1.OffsetIntoFirstRange, Terms: v1.Terms, Xorbs: map[string][]Fetch{}}
		for x, fis := range v1.FetchInfo {
			for _, fi := range fis {
				rec.Xorbs[x] = append(rec.Xorbs[x], Fetch{URL: fi.URL, Ranges: []RangeDescriptor{{Chunks: fi.Range, Bytes: fi.URLRange}}})
			}
		}
	}
	switch {
	case status == http.StatusOK:
	case status == http.StatusUnauthorized:
		return nil, ErrExpired
	case status >= 500 || status == http.StatusTooManyRequests:
		return nil, fmt.Errorf("xet reconstruction %s: HTTP %d", fileID, status)
	default:
		return nil, fmt.Errorf("%w: xet reconstruction %s: HTTP %d", ErrUnsupported, fileID, status)
	}
	return &rec, rec.check()
}

func getJSON(ctx context.Context, c *http.Client, u string, tok Token, start, end uint64, v any) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrUnsupported, err)
	}
	req.Header.Set("Authorization", "Bearer "+tok.AccessToken)
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", start, end))
	resp, err := c.Do(req)
	if err != nil {
		return 0, fmt.Errorf("xet reconstruction: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxReconstruction+1))
	if err != nil {
		return 0, fmt.Errorf("xet reconstruction: %w", err)
	}
	if len(body) > maxReconstruction {
		return 0, fmt.Errorf("%w: reconstruction larger than %d bytes", ErrUnsupported, maxReconstruction)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return 0, fmt.Errorf("%w: reconstruction: %v", ErrUnsupported, err)
	}
	return http.StatusOK, nil
}

// check refuses what cannot be assembled: a term without a fetch that
// covers it is allowed (the node may hold it), an empty range is not.
func (r *Reconstruction) check() error {
	for _, t := range r.Terms {
		if _, err := ParseHash(t.Hash); err != nil {
			return fmt.Errorf("%w: term: %v", ErrUnsupported, err)
		}
		if t.Range.End <= t.Range.Start {
			return fmt.Errorf("%w: term %s: empty chunk range [%d, %d)", ErrUnsupported, t.Hash, t.Range.Start, t.Range.End)
		}
	}
	for x, fs := range r.Xorbs {
		for _, f := range fs {
			for _, d := range f.Ranges {
				if d.Chunks.End <= d.Chunks.Start || d.Bytes.End < d.Bytes.Start {
					return fmt.Errorf("%w: xorb %s: bad range %+v", ErrUnsupported, x, d)
				}
			}
		}
	}
	return nil
}

// redactURL drops a URL's query (signatures) for messages.
func redactURL(u string) string {
	if i := strings.IndexByte(u, '?'); i >= 0 {
		return u[:i] + "?…"
	}
	return u
}
