package xettest

import (
	"crypto/hmac"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/modelcache/modelcache/fetchers/hf/xet"
)

func (c *CAS) serve(w http.ResponseWriter, r *http.Request) {
	p := r.URL.Path
	switch {
	case strings.HasPrefix(p, "/xorb/default/"):
		c.serveXorb(w, r, strings.TrimPrefix(p, "/xorb/default/"))
	case strings.HasPrefix(p, "/v2/reconstructions/"):
		if c.NoV2 {
			http.NotFound(w, r)
			return
		}
		c.serveReconstruction(w, r, strings.TrimPrefix(p, "/v2/reconstructions/"), 2)
	case strings.HasPrefix(p, "/v1/reconstructions/"):
		c.serveReconstruction(w, r, strings.TrimPrefix(p, "/v1/reconstructions/"), 1)
	default:
		http.NotFound(w, r)
	}
}

// authorized checks the bearer token (auth.md: a CAS "returns code 401
// Unauthorized if token expired").
func (c *CAS) authorized(w http.ResponseWriter, r *http.Request) bool {
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	c.mu.Lock()
	exp, ok := c.tokens[tok]
	c.mu.Unlock()
	if !ok || !c.now().Before(exp) {
		c.Refused.Add(1)
		http.Error(w, `{"error":"token expired or missing"}`, http.StatusUnauthorized)
		return false
	}
	return true
}

// serveReconstruction answers api.md section 1 (v2: "xorbs", ranges of a
// xorb merged under one URL) or section 10 (v1: "fetch_info", one URL
// per range), for the file's bytes [a, b] of the Range header, else all.
func (c *CAS) serveReconstruction(w http.ResponseWriter, r *http.Request, id string, version int) {
	if !c.authorized(w, r) {
		return
	}
	c.Reconstructions.Add(1)
	c.mu.Lock()
	f, ok := c.files[id]
	c.mu.Unlock()
	if !ok {
		http.Error(w, `{"error":"file not found"}`, http.StatusNotFound) // api.md: 404, not retryable
		return
	}
	start, end := int64(0), f.size-1
	if h := r.Header.Get("Range"); h != "" {
		a, b, ok := parseRange(h)
		if !ok {
			http.Error(w, "bad Range", http.StatusBadRequest)
			return
		}
		if a >= f.size {
			http.Error(w, "", http.StatusRequestedRangeNotSatisfiable) // api.md: 416
			return
		}
		start, end = a, min(b, f.size-1)
	}
	terms, offset := c.slice(f, start, end)
	// The chunk ranges each xorb must serve, merged where they overlap
	// or touch (download-protocol.md: chunk 3 of two terms is fetched once).
	per := map[string][]xet.ChunkRange{}
	for _, t := range terms {
		per[t.Hash] = append(per[t.Hash], t.Range)
	}
	exp := c.now().Add(c.urlTTL()).Unix()
	w.Header().Set("Content-Type", "application/json")
	if version == 1 {
		type fetchInfo struct {
			Range    xet.ChunkRange `json:"range"`
			URL      string         `json:"url"`
			URLRange xet.ByteRange  `json:"url_range"`
		}
		fi := map[string][]fetchInfo{}
		for x, rs := range per {
			for _, d := range c.descriptors(x, rs) {
				fi[x] = append(fi[x], fetchInfo{d.Chunks, c.url(x, []xet.RangeDescriptor{d}, exp), d.Bytes})
			}
		}
		json.NewEncoder(w).Encode(map[string]any{"offset_into_first_range": offset, "terms": terms, "fetch_info": fi})
		return
	}
	xorbs := map[string][]xet.Fetch{}
	for x, rs := range per {
		ds := c.descriptors(x, rs)
		xorbs[x] = []xet.Fetch{{URL: c.url(x, ds, exp), Ranges: ds}}
	}
	json.NewEncoder(w).Encode(xet.Reconstruction{OffsetIntoFirstRange: uint64(offset), Terms: terms, Xorbs: xorbs})
}

func (c *CAS) urlTTL() timeDuration {
	if c.URLTTL == 0 {
		return defaultURLTTL
	}
	return c.URLTTL
}

// slice cuts the file's terms to those holding bytes [start, end], the
// first and last trimmed to the chunks that hold start and end; offset
// is start's place in the first term (download-protocol.md,
// "offset_into_first_range").
func (c *CAS) slice(f *file, start, end int64) ([]xet.Term, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []xet.Term
	var offset int64
	pos := int64(0)
	for _, t := range f.terms {
		tEnd := pos + int64(t.UnpackedLength)
		if tEnd <= start || pos > end {
			pos = tEnd
			continue
		}
		x := c.xorbs[t.Hash]
		nt := xet.Term{Hash: t.Hash}
		cpos := pos
		for i := t.Range.Start; i < t.Range.End; i++ {
			n := int64(x.chunks[i].raw)
			if cpos+n > start && cpos <= end {
				if nt.UnpackedLength == 0 {
					nt.Range.Start = i
					if len(out) == 0 {
						offset = start - cpos
					}
				}
				nt.Range.End = i + 1
				nt.UnpackedLength += uint32(n)
			}
			cpos += n
		}
		out = append(out, nt)
		pos = tEnd
	}
	return out, offset
}

// descriptors merges chunk ranges of xorb x and gives their bytes
// (download-protocol.md, "XorbRangeDescriptor": bytes end-inclusive).
func (c *CAS) descriptors(x string, rs []xet.ChunkRange) []xet.RangeDescriptor {
	sort.Slice(rs, func(i, j int) bool { return rs[i].Start < rs[j].Start })
	var merged []xet.ChunkRange
	for _, r := range rs {
		if n := len(merged); n > 0 && r.Start <= merged[n-1].End {
			merged[n-1].End = max(merged[n-1].End, r.End)
			continue
		}
		merged = append(merged, r)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	xo := c.xorbs[x]
	out := make([]xet.RangeDescriptor, len(merged))
	for i, m := range merged {
		last := xo.chunks[m.End-1]
		out[i] = xet.RangeDescriptor{Chunks: m, Bytes: xet.ByteRange{Start: uint64(xo.chunks[m.Start].off), End: uint64(last.off + last.stored - 1)}}
	}
	return out
}

// url signs the ranges ds of xorb x until exp.
func (c *CAS) url(x string, ds []xet.RangeDescriptor, exp int64) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = fmt.Sprintf("%d-%d", d.Bytes.Start, d.Bytes.End)
	}
	ranges := "bytes=" + strings.Join(parts, ",")
	path := "/xorb/default/" + x
	c.mu.Lock()
	gen := strconv.FormatInt(c.gen, 10)
	c.mu.Unlock()
	e := strconv.FormatInt(exp, 10)
	q := url.Values{"X-Xet-Signed-Range": {ranges}, "Expires": {e}, "Gen": {gen}, "Signature": {c.sign(path, ranges, e, gen)}}
	return c.URL() + path + "?" + q.Encode()
}

// serveXorb answers a signed URL: the signature, the expiry, and that the
// Range asked is within the signed ranges (download-protocol.md: "a
// Range header requesting bytes outside that set returns an
// authorization failure"); one range is a 206 of its bytes, several a
// multipart/byteranges.
func (c *CAS) serveXorb(w http.ResponseWriter, r *http.Request, x string) {
	n := c.XorbGets.Add(1)
	if at := c.ExpireAt.Load(); at > 0 && n == at {
		c.ExpireURLs()
	}
	q := r.URL.Query()
	signed, expS, sig := q.Get("X-Xet-Signed-Range"), q.Get("Expires"), q.Get("Signature")
	exp, _ := strconv.ParseInt(expS, 10, 64)
	gen, _ := strconv.ParseInt(q.Get("Gen"), 10, 64)
	c.mu.Lock()
	xo, ok := c.xorbs[x]
	cur := c.gen
	c.mu.Unlock()
	if !ok || !hmac.Equal([]byte(sig), []byte(c.sign(r.URL.Path, signed, expS, q.Get("Gen")))) || !c.now().Before(timeUnix(exp)) || gen < cur {
		c.Refused.Add(1)
		http.Error(w, "<Error><Code>AccessDenied</Code></Error>", http.StatusForbidden)
		return
	}
	asked, ok := parseRanges(r.Header.Get("Range"))
	allowed, _ := parseRanges(signed)
	if !ok || !within(asked, allowed) {
		c.Refused.Add(1)
		http.Error(w, "<Error><Code>AccessDenied</Code></Error>", http.StatusForbidden)
		return
	}
	for _, a := range asked {
		if a[1] >= int64(len(xo.data)) {
			http.Error(w, "", http.StatusRequestedRangeNotSatisfiable)
			return
		}
	}
	short, wrong := take(&c.ShortRanges), take(&c.WrongChunks)
	body := func(a [2]int64) []byte {
		b := xo.data[a[0] : a[1]+1]
		if !wrong && !short {
			return b
		}
		b = append([]byte(nil), b...)
		if wrong {
			b[len(b)-1] ^= 0xff
		}
		if short {
			b = b[:len(b)/2]
		}
		return b
	}
	cw := &countingWriter{w, c}
	if len(asked) == 1 {
		a := asked[0]
		w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", a[0], a[1], len(xo.data)))
		w.Header().Set("Content-Type", "application/octet-stream")
		w.WriteHeader(http.StatusPartialContent)
		cw.Write(body(a))
		return
	}
	mw := multipart.NewWriter(cw)
	w.Header().Set("Content-Type", "multipart/byteranges; boundary="+mw.Boundary())
	w.WriteHeader(http.StatusPartialContent)
	for _, a := range asked {
		pw, _ := mw.CreatePart(textproto.MIMEHeader{"Content-Type": {"application/octet-stream"},
			"Content-Range": {fmt.Sprintf("bytes %d-%d/%d", a[0], a[1], len(xo.data))}})
		pw.Write(body(a))
	}
	mw.Close()
}
