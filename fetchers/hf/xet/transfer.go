package xet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/modelcache/modelcache/fetchers"
)

// ErrURLRefused says a transfer URL was refused (403, 410: expired or
// not signed for the range): a new reconstruction gives new URLs.
var ErrURLRefused = errors.New("xet: transfer URL refused")

// fetchRanges GETs j's ranges in one request (download-protocol.md,
// "Step 2: Download Xorb Data": a Range header of the descriptors' bytes
// in ascending order; one range answers 206 with the bytes, several
// answer multipart/byteranges) and decodes each into its targets.
func fetchRanges(ctx context.Context, c *http.Client, j job, st *Stats) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.url, nil)
	if err != nil {
		return fmt.Errorf("%w: transfer URL: %v", ErrUnsupported, err)
	}
	parts := make([]string, len(j.ranges))
	for i, d := range j.ranges {
		parts[i] = fmt.Sprintf("%d-%d", d.Bytes.Start, d.Bytes.End)
	}
	req.Header.Set("Range", "bytes="+strings.Join(parts, ","))
	st.Requests.Add(1)
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("xet transfer: %w", err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusPartialContent:
	case resp.StatusCode == http.StatusForbidden || resp.StatusCode == http.StatusGone || resp.StatusCode == http.StatusUnauthorized:
		return fmt.Errorf("%w: GET %s: HTTP %d", ErrURLRefused, redactURL(j.url), resp.StatusCode)
	default:
		return fmt.Errorf("xet transfer: GET %s: HTTP %d (want 206)", redactURL(j.url), resp.StatusCode)
	}
	body := fetchers.CountingReader{R: resp.Body, N: &st.Fetched}
	mt, params, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if len(j.ranges) == 1 && mt != "multipart/byteranges" {
		start, _, err := contentRange(resp.Header.Get("Content-Range"))
		if err != nil || start != j.ranges[0].Bytes.Start {
			return fmt.Errorf("xet transfer: Content-Range %q for bytes %d-", resp.Header.Get("Content-Range"), j.ranges[0].Bytes.Start)
		}
		return decodeRange(body, j.xorb, j.ranges[0], j.targets[0])
	}
	if mt != "multipart/byteranges" || params["boundary"] == "" {
		return fmt.Errorf("xet transfer: %d ranges answered as %q", len(j.ranges), resp.Header.Get("Content-Type"))
	}
	mr := multipart.NewReader(body, params["boundary"])
	done := 0
	for {
		p, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("xet transfer: multipart: %w", err)
		}
		start, _, err := contentRange(p.Header.Get("Content-Range"))
		if err != nil {
			return fmt.Errorf("xet transfer: part: %w", err)
		}
		k := -1
		for i := range j.ranges {
			if j.ranges[i].Bytes.Start == start {
				k = i
			}
		}
		if k < 0 {
			return fmt.Errorf("xet transfer: a part at byte %d that was not asked for", start)
		}
		if err := decodeRange(p, j.xorb, j.ranges[k], j.targets[k]); err != nil {
			return err
		}
		done++
	}
	if done != len(j.ranges) {
		return fmt.Errorf("xet transfer: %d parts for %d ranges", done, len(j.ranges))
	}
	return nil
}

// chunkReaders keeps ChunkReaders (their buffers and LZ4 state) from one
// range to the next.
var chunkReaders = sync.Pool{New: func() any { return NewChunkReader(nil) }}

// decodeRange decodes chunks d.Chunks from r, which must hold exactly
// d.Bytes (a short range or one longer than its chunks is an error),
// each chunk straight into the first target that holds it, copied to
// any other (a chunk a window uses twice); a chunk no target holds is
// passed over.
func decodeRange(r io.Reader, xorb string, d RangeDescriptor, targets []*target) error {
	lr := &io.LimitedReader{R: r, N: int64(d.Bytes.End-d.Bytes.Start) + 1}
	cr := chunkReaders.Get().(*ChunkReader)
	defer chunkReaders.Put(cr)
	cr.r = lr
	for idx := d.Chunks.Start; idx < d.Chunks.End; idx++ {
		var into *target
		var c []byte
		var err error
		for _, t := range targets {
			if idx < t.first || idx >= t.end {
				continue
			}
			if into == nil {
				into = t
				var n int
				n, err = cr.NextInto(t.dst[t.fill:])
				c = t.dst[t.fill : t.fill+n]
			} else if len(c) > len(t.dst)-t.fill {
				err = fmt.Errorf("%w: a chunk of %d bytes where %d are left of its term", ErrCorrupt, len(c), len(t.dst)-t.fill)
			} else {
				copy(t.dst[t.fill:], c)
			}
			if err != nil {
				break
			}
			t.fill += len(c)
			t.lens = append(t.lens, uint32(len(c)))
		}
		if into == nil {
			err = cr.Skip()
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return fmt.Errorf("xorb %s chunk %d: %w", xorb, idx, err)
		}
	}
	if lr.N != 0 {
		return fmt.Errorf("%w: xorb %s bytes %d-%d: %d bytes after chunk %d", ErrCorrupt, xorb, d.Bytes.Start, d.Bytes.End, lr.N, d.Chunks.End-1)
	}
	var one [1]byte
	if n, _ := r.Read(one[:]); n != 0 {
		return fmt.Errorf("%w: xorb %s: more bytes than range %d-%d", ErrCorrupt, xorb, d.Bytes.Start, d.Bytes.End)
	}
	return nil
}

// contentRange reads "bytes a-b/total".
func contentRange(h string) (start, end uint64, err error) {
	rest, ok := strings.CutPrefix(h, "bytes ")
	if !ok {
		return 0, 0, fmt.Errorf("Content-Range %q", h)
	}
	rest, _, _ = strings.Cut(rest, "/")
	a, b, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, 0, fmt.Errorf("Content-Range %q", h)
	}
	if start, err = strconv.ParseUint(a, 10, 64); err == nil {
		end, err = strconv.ParseUint(b, 10, 64)
	}
	return start, end, err
}
