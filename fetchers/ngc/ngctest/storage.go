package ngctest

import (
	"bytes"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/modelcache/modelcache/fetchers/hf/hubtest"
)

// presign issues a storage URL for blob id, shaped as S3's presigned ones.
func (s *Server) presign(id int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	sig := fmt.Sprintf("sig%d", len(s.urls)+1)
	s.urls[sig] = &presigned{blob: id}
	return s.Storage.URL + "/blob/" + strconv.Itoa(id) + "?" + url.Values{"X-Amz-Expires": {"3600"}, "X-Amz-Signature": {sig}}.Encode()
}

func (s *Server) serveStorage(w http.ResponseWriter, r *http.Request) {
	if s.Hook != nil && s.Hook(w, r) {
		return
	}
	if r.Header.Get("Authorization") != "" {
		s.StorageSawAuth.Store(true)
	}
	id, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/blob/"))
	s.mu.Lock()
	u := s.urls[r.URL.Query().Get("X-Amz-Signature")]
	var b []byte
	if err == nil && u != nil && u.blob == id && id >= 0 && id < len(s.store) {
		b = s.store[id]
	}
	expired := u != nil && u.expired
	s.mu.Unlock()
	if r.Method == http.MethodGet {
		s.StorageGets.Add(1)
		if r.Header.Get("Range") != "" {
			s.RangeGets.Add(1)
		}
	}
	switch {
	case expired:
		s.ExpiredGets.Add(1)
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusForbidden)
		w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code><Message>Request has expired</Message></Error>`))
		return
	case b == nil:
		w.WriteHeader(http.StatusForbidden) // S3: a bad signature
		return
	}
	w.Header().Set("ETag", `"`+Sum(b)+`"`)
	http.ServeContent(&hubtest.CountingWriter{ResponseWriter: w, N: &s.Sent}, r, "", time.Time{}, bytes.NewReader(b))
}
