package api

import (
	"bufio"
	"io"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	jsonv1 "github.com/go-json-experiment/json/v1"
)

// v1Options make jsonv2 write what encoding/json writes: the same field
// rules (omitempty of zero numbers and false), HTML-safe escapes, sorted
// map keys, nil slices as null. What changes is the engine: it writes
// into a bounded buffer as it goes, where encoding/json builds the whole
// value in memory (twice, to indent): for a large list, megabytes of
// fresh pages, each a page fault (docs/benchmarks.md has the figures).
var v1Options = jsonv1.DefaultOptionsV1()

// WriteJSON writes v and a newline, byte for byte as an encoding/json
// Encoder with SetIndent("", indent) does ("" for compact), streamed
// through a 64 KiB buffer. One difference: invalid UTF-8 in a string
// becomes the character U+FFFD where encoding/json writes its escape
// \ufffd, the same JSON value.
func WriteJSON(w io.Writer, v any, indent string) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	opts := []jsonv2.Options{v1Options}
	if indent != "" {
		opts = append(opts, jsontext.WithIndent(indent))
	}
	if err := jsonv2.MarshalWrite(bw, v, opts...); err != nil {
		return err
	}
	bw.WriteByte('\n')
	return bw.Flush()
}

// WriteJSONArray writes items as WriteJSON(w, items, "") does (the same
// bytes), one element at a time, so that a reader decodes the first
// elements while the last are encoded.
func WriteJSONArray[T any](w io.Writer, items []T) error {
	if items == nil {
		return WriteJSON(w, items, "")
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	enc := jsontext.NewEncoder(bw, v1Options)
	if err := enc.WriteToken(jsontext.BeginArray); err != nil {
		return err
	}
	for i := range items {
		if err := jsonv2.MarshalEncode(enc, &items[i], v1Options); err != nil {
			return err
		}
	}
	if err := enc.WriteToken(jsontext.EndArray); err != nil {
		return err
	}
	return bw.Flush()
}
