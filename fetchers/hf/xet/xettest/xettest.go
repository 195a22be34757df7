// Package xettest is a Xet CAS for tests, after hub-docs docs/xet/: it
// chunks files with the spec's content-defined chunking (chunking.md),
// deduplicates chunks across files, packs new chunks into xorbs with
// several encodings (xorb.md), and serves read tokens that expire
// (auth.md), reconstructions v2 and v1 (api.md, download-protocol.md)
// and xorb ranges from signed URLs that expire. Knobs inject failures: a
// short range, a wrong chunk, URLs that expire mid-file, a CAS without v2.
//
// Routes (each handler cites the section it follows):
//
//	GET /v2/reconstructions/{file_id}   Range: bytes=a-b (optional)
//	GET /v1/reconstructions/{file_id}   the deprecated shape (terms + fetch_info)
//	GET /xorb/default/{xorb}?X-Xet-Signed-Range=…&Expires=…&Signature=…   Range: bytes=…
//
// Where to find what:
//
//	xettest.go   CAS: Add (chunking, dedup, xorbs), tokens, signing, knobs
//	serve.go     the routes: reconstruction v2/v1, signed xorb ranges, injections
//	util.go      Range parsing, counters
//	memstore.go  MemStore: an in-memory xet.ChunkStore
//	model.go     TokenHandler (the hub's token route), Model and Mutate (weights-like data)
package xettest

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcache/modelcache/fetchers/hf/xet"
)

// maxXorb is the most uncompressed bytes packed into one xorb (xorb.md:
// "collect chunks until their total uncompressed length is near 64 MiB").
const maxXorb = 64 << 20

type chunk struct {
	off, stored int // byte offset of the header in the xorb, header+body length
	raw         int // uncompressed length
	hash        xet.Hash
}

type xorb struct {
	data   []byte
	chunks []chunk
}

type ref struct {
	xorb string
	idx  uint32
}

type file struct {
	size  int64
	terms []xet.Term
}

// CAS is a test CAS. Create it with New; Close it with Close.
type CAS struct {
	Server *httptest.Server

	// Schemes are cycled over new chunks (default None, LZ4,
	// ByteGrouping4LZ4); a chunk that does not shrink is stored None.
	Schemes []xet.Scheme
	// TokenTTL is a read token's life (default 1 h); URLTTL a signed URL's
	// (default 10 min).
	TokenTTL, URLTTL time.Duration
	// NoV2 makes /v2/reconstructions answer 404 (an older CAS).
	NoV2 bool
	// Now is the CAS's clock (default time.Now).
	Now func() time.Time

	// Failure injection, each counted down by the xorb requests it spoils:
	ShortRanges atomic.Int64 // the next N answers stop half-way
	WrongChunks atomic.Int64 // the next N answers have the last byte flipped
	// ExpireAt: when the xorb request count reaches it, every URL signed
	// so far expires (an expired URL mid-file); 0: never.
	ExpireAt atomic.Int64

	Sent            atomic.Int64 // xorb bytes served
	XorbGets        atomic.Int64 // xorb requests
	Reconstructions atomic.Int64 // reconstruction requests (v1 and v2)
	Refused         atomic.Int64 // requests refused for an expired or missing token or URL
	TokensIssued    atomic.Int64 // tokens TokenHandler gave out

	key    []byte
	mu     sync.Mutex
	xorbs  map[string]*xorb
	index  map[xet.Hash]ref
	files  map[string]*file
	tokens map[string]time.Time
	gen    int64 // URLs signed in an earlier generation are expired (ExpireURLs)
	next   int   // scheme cycle
}

// New starts a CAS on loopback.
func New() *CAS {
	c := &CAS{xorbs: map[string]*xorb{}, index: map[xet.Hash]ref{}, files: map[string]*file{}, tokens: map[string]time.Time{}}
	c.key = make([]byte, 32)
	rand.Read(c.key)
	c.Server = httptest.NewServer(http.HandlerFunc(c.serve))
	return c
}

// Close stops the server.
func (c *CAS) Close() { c.Server.Close() }

// URL is the casUrl tokens name.
func (c *CAS) URL() string { return c.Server.URL }

func (c *CAS) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// Token issues a read token (auth.md, "Response Format").
func (c *CAS) Token() xet.Token {
	ttl := c.TokenTTL
	if ttl == 0 {
		ttl = time.Hour
	}
	b := make([]byte, 16)
	rand.Read(b)
	tok := "xet_" + hex.EncodeToString(b)
	exp := c.now().Add(ttl)
	c.mu.Lock()
	c.tokens[tok] = exp
	c.mu.Unlock()
	return xet.Token{AccessToken: tok, Exp: exp.Unix(), CasURL: c.URL()}
}

// ExpireTokens makes every token issued so far invalid (a CAS answering
// 401 until the client asks the hub for a new one).
func (c *CAS) ExpireTokens() {
	c.mu.Lock()
	clear(c.tokens)
	c.mu.Unlock()
}

// ExpireURLs makes every URL signed so far expired.
func (c *CAS) ExpireURLs() {
	c.mu.Lock()
	c.gen++
	c.mu.Unlock()
}

// Add stores a file: its chunks (chunking.md), those the CAS already
// holds referenced where they are, the others packed into new xorbs. It
// returns the file id (hashing.md, "File Hashes"), as X-Xet-Hash names it.
func (c *CAS) Add(data []byte) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var hashes []xet.HashLen
	var refs []ref
	var cur *xorb
	var curHashes []xet.HashLen
	var pending []int // chunk positions in refs that point into cur
	flush := func() {
		if cur == nil {
			return
		}
		name := xet.XorbHash(curHashes).String()
		c.xorbs[name] = cur
		for i, p := range pending {
			refs[p] = ref{name, uint32(i)}
			c.index[curHashes[i].Hash] = refs[p]
		}
		cur, curHashes, pending = nil, nil, nil
	}
	start, curRaw := 0, 0
	seen := map[xet.Hash]int{} // chunks new in this file: their position in refs
	for _, end := range xet.Boundaries(data) {
		b := data[start:end]
		start = end
		h := xet.ChunkHash(b)
		hashes = append(hashes, xet.HashLen{Hash: h, Len: uint64(len(b))})
		if r, ok := c.index[h]; ok {
			refs = append(refs, r)
			continue
		}
		if p, ok := seen[h]; ok { // a repeat within the file's new chunks
			refs = append(refs, ref{"", uint32(p)})
			continue
		}
		if cur != nil && curRaw+len(b) > maxXorb {
			flush()
		}
		if cur == nil {
			cur, curRaw = &xorb{}, 0
		}
		off := len(cur.data)
		cur.data = xet.EncodeChunk(cur.data, b, c.scheme())
		cur.chunks = append(cur.chunks, chunk{off: off, stored: len(cur.data) - off, raw: len(b), hash: h})
		curHashes = append(curHashes, xet.HashLen{Hash: h, Len: uint64(len(b))})
		curRaw += len(b)
		seen[h] = len(refs)
		pending = append(pending, len(refs))
		refs = append(refs, ref{})
	}
	flush()
	for i, r := range refs {
		if r.xorb == "" { // resolve repeats now that their xorb is named
			refs[i] = refs[r.idx]
		}
	}
	id := xet.FileHash(hashes).String()
	f := &file{size: int64(len(data))}
	for i, r := range refs {
		n := len(f.terms)
		if n > 0 && f.terms[n-1].Hash == r.xorb && f.terms[n-1].Range.End == r.idx {
			f.terms[n-1].Range.End++
			f.terms[n-1].UnpackedLength += uint32(hashes[i].Len)
			continue
		}
		f.terms = append(f.terms, xet.Term{Hash: r.xorb, UnpackedLength: uint32(hashes[i].Len), Range: xet.ChunkRange{Start: r.idx, End: r.idx + 1}})
	}
	c.files[id] = f
	return id
}

func (c *CAS) scheme() xet.Scheme {
	s := c.Schemes
	if len(s) == 0 {
		s = []xet.Scheme{xet.None, xet.LZ4, xet.ByteGrouping4LZ4}
	}
	c.next++
	return s[(c.next-1)%len(s)]
}

// XorbCount is how many xorbs the CAS holds.
func (c *CAS) XorbCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.xorbs)
}

// sign makes the signature of a xorb URL: the path, the signed ranges
// and the expiry (in the manner of a CDN's signed URL; the spec names
// X-Xet-Signed-Range, Expires and Signature, download-protocol.md).
func (c *CAS) sign(path, ranges, exp, gen string) string {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte(path + "\n" + ranges + "\n" + exp + "\n" + gen))
	return hex.EncodeToString(m.Sum(nil))
}
